package admin

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// decodeJSON decodes the request body into v. Unknown fields, trailing data and a body that is not
// JSON are INVALID_ARGUMENT; an empty body leaves v unchanged when allowEmpty, else it is
// INVALID_ARGUMENT too; a body over the limit is FRAME_TOO_LARGE.
func decodeJSON(r *http.Request, v any, allowEmpty bool) error {
	data, err := jsonBody(r)
	if err != nil {
		return err
	}
	return unmarshalJSON(data, v, allowEmpty)
}

// jsonBody reads a request body that decodeJSON would decode: one whose Content-Type, if any, is
// JSON.
func jsonBody(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !isJSON(ct) {
		return nil, invalidf("request body must be JSON (Content-Type application/json), got %q", ct)
	}
	return readBody(r)
}

// unmarshalJSON is decodeJSON of a body already read.
func unmarshalJSON(data []byte, v any, allowEmpty bool) error {
	if len(bytes.TrimSpace(data)) == 0 {
		if allowEmpty {
			return nil
		}
		return invalidf("request body is empty; a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, storage.ErrInvalidArgument) {
			return err // a field's own check (publishList) says what is wrong
		}
		return invalidf("request body: %v", err)
	}
	if dec.More() {
		return invalidf("request body: data after the JSON value")
	}
	return nil
}

// readBody reads the request body. A body over the limit keeps its *http.MaxBytesError
// (FRAME_TOO_LARGE), one too slow its SESSION_TIMEOUT (408); another read failure is
// INVALID_ARGUMENT.
func readBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		var pe *protocol.Error // SESSION_TIMEOUT from deadlineBody
		if errors.As(err, &mbe) || errors.As(err, &pe) {
			return nil, err
		}
		return nil, invalidf("reading request body: %v", err)
	}
	return data, nil
}

// isJSON reports whether a Content-Type is JSON (application/json, application/*+json).
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// Duration is a time.Duration in JSON: written as a Go duration string ("30s", "1h0m0s"), read
// from such a string or from a number of milliseconds.
type Duration = api.Duration

// TopicConfig is storage.TopicConfig in the API: durations as strings. Zero fields mean the default
// when creating a topic. Settings that are not built are refused (INVALID_ARGUMENT, "not implemented
// yet"). completion_tracking cannot change while the topic holds messages (INVALID_ARGUMENT).
type TopicConfig = api.TopicConfig

// PoisonRules is storage.PoisonRules in the API (seed 002 ACK-9): dead-letter a message early
// when the same nack reason comes from more than one member (distinct_members), or after
// max_failures nacks within window (default 30s). Off by default.
type PoisonRules = api.PoisonRules

func configJSON(c storage.TopicConfig) TopicConfig {
	return TopicConfig{
		Semantics:                      api.Semantics(c.Semantics),
		Partitions:                     c.Partitions,
		AckWait:                        Duration(c.AckWait),
		MaxDeliveries:                  c.MaxDeliveries,
		MessageRetention:               Duration(c.MessageRetention),
		ZeroSubscriptionRetention:      Duration(c.ZeroSubscriptionRetention),
		BlockWritesOnZeroSubscriptions: c.BlockWritesOnZeroSubscriptions,
		CompletionTracking:             api.CompletionTracking(c.CompletionTracking),
		MaxRetention:                   Duration(c.MaxRetention),
		ZombieTTL:                      Duration(c.ZombieTTL),
		MaxMessageBytes:                c.MaxMessageBytes,
		DedupWindow:                    Duration(c.DedupWindow),
		MaxBacklogMessages:             c.MaxBacklogMessages,
		MaxBacklogBytes:                c.MaxBacklogBytes,
		BacklogPolicy:                  api.BacklogPolicy(c.BacklogPolicy),
		MaxMessages:                    c.MaxMessages,
		MaxBytes:                       c.MaxBytes,
		SizePolicy:                     api.SizePolicy(c.SizePolicy),
		PoisonRules:                    poisonJSON(c.PoisonRules),
	}
}

func poisonJSON(r storage.PoisonRules) *PoisonRules {
	if !r.On() {
		return nil
	}
	return &PoisonRules{DistinctMembers: r.DistinctMembers, MaxFailures: r.MaxFailures, Window: Duration(r.Window)}
}

// poisonStorage converts the rules as they are: a window without max_failures reaches the
// engine's validation, which refuses it (updateTopicConfig drops a window the body did not give).
func poisonStorage(r *PoisonRules) storage.PoisonRules {
	if r == nil {
		return storage.PoisonRules{}
	}
	return storage.PoisonRules{DistinctMembers: r.DistinctMembers, MaxFailures: r.MaxFailures, Window: time.Duration(r.Window)}
}

// setsPoisonWindow reports whether a JSON body gives poison_rules.window (not null).
func setsPoisonWindow(data []byte) bool {
	var probe struct {
		PoisonRules *struct {
			Window *json.RawMessage `json:"window"`
		} `json:"poison_rules"`
	}
	return json.Unmarshal(data, &probe) == nil && probe.PoisonRules != nil && probe.PoisonRules.Window != nil
}

// configStorage converts an API configuration to the engine's.
func configStorage(c TopicConfig) storage.TopicConfig {
	return storage.TopicConfig{
		Semantics:                      storage.Semantics(c.Semantics),
		Partitions:                     c.Partitions,
		AckWait:                        time.Duration(c.AckWait),
		MaxDeliveries:                  c.MaxDeliveries,
		MessageRetention:               time.Duration(c.MessageRetention),
		ZeroSubscriptionRetention:      time.Duration(c.ZeroSubscriptionRetention),
		BlockWritesOnZeroSubscriptions: c.BlockWritesOnZeroSubscriptions,
		CompletionTracking:             storage.CompletionTracking(c.CompletionTracking),
		MaxRetention:                   time.Duration(c.MaxRetention),
		ZombieTTL:                      time.Duration(c.ZombieTTL),
		MaxMessageBytes:                c.MaxMessageBytes,
		DedupWindow:                    time.Duration(c.DedupWindow),
		MaxBacklogMessages:             c.MaxBacklogMessages,
		MaxBacklogBytes:                c.MaxBacklogBytes,
		BacklogPolicy:                  storage.BacklogPolicy(c.BacklogPolicy),
		MaxMessages:                    c.MaxMessages,
		MaxBytes:                       c.MaxBytes,
		SizePolicy:                     storage.SizePolicy(c.SizePolicy),
		PoisonRules:                    poisonStorage(c.PoisonRules),
	}
}

// Topic is a topic in the API.
type Topic = api.Topic

// Backpressure is broker.BackpressureInfo in the API: durations as strings.
type Backpressure = api.Backpressure

func backpressureJSON(i *broker.BackpressureInfo) *Backpressure {
	if i == nil {
		return nil
	}
	return &Backpressure{State: i.State, Policy: api.BacklogPolicy(i.Policy), BacklogMessages: i.BacklogMessages, BacklogBytes: i.BacklogBytes,
		MaxBacklogMessages: i.MaxBacklogMessages, MaxBacklogBytes: i.MaxBacklogBytes, Delay: Duration(i.Delay),
		RetryAfter: Duration(i.RetryAfter), Throttled: i.Throttled, Rejected: i.Rejected, UpdatedAt: i.UpdatedAt}
}

func topicJSON(info *broker.TopicInfo) Topic {
	return Topic{
		Name:          info.Topic.Name,
		Config:        configJSON(info.Topic.Config),
		CreatedAt:     info.Topic.CreatedAt,
		Stats:         topicStatsJSON(info.Stats),
		Subscriptions: info.Subscriptions,
		Members:       info.Members,
		Backpressure:  backpressureJSON(info.Backpressure),

		SizeBoundExceeded: info.Topic.Config.SizeBoundExceeded(info.Stats),
	}
}

// Member is a live member of this broker (broker.MemberInfo in the API).
type Member = api.Member

// Group is a subscription (a consumer group on a topic) with its health.
type Group = api.Group

// groupJSON converts a GroupInfo; members maps member IDs to their descriptions (from
// Broker.Members). A listing (list set) leaves out the members' subscription IDs: a member on n
// subscriptions is described in n entries, and listing its n IDs in each made a listing grow with
// the square of n (a wildcard consumer on 10,000 topics: 10^8 IDs). GET /api/v1/members has them.
func groupJSON(g *broker.GroupInfo, members map[string]Member, list bool) Group {
	out := Group{
		Topic:       g.Topic,
		Group:       g.Group,
		State:       api.SubscriptionState(g.State),
		MemberCount: len(g.Members),
		Members:     make([]Member, 0, len(g.Members)),
		Partitions:  []api.SubscriptionPartitionStats{},
		Health:      g.Health,
		Reasons:     g.Reasons,
	}
	if out.Reasons == nil {
		out.Reasons = []string{}
	}
	if !g.OldestUnackedAt.IsZero() {
		at, age := g.OldestUnackedAt, Duration(g.OldestUnackedAge)
		out.OldestUnackedAt, out.OldestUnackedAge = &at, &age
	}
	if s := g.Subscription; s != nil {
		out.SubscriptionID = s.ID
		out.Pattern = s.Pattern
		out.Ephemeral = s.Ephemeral
		out.Start = startJSON(s.Start)
		out.CreatedAt = s.CreatedAt
		out.UpdatedAt = s.UpdatedAt
		out.HeartbeatTimeout = Duration(s.HeartbeatTimeout)
		out.LastHeartbeatAt = s.LastHeartbeatAt
	}
	out.Backfill = backfillJSON(g.Backfill)
	out.Processed, out.Failed, out.Filtered = g.Counts.Processed, g.Counts.Failed, g.Counts.Filtered
	orderedJSON(&out, g)
	if st := g.Stats; st != nil {
		out.Pending = st.Pending
		out.Lag = st.Lag
		out.InFlight = st.InFlight
		out.Redelivering = st.Redelivering
		out.DeadLettered = st.DeadLettered
		for _, p := range st.Partitions {
			out.Partitions = append(out.Partitions, api.SubscriptionPartitionStats(p))
		}
	}
	for _, id := range g.Members {
		m, ok := members[id]
		if !ok {
			m = Member{ID: id} // left meanwhile
		}
		if list {
			m.Subscriptions = nil
		}
		out.Members = append(out.Members, m)
	}
	return out
}

func memberMap(b *broker.Broker) map[string]Member {
	ms := b.Members()
	out := make(map[string]Member, len(ms))
	for _, m := range ms {
		out[m.ID] = memberJSON(m)
	}
	return out
}

// memberJSON converts a member's description. Member, PartitionStats and
// SubscriptionPartitionStats are converted as Go conversions: a field added to the broker's or
// the engine's type stops the build here until the API's type gets it too (or a conversion).
func memberJSON(m broker.MemberInfo) Member { return Member(m) }

// startJSON converts a start position.
func startJSON(p storage.StartPosition) api.StartPosition {
	return api.StartPosition{Kind: api.StartKind(p.Kind), Time: p.Time, Partition: p.Partition, Offset: p.Offset}
}

// startStorage converts an API start position to the engine's.
func startStorage(p api.StartPosition) storage.StartPosition {
	return storage.StartPosition{Kind: storage.StartKind(p.Kind), Time: p.Time, Partition: p.Partition, Offset: p.Offset}
}

// backfillJSON converts a backfill's progress (nil for nil).
func backfillJSON(b *broker.BackfillInfo) *api.BackfillInfo {
	if b == nil {
		return nil
	}
	return &api.BackfillInfo{State: api.BackfillState(b.State), Processed: b.Processed, Total: b.Total,
		Remaining: b.Remaining, Skipped: b.Skipped, MaxMessages: b.MaxMessages, Rate: b.Rate, RateLimit: b.RateLimit,
		ETASeconds: b.ETASeconds, StartedAt: b.StartedAt, UpdatedAt: b.UpdatedAt, Error: b.Error}
}

// topicStatsJSON converts a topic's statistics (nil for nil).
func topicStatsJSON(st *storage.TopicStats) *api.TopicStats {
	if st == nil {
		return nil
	}
	out := &api.TopicStats{Topic: st.Topic, Messages: st.Messages, Bytes: st.Bytes}
	if st.Partitions != nil {
		out.Partitions = make([]api.PartitionStats, 0, len(st.Partitions))
	}
	for _, p := range st.Partitions {
		out.Partitions = append(out.Partitions, api.PartitionStats(p))
	}
	return out
}

// Message is a stored message in the API. Key and payload are given as text when they are valid
// UTF-8 (key, payload), else base64-encoded (key_base64, payload_base64). A DLQ listing with
// payload=false gives payload_bytes, the payload's size, instead of the payload.
type Message struct {
	// ID is the id shown to users: the offset for a topic with one partition, "partition:offset"
	// otherwise.
	ID            string            `json:"id"`
	Topic         string            `json:"topic"`
	Partition     int32             `json:"partition"`
	Offset        int64             `json:"offset"`
	Key           *string           `json:"key,omitempty"`
	KeyBase64     *string           `json:"key_base64,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Payload       *string           `json:"payload,omitempty"`
	PayloadBase64 *string           `json:"payload_base64,omitempty"`
	PayloadBytes  *int              `json:"payload_bytes,omitempty"`
	PublishedAt   time.Time         `json:"published_at"`
	ProducerID    string            `json:"producer_id,omitempty"`
	NotBefore     time.Time         `json:"not_before,omitzero"`
	ExpiresAt     time.Time         `json:"expires_at,omitzero"`
}

// textOrBase64 returns b as text when it is valid UTF-8 (nil: ""), else base64.
func textOrBase64(b []byte) (text, b64 *string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	s := base64.StdEncoding.EncodeToString(b)
	return nil, &s
}

func messageJSON(m *storage.Message, partitions int) Message {
	out := Message{
		ID:          storage.MessageID(partitions, m.Partition, m.Offset),
		Topic:       m.Topic,
		Partition:   m.Partition,
		Offset:      m.Offset,
		Headers:     m.Headers,
		PublishedAt: m.PublishedAt,
		ProducerID:  m.ProducerID,
		NotBefore:   m.NotBefore,
		ExpiresAt:   m.ExpiresAt,
	}
	if len(m.Key) > 0 {
		out.Key, out.KeyBase64 = textOrBase64(m.Key)
	}
	out.Payload, out.PayloadBase64 = textOrBase64(m.Payload)
	return out
}

// DLQEntry is a dead-lettered message in the API.
type DLQEntry struct {
	ID             int64             `json:"id"`
	SubscriptionID int64             `json:"subscription_id"`
	Message        Message           `json:"message"`
	Reason         storage.DLQReason `json:"reason"`
	Attempts       int               `json:"attempts"`
	LastError      string            `json:"last_error,omitempty"`
	DeadAt         time.Time         `json:"dead_at"`
	// Rule is the poison rule that dead-lettered the message (reason poison).
	Rule storage.PoisonRule `json:"rule,omitempty"`
	// Failures are its last nacks (member, reason, time), kept while the topic has poison rules.
	Failures []storage.DeliveryFailure `json:"failures,omitempty"`
}

func dlqJSON(e *storage.DLQEntry, partitions int) DLQEntry {
	return DLQEntry{
		ID:             e.ID,
		SubscriptionID: e.SubscriptionID,
		Message:        messageJSON(&e.Message, partitions),
		Reason:         e.Reason,
		Attempts:       e.Attempts,
		LastError:      e.LastError,
		DeadAt:         e.DeadAt,
		Rule:           e.Rule,
		Failures:       e.Failures,
	}
}

// queryInt reads an optional non-negative integer query parameter.
func queryInt(r *http.Request, name string, def, maxV int64) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > maxV {
		return 0, invalidf("query parameter %s must be an integer between 0 and %d, got %q", name, maxV, s)
	}
	return v, nil
}

// queryBool reads an optional boolean query parameter.
func queryBool(r *http.Request, name string) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, invalidf("query parameter %s must be true or false, got %q", name, s)
	}
	return v, nil
}

package admin

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// decodeJSON decodes the request body into v. Unknown fields, trailing data and a body that is not
// JSON are INVALID_ARGUMENT; an empty body leaves v unchanged when allowEmpty, else it is
// INVALID_ARGUMENT too; a body over the limit is FRAME_TOO_LARGE.
func decodeJSON(r *http.Request, v any, allowEmpty bool) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !isJSON(ct) {
		return invalidf("request body must be JSON (Content-Type application/json), got %q", ct)
	}
	data, err := readBody(r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		if allowEmpty {
			return nil
		}
		return invalidf("request body is empty; a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
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
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string or a number of milliseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: want a Go duration such as \"30s\" or a number of milliseconds", s)
		}
		*d = Duration(v)
		return nil
	}
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil {
		return fmt.Errorf("duration %s: want a Go duration such as \"30s\" or a number of milliseconds", b)
	}
	*d = Duration(time.Duration(ms * float64(time.Millisecond)))
	return nil
}

// TopicConfig is storage.TopicConfig in the API: durations as strings. Zero fields mean the default
// when creating a topic. Settings that are not built are refused (INVALID_ARGUMENT, "not implemented
// yet"). completion_tracking cannot change while the topic holds messages (INVALID_ARGUMENT).
type TopicConfig struct {
	Semantics                      storage.Semantics          `json:"semantics,omitempty"`
	Partitions                     int                        `json:"partitions,omitempty"`
	AckWait                        Duration                   `json:"ack_wait,omitempty"`
	MaxDeliveries                  int                        `json:"max_deliveries,omitempty"`
	MessageRetention               Duration                   `json:"message_retention,omitempty"`
	ZeroSubscriptionRetention      Duration                   `json:"zero_subscription_retention,omitempty"`
	BlockWritesOnZeroSubscriptions bool                       `json:"block_writes_on_zero_subscriptions"`
	CompletionTracking             storage.CompletionTracking `json:"completion_tracking,omitempty"`
	MaxRetention                   Duration                   `json:"max_retention,omitempty"`
	ZombieTTL                      Duration                   `json:"zombie_ttl,omitempty"`
	MaxMessageBytes                int                        `json:"max_message_bytes,omitempty"`
	DedupWindow                    Duration                   `json:"dedup_window,omitempty"`
	MaxBacklogMessages             int64                      `json:"max_backlog_messages,omitempty"`
	MaxBacklogBytes                int64                      `json:"max_backlog_bytes,omitempty"`
	BacklogPolicy                  storage.BacklogPolicy      `json:"backlog_policy,omitempty"`
	MaxMessages                    int64                      `json:"max_messages,omitempty"`
	MaxBytes                       int64                      `json:"max_bytes,omitempty"`
	SizePolicy                     storage.SizePolicy         `json:"size_policy,omitempty"`
	// PoisonRules is shown only when a rule is on; null in an update turns them off.
	PoisonRules *PoisonRules `json:"poison_rules,omitempty"`
}

// PoisonRules is storage.PoisonRules in the API (seed 002 ACK-9): dead-letter a message early
// when the same nack reason comes from more than one member (distinct_members), or after
// max_failures nacks within window (default 30s). Off by default.
type PoisonRules struct {
	DistinctMembers bool     `json:"distinct_members"`
	MaxFailures     int      `json:"max_failures"`
	Window          Duration `json:"window,omitempty"`
}

func configJSON(c storage.TopicConfig) TopicConfig {
	return TopicConfig{
		Semantics:                      c.Semantics,
		Partitions:                     c.Partitions,
		AckWait:                        Duration(c.AckWait),
		MaxDeliveries:                  c.MaxDeliveries,
		MessageRetention:               Duration(c.MessageRetention),
		ZeroSubscriptionRetention:      Duration(c.ZeroSubscriptionRetention),
		BlockWritesOnZeroSubscriptions: c.BlockWritesOnZeroSubscriptions,
		CompletionTracking:             c.CompletionTracking,
		MaxRetention:                   Duration(c.MaxRetention),
		ZombieTTL:                      Duration(c.ZombieTTL),
		MaxMessageBytes:                c.MaxMessageBytes,
		DedupWindow:                    Duration(c.DedupWindow),
		MaxBacklogMessages:             c.MaxBacklogMessages,
		MaxBacklogBytes:                c.MaxBacklogBytes,
		BacklogPolicy:                  c.BacklogPolicy,
		MaxMessages:                    c.MaxMessages,
		MaxBytes:                       c.MaxBytes,
		SizePolicy:                     c.SizePolicy,
		PoisonRules:                    poisonJSON(c.PoisonRules),
	}
}

func poisonJSON(r storage.PoisonRules) *PoisonRules {
	if !r.On() {
		return nil
	}
	return &PoisonRules{DistinctMembers: r.DistinctMembers, MaxFailures: r.MaxFailures, Window: Duration(r.Window)}
}

// storage converts the rules; the window means nothing without max_failures (an update that
// turns max_failures off keeps no window behind).
func (r *PoisonRules) storage() storage.PoisonRules {
	if r == nil {
		return storage.PoisonRules{}
	}
	out := storage.PoisonRules{DistinctMembers: r.DistinctMembers, MaxFailures: r.MaxFailures, Window: time.Duration(r.Window)}
	if out.MaxFailures == 0 {
		out.Window = 0
	}
	return out
}

func (c TopicConfig) storage() storage.TopicConfig {
	return storage.TopicConfig{
		Semantics:                      c.Semantics,
		Partitions:                     c.Partitions,
		AckWait:                        time.Duration(c.AckWait),
		MaxDeliveries:                  c.MaxDeliveries,
		MessageRetention:               time.Duration(c.MessageRetention),
		ZeroSubscriptionRetention:      time.Duration(c.ZeroSubscriptionRetention),
		BlockWritesOnZeroSubscriptions: c.BlockWritesOnZeroSubscriptions,
		CompletionTracking:             c.CompletionTracking,
		MaxRetention:                   time.Duration(c.MaxRetention),
		ZombieTTL:                      time.Duration(c.ZombieTTL),
		MaxMessageBytes:                c.MaxMessageBytes,
		DedupWindow:                    time.Duration(c.DedupWindow),
		MaxBacklogMessages:             c.MaxBacklogMessages,
		MaxBacklogBytes:                c.MaxBacklogBytes,
		BacklogPolicy:                  c.BacklogPolicy,
		MaxMessages:                    c.MaxMessages,
		MaxBytes:                       c.MaxBytes,
		SizePolicy:                     c.SizePolicy,
		PoisonRules:                    c.PoisonRules.storage(),
	}
}

// Topic is a topic in the API.
type Topic struct {
	Name      string              `json:"name"`
	Config    TopicConfig         `json:"config"`
	CreatedAt time.Time           `json:"created_at"`
	Stats     *storage.TopicStats `json:"stats,omitempty"`
	// Subscriptions counts the topic's subscriptions that are not DELETED.
	Subscriptions int `json:"subscriptions"`
	// Members counts the members of this broker attached to the topic.
	Members int `json:"members"`
	// Backpressure is the state of a topic with a backlog bound: normal, throttled or rejecting,
	// the backlog, and the publishes throttled and rejected since the broker started.
	Backpressure *Backpressure `json:"backpressure,omitempty"`
	// SizeBoundExceeded: the topic holds more than its max_messages or max_bytes (what the bound
	// may not remove because a group still needs it, or what came since the last retention run).
	SizeBoundExceeded bool `json:"size_bound_exceeded,omitempty"`
}

// Backpressure is broker.BackpressureInfo in the API: durations as strings.
type Backpressure struct {
	State              string                `json:"state"`
	Policy             storage.BacklogPolicy `json:"policy"`
	BacklogMessages    int64                 `json:"backlog_messages"`
	BacklogBytes       int64                 `json:"backlog_bytes"`
	MaxBacklogMessages int64                 `json:"max_backlog_messages,omitempty"`
	MaxBacklogBytes    int64                 `json:"max_backlog_bytes,omitempty"`
	Delay              Duration              `json:"delay"`
	RetryAfter         Duration              `json:"retry_after"`
	Throttled          int64                 `json:"throttled"`
	Rejected           int64                 `json:"rejected"`
	UpdatedAt          time.Time             `json:"updated_at"`
}

func backpressureJSON(i *broker.BackpressureInfo) *Backpressure {
	if i == nil {
		return nil
	}
	return &Backpressure{State: i.State, Policy: i.Policy, BacklogMessages: i.BacklogMessages, BacklogBytes: i.BacklogBytes,
		MaxBacklogMessages: i.MaxBacklogMessages, MaxBacklogBytes: i.MaxBacklogBytes, Delay: Duration(i.Delay),
		RetryAfter: Duration(i.RetryAfter), Throttled: i.Throttled, Rejected: i.Rejected, UpdatedAt: i.UpdatedAt}
}

func topicJSON(info *broker.TopicInfo) Topic {
	return Topic{
		Name:          info.Topic.Name,
		Config:        configJSON(info.Topic.Config),
		CreatedAt:     info.Topic.CreatedAt,
		Stats:         info.Stats,
		Subscriptions: info.Subscriptions,
		Members:       info.Members,
		Backpressure:  backpressureJSON(info.Backpressure),

		SizeBoundExceeded: info.Topic.Config.SizeBoundExceeded(info.Stats),
	}
}

// Member is a live member of this broker.
type Member = broker.MemberInfo

// Group is a subscription (a consumer group on a topic) with its health.
type Group struct {
	Topic          string                    `json:"topic"`
	Group          string                    `json:"group"`
	SubscriptionID int64                     `json:"subscription_id"`
	State          storage.SubscriptionState `json:"state"`
	Pattern        string                    `json:"pattern,omitempty"`
	Ephemeral      bool                      `json:"ephemeral"`
	Start          storage.StartPosition     `json:"start"`
	CreatedAt      time.Time                 `json:"created_at"`
	UpdatedAt      time.Time                 `json:"updated_at"`
	// HeartbeatTimeout: without a live member for this long the group becomes DEAD.
	HeartbeatTimeout Duration `json:"heartbeat_timeout"`
	// LastHeartbeatAt is the last time a broker saw a member of the group (or it became ACTIVE).
	LastHeartbeatAt time.Time `json:"last_heartbeat_at"`
	// Backfill is the group's catch-up range: state NOT_STARTED, IN_PROGRESS, COMPLETED,
	// CANCELLED or FAILED, processed, total, skipped, rate and ETA (GET .../backfill).
	Backfill    *broker.BackfillInfo `json:"backfill,omitempty"`
	MemberCount int                  `json:"member_count"`
	// Members describe the members of this broker attached to the subscription. In the group
	// listings (GET /api/v1/groups, /api/v1/topics/{topic}/groups, /admin/groups) they carry
	// subscription_count but not their subscription IDs, which GET /api/v1/members and
	// GET /api/v1/topics/{topic}/groups/{group} give.
	Members      []Member                             `json:"members"`
	Pending      int64                                `json:"pending"`
	Lag          int64                                `json:"lag"`
	InFlight     int64                                `json:"in_flight"`
	Redelivering int64                                `json:"redelivering"`
	DeadLettered int64                                `json:"dead_lettered"`
	Partitions   []storage.SubscriptionPartitionStats `json:"partitions"`
	// OldestUnackedAt is the publish time of the oldest message the group has not completed, and
	// OldestUnackedAge its age; absent when none is left, and in GET /api/v1/groups (one read per
	// partition: the one-topic listing and the group have them).
	OldestUnackedAt  *time.Time `json:"oldest_unacked_at,omitempty"`
	OldestUnackedAge *Duration  `json:"oldest_unacked_age,omitempty"`
	// Health is OK, WARN (receives, but see reasons) or FAIL (DEAD, PAUSED or CANCELLED: receives
	// nothing); Reasons say why, empty when OK.
	Health  string   `json:"health"`
	Reasons []string `json:"reasons"`
	// Mode is "shared" or "ordered"; the fields below are for ordered groups only: the
	// assignment strategy, the unsettled bound per partition, the generation (incremented by
	// every rebalance) and the assignment (member name to partitions, on every broker instance).
	Mode                    string             `json:"mode"`
	Strategy                string             `json:"strategy,omitempty"`
	MaxInFlightPerPartition int                `json:"max_in_flight_per_partition,omitempty"`
	Generation              int64              `json:"generation,omitempty"`
	Assignment              map[string][]int32 `json:"assignment,omitempty"`
}

// groupJSON converts a GroupInfo; members maps member IDs to their descriptions (from
// Broker.Members). A listing (list set) leaves out the members' subscription IDs: a member on n
// subscriptions is described in n entries, and listing its n IDs in each made a listing grow with
// the square of n (a wildcard consumer on 10,000 topics: 10^8 IDs). GET /api/v1/members has them.
func groupJSON(g *broker.GroupInfo, members map[string]Member, list bool) Group {
	out := Group{
		Topic:       g.Topic,
		Group:       g.Group,
		State:       g.State,
		MemberCount: len(g.Members),
		Members:     make([]Member, 0, len(g.Members)),
		Partitions:  []storage.SubscriptionPartitionStats{},
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
		out.Start = s.Start
		out.CreatedAt = s.CreatedAt
		out.UpdatedAt = s.UpdatedAt
		out.HeartbeatTimeout = Duration(s.HeartbeatTimeout)
		out.LastHeartbeatAt = s.LastHeartbeatAt
	}
	out.Backfill = g.Backfill
	orderedJSON(&out, g)
	if st := g.Stats; st != nil {
		out.Pending = st.Pending
		out.Lag = st.Lag
		out.InFlight = st.InFlight
		out.Redelivering = st.Redelivering
		out.DeadLettered = st.DeadLettered
		if st.Partitions != nil {
			out.Partitions = st.Partitions
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
		out[m.ID] = m
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

package admin

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// Seed 002's remaining documented HTTP paths (milestone checks M1-18, M4-9 and M4-10, and the
// operator views of its monitoring section), so that its checks run verbatim. Each answers with
// what Spool knows. The Seed* types' comments (here, SeedTopic in dlq.go) say what each field means;
// the routes' summaries and descriptions (routes.go, served as OpenAPI with the tag seed) say how
// each path differs from the seed.

// SeedPublishRequest is the body of POST /publish: {"topic": "test", "message": "hello"}.
type SeedPublishRequest struct {
	Topic string `json:"topic"`
	// Message is the payload: a JSON string is stored as its text, any other JSON value as its
	// JSON encoding.
	Message json.RawMessage   `json:"message"`
	Key     *string           `json:"key,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// seedPublish serves POST /publish (seed 002 M1-18): one message to the topic named in the body,
// auto-created like any publish; publish permission on that topic, and priority exempts from the
// topic's backpressure as on POST /api/v1/topics/{topic}/messages.
func (h *Handler) seedPublish(w http.ResponseWriter, r *http.Request) error {
	var req SeedPublishRequest
	if isCurlForm(r.Header.Get("Content-Type")) {
		r.Header.Del("Content-Type") // curl -d: the body is the seed's JSON
	}
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	if err := names.ValidateTopic(req.Topic); err != nil {
		return storage.InvalidName(err)
	}
	if len(req.Message) == 0 {
		return invalidf("no message in the body: {\"topic\": \"test\", \"message\": \"hello\"}")
	}
	if err := h.allowed(r, auth.Publish, req.Topic); err != nil {
		return err
	}
	payload := []byte(req.Message)
	var text string
	if json.Unmarshal(req.Message, &text) == nil {
		payload = []byte(text)
	}
	am := storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload, Headers: req.Headers}
	if req.Key != nil {
		am.Key = []byte(*req.Key)
	}
	start := time.Now()
	pos, err := h.b.PublishWith(r.Context(), req.Topic, []storage.AppendMessage{am}, broker.PublishOptions{Priority: h.priority(r, req.Topic)})
	if err != nil {
		return err // counted in spool_publish_errors_total by Handler.wrap
	}
	h.metrics.ObservePublish(req.Topic, 1, time.Since(start))
	parts := h.partitions(r.Context(), req.Topic)
	out := PublishResult{Messages: make([]PublishedMessage, len(pos))}
	for i, p := range pos {
		out.Messages[i] = PublishedMessage{ID: storage.MessageID(parts, p.Partition, p.Offset), Partition: p.Partition, Offset: p.Offset,
			PublishedAt: p.PublishedAt, Duplicate: p.Duplicate}
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// SeedPending is one delivery of GET /admin/pending: leased to a consumer of this broker, not
// yet acked or nacked.
type SeedPending struct {
	// MessageID is the id shown to users (offset, or partition:offset).
	MessageID string `json:"message_id"`
	Topic     string `json:"topic"`
	Group     string `json:"group"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Consumer is the member holding the lease.
	Consumer string `json:"consumer"`
	// Deadline is when the lease expires and the message is redelivered.
	Deadline time.Time `json:"deadline"`
}

// SeedPendingList is the response of GET /admin/pending.
type SeedPendingList struct {
	Pending []SeedPending `json:"pending"`
	// Total counts every pending delivery; Pending holds the limit with the earliest deadlines.
	Total int `json:"total"`
}

func (h *Handler) seedPending(w http.ResponseWriter, r *http.Request) error {
	limit, err := queryInt(r, "limit", defaultPageLimit, maxPageLimit)
	if err != nil {
		return err
	}
	ds, total := h.b.Pending(int(limit))
	groups, err := h.b.Groups(r.Context())
	if err != nil {
		return err
	}
	type subRef struct{ topic, group string }
	subs := make(map[int64]subRef, len(groups))
	for _, g := range groups {
		if g.Subscription != nil {
			subs[g.Subscription.ID] = subRef{g.Topic, g.Group}
		}
	}
	parts := map[string]int{}
	out := SeedPendingList{Pending: make([]SeedPending, 0, len(ds)), Total: total}
	for _, d := range ds {
		ref := subs[d.SubscriptionID]
		n, ok := parts[ref.topic]
		if !ok && ref.topic != "" {
			n = h.partitions(r.Context(), ref.topic)
			parts[ref.topic] = n
		}
		out.Pending = append(out.Pending, SeedPending{MessageID: storage.MessageID(n, d.Partition, d.Offset), Topic: ref.topic,
			Group: ref.group, Partition: d.Partition, Offset: d.Offset, Consumer: d.Member, Deadline: d.Deadline})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// Session is a client connection of the TCP server, as Config.Sessions reports it (the fields of
// server.SessionInfo; package server's tests use this package, so it cannot import server).
type Session struct {
	ID     string
	Mode   string // "binary", "text", or "" before the first byte
	Remote string
	Client string
	// ProtocolVersion is the binary protocol version the connection negotiated (0 for the text
	// mode and before the handshake).
	ProtocolVersion int
	Opened          time.Time
	// Members are the IDs of the connection's members.
	Members []string
}

// SeedConnection is one client connection of GET /admin/connections.
type SeedConnection struct {
	ID     string `json:"id"`
	Remote string `json:"remote"`
	// Mode is binary, text, or empty before the first byte.
	Mode string `json:"mode"`
	// ProtocolVersion is the binary protocol version the connection negotiated in its handshake
	// (0 for the text mode and before the handshake).
	ProtocolVersion int       `json:"protocol_version"`
	Client          string    `json:"client,omitempty"`
	Opened          time.Time `json:"opened"`
	DurationSeconds float64   `json:"duration_seconds"`
	// Members are the consumers (one per subscription handle) the connection holds.
	Members []string `json:"members"`
}

// SeedConnections is the response of GET /admin/connections.
type SeedConnections struct {
	Connections []SeedConnection `json:"connections"`
}

func (h *Handler) seedConnections(w http.ResponseWriter, _ *http.Request) error {
	out := SeedConnections{Connections: []SeedConnection{}}
	if h.sessions == nil {
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	now := time.Now()
	for _, s := range h.sessions() {
		c := SeedConnection{ID: s.ID, Remote: s.Remote, Mode: s.Mode, ProtocolVersion: s.ProtocolVersion, Client: s.Client,
			Opened: s.Opened, DurationSeconds: now.Sub(s.Opened).Seconds(), Members: s.Members}
		if c.Members == nil {
			c.Members = []string{}
		}
		out.Connections = append(out.Connections, c)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// SeedTopicMetrics is one topic of GET /api/v1/metrics/topics (seed 002 M4-9).
type SeedTopicMetrics struct {
	Topic string `json:"topic"`
	// Messages counts retained messages; PublishedTotal every message ever appended (the
	// message_throughput metric: its rate is the topic's throughput).
	Messages       int64 `json:"messages"`
	PublishedTotal int64 `json:"published_total"`
	Bytes          int64 `json:"bytes"`
	QueueDepth     int64 `json:"queue_depth"`
	Subscriptions  int   `json:"subscriptions"`
	Consumers      int   `json:"consumers"`
}

// SeedTopicMetricsList is the response of GET /api/v1/metrics/topics.
type SeedTopicMetricsList struct {
	Topics []SeedTopicMetrics `json:"topics"`
}

func (h *Handler) seedTopicMetrics(w http.ResponseWriter, r *http.Request) error {
	pattern := r.URL.Query().Get("topic_pattern")
	if pattern != "" {
		if err := names.ValidatePattern(pattern); err != nil {
			return storage.InvalidName(err)
		}
	}
	topics, err := h.b.Topics(r.Context())
	if err != nil {
		return err
	}
	groups, err := h.b.Groups(r.Context())
	if err != nil {
		return err
	}
	depths := metrics.QueueDepths(topics, groups)
	out := SeedTopicMetricsList{Topics: []SeedTopicMetrics{}}
	for _, t := range topics {
		if pattern != "" && !names.Match(pattern, t.Topic.Name) {
			continue
		}
		m := SeedTopicMetrics{Topic: t.Topic.Name, QueueDepth: depths[t.Topic.Name], Subscriptions: t.Subscriptions, Consumers: t.Members}
		if t.Stats != nil {
			m.Messages, m.Bytes = t.Stats.Messages, t.Stats.Bytes
			for _, p := range t.Stats.Partitions {
				m.PublishedTotal += p.HighWater
			}
		}
		out.Topics = append(out.Topics, m)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// SeedConsumerHealth is one consumer group of GET /api/v1/health/consumers (seed 002 M4-10).
type SeedConsumerHealth struct {
	Topic string                    `json:"topic"`
	Group string                    `json:"group"`
	State storage.SubscriptionState `json:"state"`
	// Healthy is true for an ACTIVE group with a live consumer on this broker.
	Healthy bool `json:"healthy"`
	// Status says why: healthy, no_consumers (a consumer that died left the group: its leases
	// were released and its messages go to the others or wait), paused, dead or cancelled.
	Status    string   `json:"status"`
	Consumers []Member `json:"consumers"`
	Pending   int64    `json:"pending"`
	InFlight  int64    `json:"in_flight"`
}

// SeedConsumerHealthList is the response of GET /api/v1/health/consumers.
type SeedConsumerHealthList struct {
	Groups []SeedConsumerHealth `json:"groups"`
}

func (h *Handler) seedConsumerHealth(w http.ResponseWriter, r *http.Request) error {
	name := r.URL.Query().Get("group_name")
	infos, err := h.b.Groups(r.Context())
	if err != nil {
		return err
	}
	members := memberMap(h.b)
	out := SeedConsumerHealthList{Groups: []SeedConsumerHealth{}}
	for _, gi := range infos {
		if name != "" && gi.Group != name {
			continue
		}
		g := groupJSON(gi, members, true)
		c := SeedConsumerHealth{Topic: g.Topic, Group: g.Group, State: gi.State, Consumers: g.Members, Pending: g.Pending, InFlight: g.InFlight}
		switch {
		case gi.State == storage.Active && g.MemberCount > 0:
			c.Healthy, c.Status = true, "healthy"
		case gi.State == storage.Active:
			c.Status = "no_consumers"
		default:
			c.Status = strings.ToLower(string(gi.State))
		}
		out.Groups = append(out.Groups, c)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

package admin

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
)

// DLQList is the response of GET .../dlq.
type DLQList struct {
	Entries []DLQEntry `json:"entries"`
	// NextAfterID is the after_id of the next page; absent on the last page.
	NextAfterID *int64 `json:"next_after_id,omitempty"`
}

// partitions returns the partition count of topic, for message ids; 0 if it cannot be read (ids
// are then "partition:offset" except for partition 0).
func (h *Handler) partitions(ctx context.Context, topic string) int {
	n, err := h.b.TopicPartitions(ctx, topic)
	if err != nil {
		return 0
	}
	return n
}

// idPage reads the after_id and limit of a route paged by ID (limit 0 or absent: the default page).
func idPage(r *http.Request) (after, limit int64, err error) {
	return idPageOf(r, defaultPageLimit)
}

// idPageOf is idPage with def as the page size when limit is absent or 0.
func idPageOf(r *http.Request, def int64) (after, limit int64, err error) {
	if after, err = queryInt(r, "after_id", 0, 1<<62); err != nil {
		return 0, 0, err
	}
	if limit, err = queryInt(r, "limit", def, maxPageLimit); err != nil {
		return 0, 0, err
	}
	if limit == 0 {
		limit = def
	}
	return after, limit, nil
}

func (h *Handler) listDLQ(w http.ResponseWriter, r *http.Request) error {
	topic, group := r.PathValue("topic"), r.PathValue("group")
	after, limit, err := idPage(r)
	if err != nil {
		return err
	}
	// payload=false leaves the payloads out of the answer: a list that polls asks for them, then
	// fetches the entry it shows. Pages of large messages stay short either way: the engine
	// reads at most storage.ReadBatchBytes of whole messages.
	payload := true
	if r.URL.Query().Get("payload") != "" {
		if payload, err = queryBool(r, "payload"); err != nil {
			return err
		}
	}
	entries, err := h.b.DLQ(r.Context(), topic, group, after, int(limit))
	if err != nil {
		return err
	}
	// At most maxResponseBytes of messages (their payloads only when included); a shorter page
	// says where the next starts.
	fit := fitBytes(len(entries), func(i int) int {
		m := &entries[i].Message
		if payload {
			return m.Size()
		}
		return m.Size() - len(m.Payload)
	})
	more := fit < len(entries) || len(entries) == int(limit)
	entries = entries[:fit]
	if !more && len(entries) > 0 {
		// The engine also stops at storage.ReadBatchBytes of messages: a short page is the end
		// only when nothing follows it.
		next, err := h.b.DLQ(r.Context(), topic, group, entries[len(entries)-1].ID, 1)
		if err != nil {
			return err
		}
		more = len(next) > 0
	}
	parts := h.partitions(r.Context(), topic)
	out := DLQList{Entries: make([]DLQEntry, 0, len(entries))}
	for _, e := range entries {
		j := dlqJSON(e, parts)
		if !payload {
			n := len(e.Message.Payload)
			j.Message.Payload, j.Message.PayloadBase64, j.Message.PayloadBytes = nil, nil, &n
		}
		out.Entries = append(out.Entries, j)
	}
	if more {
		next := entries[len(entries)-1].ID
		out.NextAfterID = &next
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) getDLQEntry(w http.ResponseWriter, r *http.Request) error {
	topic, group := r.PathValue("topic"), r.PathValue("group")
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return invalidf("dlq entry id must be a positive integer, got %q", r.PathValue("id"))
	}
	e, err := h.dlqEntry(r.Context(), topic, group, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, dlqJSON(e, h.partitions(r.Context(), topic)))
	return nil
}

// dlqEntry returns one DLQ entry of a subscription, or a NOT_FOUND error.
func (h *Handler) dlqEntry(ctx context.Context, topic, group string, id int64) (*storage.DLQEntry, error) {
	entries, err := h.b.DLQ(ctx, topic, group, id-1, 1)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 || entries[0].ID != id {
		return nil, httpErr(http.StatusNotFound, "NOT_FOUND", "dlq entry %d of group %q on topic %q not found", id, group, topic)
	}
	return entries[0], nil
}

// DLQSelection is the body of the DLQ replay and purge endpoints: the entry ids, or all: true for
// every entry (an empty selection is refused so that a forgotten body does not purge a DLQ).
type DLQSelection struct {
	IDs []int64 `json:"ids,omitempty"`
	All bool    `json:"all,omitempty"`
}

func (s DLQSelection) validate() error {
	switch {
	case s.All && len(s.IDs) > 0:
		return invalidf("give ids or all, not both")
	case !s.All && len(s.IDs) == 0:
		return invalidf("give the entry ids, or all: true for every entry")
	}
	for _, id := range s.IDs {
		if id < 1 {
			return invalidf("dlq entry ids must be positive, got %d", id)
		}
	}
	return nil
}

// DLQResult is the response of the DLQ replay and purge endpoints.
type DLQResult struct {
	// Replayed counts the entries moved back to their subscription (replay).
	Replayed *int `json:"replayed,omitempty"`
	// Purged counts the entries removed (purge).
	Purged *int `json:"purged,omitempty"`
}

// readSelection decodes and validates the body of the DLQ replay and purge endpoints.
func readSelection(r *http.Request) (DLQSelection, error) {
	var sel DLQSelection
	if err := decodeJSON(r, &sel, false); err != nil {
		return sel, err
	}
	return sel, sel.validate()
}

func (h *Handler) replayDLQ(w http.ResponseWriter, r *http.Request) error {
	sel, err := readSelection(r)
	if err != nil {
		return err
	}
	n, err := h.b.ReplayDLQ(r.Context(), r.PathValue("topic"), r.PathValue("group"), sel.IDs)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, DLQResult{Replayed: &n})
	return nil
}

func (h *Handler) purgeDLQ(w http.ResponseWriter, r *http.Request) error {
	sel, err := readSelection(r)
	if err != nil {
		return err
	}
	n, err := h.b.PurgeDLQ(r.Context(), r.PathValue("topic"), r.PathValue("group"), sel.IDs)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, DLQResult{Purged: &n})
	return nil
}

// SeedReplayRequest is the body of POST /admin/dlq/replay. Two shapes are accepted:
//
//   - Spool's: {"topic": "orders", "group": "billing", "ids": [3, 4]} or with "all": true;
//     group defaults to "$queue" for a QUEUE topic.
//   - seed 002's: {"message_id": "dlq-12345", "target_topic": "orders"}: message_id is a DLQ
//     entry id ("dlq-" prefix optional) and target_topic the topic whose DLQ holds it. Spool
//     keeps one DLQ per subscription and replays an entry to that subscription only (BRIEF.md
//     section 4), so the group is found: the queue subscription of a QUEUE topic, else the one
//     subscription of the topic whose DLQ has that id (give "group" when several have).
//     The message keeps its identity (no new id, no replay headers): it is redelivered, with a
//     fresh attempt count, to the group that dead-lettered it, not published again to the topic.
type SeedReplayRequest struct {
	Topic       string  `json:"topic,omitempty"`
	Group       string  `json:"group,omitempty"`
	IDs         []int64 `json:"ids,omitempty"`
	All         bool    `json:"all,omitempty"`
	MessageID   string  `json:"message_id,omitempty"`
	TargetTopic string  `json:"target_topic,omitempty"`
}

func (h *Handler) seedReplay(w http.ResponseWriter, r *http.Request) error {
	var req SeedReplayRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	ctx := r.Context()
	topic := req.Topic
	if req.TargetTopic != "" {
		if topic != "" && topic != req.TargetTopic {
			return invalidf("topic %q and target_topic %q differ", topic, req.TargetTopic)
		}
		topic = req.TargetTopic
	}
	if topic == "" {
		return invalidf("topic (or target_topic) is required")
	}
	sel := DLQSelection{IDs: req.IDs, All: req.All}
	if req.MessageID != "" {
		if len(req.IDs) > 0 || req.All {
			return invalidf("give message_id, or ids / all, not both")
		}
		id, err := strconv.ParseInt(strings.TrimPrefix(req.MessageID, "dlq-"), 10, 64)
		if err != nil || id < 1 {
			return invalidf("message_id must be a DLQ entry id such as \"dlq-12\" or \"12\", got %q", req.MessageID)
		}
		sel.IDs = []int64{id}
	}
	if err := sel.validate(); err != nil {
		return err
	}
	group := req.Group
	if group == "" {
		g, err := h.replayGroup(ctx, topic, sel)
		if err != nil {
			return err
		}
		group = g
	}
	n, err := h.b.ReplayDLQ(ctx, topic, group, sel.IDs)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, SeedReplayResult{Topic: topic, Group: group, Replayed: n})
	return nil
}

// SeedReplayResult is the response of POST /admin/dlq/replay.
type SeedReplayResult struct {
	Topic    string `json:"topic"`
	Group    string `json:"group"`
	Replayed int    `json:"replayed"`
}

// replayGroup finds the group of a seed replay that did not name one: the queue subscription of a
// QUEUE topic; else the one subscription whose DLQ holds the single id asked for.
func (h *Handler) replayGroup(ctx context.Context, topic string, sel DLQSelection) (string, error) {
	info, err := h.b.Topic(ctx, topic)
	if err != nil {
		return "", err
	}
	if info.Topic.Config.Semantics == storage.Queue {
		return storage.QueueGroup, nil
	}
	if len(sel.IDs) != 1 {
		return "", invalidf("topic %q is PUB_SUB: give the group whose DLQ to replay", topic)
	}
	groups, err := h.b.Groups(ctx)
	if err != nil {
		return "", err
	}
	var found []string
	for _, g := range groups {
		if g.Topic != topic || g.State == storage.Cancelled {
			continue
		}
		if _, err := h.dlqEntry(ctx, topic, g.Group, sel.IDs[0]); err == nil {
			found = append(found, g.Group)
		}
	}
	switch len(found) {
	case 0:
		return "", httpErr(http.StatusNotFound, "NOT_FOUND", "no subscription of topic %q has dlq entry %d", topic, sel.IDs[0])
	case 1:
		return found[0], nil
	}
	return "", invalidf("dlq entry %d exists in the DLQs of groups %s of topic %q: give the group", sel.IDs[0], strings.Join(found, ", "), topic)
}

// SeedTopic is one topic of GET /admin/topics (seed 002 M4-2).
type SeedTopic struct {
	Name      string            `json:"name"`
	Semantics storage.Semantics `json:"semantics"`
	// Subscribers counts the consumers (members) of this broker attached to the topic.
	Subscribers int `json:"subscribers"`
	// Subscriptions counts the topic's subscriptions (consumer groups, the queue subscription,
	// ephemeral subscriptions) that are not DELETED.
	Subscriptions int   `json:"subscriptions"`
	Partitions    int   `json:"partitions"`
	Messages      int64 `json:"messages"`
	Bytes         int64 `json:"bytes"`
	// QueueDepth is the queue_depth metric of the topic.
	QueueDepth       int64     `json:"queue_depth"`
	MessageRetention Duration  `json:"message_retention"`
	CreatedAt        time.Time `json:"created_at"`
}

// SeedTopics is the response of GET /admin/topics.
type SeedTopics struct {
	Topics []SeedTopic `json:"topics"`
}

func (h *Handler) seedTopics(w http.ResponseWriter, r *http.Request) error {
	topics, err := h.b.Topics(r.Context())
	if err != nil {
		return err
	}
	groups, err := h.b.Groups(r.Context())
	if err != nil {
		return err
	}
	depths := metrics.QueueDepths(topics, groups)
	out := SeedTopics{Topics: make([]SeedTopic, 0, len(topics))}
	for _, t := range topics {
		st := SeedTopic{
			Name:             t.Topic.Name,
			Semantics:        t.Topic.Config.Semantics,
			Subscribers:      t.Members,
			Subscriptions:    t.Subscriptions,
			Partitions:       t.Topic.Config.Partitions,
			QueueDepth:       depths[t.Topic.Name],
			MessageRetention: Duration(t.Topic.Config.MessageRetention),
			CreatedAt:        t.Topic.CreatedAt,
		}
		if t.Stats != nil {
			st.Messages, st.Bytes = t.Stats.Messages, t.Stats.Bytes
		}
		out.Topics = append(out.Topics, st)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// SeedGroup is one entry of GET /admin/groups (seed 002 M4-3): one subscription, a consumer group
// on a topic (a group subscribed to three topics has three entries).
type SeedGroup struct {
	Topic string                    `json:"topic"`
	Group string                    `json:"group"`
	State storage.SubscriptionState `json:"state"`
	// Members counts the consumers of this broker in the group on this topic.
	Members int `json:"members"`
	// Consumers describe them: their credit and the deliveries each holds (pending per consumer);
	// their subscription IDs are left out (see Group.Members).
	Consumers    []Member `json:"consumers"`
	Pending      int64    `json:"pending"`
	Lag          int64    `json:"lag"`
	InFlight     int64    `json:"in_flight"`
	DeadLettered int64    `json:"dead_lettered"`
}

// SeedGroups is the response of GET /admin/groups.
type SeedGroups struct {
	Groups []SeedGroup `json:"groups"`
}

func (h *Handler) seedGroups(w http.ResponseWriter, r *http.Request) error {
	infos, err := h.b.Groups(r.Context())
	if err != nil {
		return err
	}
	members := memberMap(h.b)
	out := SeedGroups{Groups: make([]SeedGroup, 0, len(infos))}
	for _, gi := range infos {
		g := groupJSON(gi, members, true)
		out.Groups = append(out.Groups, SeedGroup{
			Topic: g.Topic, Group: g.Group, State: gi.State, Members: g.MemberCount, Consumers: g.Members,
			Pending: g.Pending, Lag: g.Lag, InFlight: g.InFlight, DeadLettered: g.DeadLettered,
		})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

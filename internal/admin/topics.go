package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// Paging bounds of list endpoints.
const (
	defaultPageLimit = 100
	maxPageLimit     = 1000
)

// TopicList is the response of GET /api/v1/topics.
type TopicList = api.TopicList

func (h *Handler) listTopics(w http.ResponseWriter, r *http.Request) error {
	limit, err := queryInt(r, "limit", defaultPageLimit, maxPageLimit)
	if err != nil {
		return err
	}
	offset, err := queryInt(r, "offset", 0, 1<<31)
	if err != nil {
		return err
	}
	pattern := r.URL.Query().Get("pattern")
	if pattern != "" {
		if err := names.ValidatePattern(pattern); err != nil {
			return invalidf("query parameter pattern: %v", err)
		}
	}
	infos, err := h.b.Topics(r.Context())
	if err != nil {
		return err
	}
	var matched []Topic
	for _, t := range infos {
		if pattern == "" || names.Match(pattern, t.Topic.Name) {
			matched = append(matched, topicJSON(t))
		}
	}
	out := TopicList{Topics: []Topic{}, Total: len(matched), Limit: int(limit), Offset: int(offset)}
	if int(offset) < len(matched) {
		out.Topics = matched[offset:min(int(offset+limit), len(matched))]
	}
	w.Header().Set("X-Total-Count", strconv.Itoa(out.Total))
	writeJSON(w, http.StatusOK, out)
	return nil
}

// CreateTopicRequest is the body of POST /api/v1/topics: the name and the configuration fields
// (zero or absent fields take the defaults). retention_policy.max_age (seconds) is seed 002's
// spelling of message_retention.
type CreateTopicRequest = api.CreateTopicRequest

// RetentionPolicy is seed 002's retention object: max_age is message_retention in seconds.
type RetentionPolicy = api.RetentionPolicy

func (h *Handler) createTopic(w http.ResponseWriter, r *http.Request) error {
	var req CreateTopicRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	if req.Name == "" {
		return invalidf("name is required")
	}
	cfg := configStorage(req.TopicConfig)
	if rp := req.RetentionPolicy; rp != nil {
		if rp.MaxAge < 0 {
			return invalidf("retention_policy.max_age must not be negative, got %v", rp.MaxAge)
		}
		if cfg.MessageRetention != 0 {
			return invalidf("give message_retention or retention_policy.max_age, not both")
		}
		cfg.MessageRetention = time.Duration(rp.MaxAge * float64(time.Second))
	}
	t, err := h.b.CreateTopic(r.Context(), req.Name, cfg)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/v1/topics/"+url.PathEscape(t.Name))
	writeJSON(w, http.StatusCreated, Topic{Name: t.Name, Config: configJSON(t.Config), CreatedAt: t.CreatedAt})
	return nil
}

func (h *Handler) getTopic(w http.ResponseWriter, r *http.Request) error {
	info, err := h.b.Topic(r.Context(), r.PathValue("topic"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, topicJSON(info))
	return nil
}

// UpdateTopicRequest is the body of PUT /api/v1/topics/{topic}/config: the configuration fields to
// change (absent fields keep their current values) and, for a change from QUEUE to PUB_SUB, the
// group the queue subscription becomes (refused with any other update).
type UpdateTopicRequest struct {
	TopicConfig
	QueueToGroup string `json:"queue_to_group,omitempty"`
}

// topicUpdateAttempts bounds how many times updateTopicConfig applies one request to a fresh read
// of the configuration while other updates keep landing between its read and its write.
const topicUpdateAttempts = 5

// updateTopicConfig decodes the body onto the configuration it read, so that the body changes
// exactly the fields it has, and writes the result back expecting the configuration read
// (broker.UpdateTopicParams.Expect). An update that landed in between (another request, another
// broker instance) makes the write fail with storage.ErrTopicChanged instead of being undone with
// the values read: the body is then applied again to a fresh read, up to topicUpdateAttempts
// times, and past them the request fails with 409 TOPIC_CHANGED, having changed nothing.
func (h *Handler) updateTopicConfig(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("topic")
	// The configuration alone: a read with the statistics (Topic) is for the answer.
	cur, err := h.b.TopicConfig(r.Context(), name)
	if err != nil {
		return err
	}
	data, err := jsonBody(r)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		if hook := h.topicReadHook; hook != nil {
			hook(name)
		}
		t, err := h.applyTopicConfig(r.Context(), name, cur.Config, data)
		if err == nil {
			info, err := h.b.Topic(r.Context(), t.Name)
			if err != nil {
				writeJSON(w, http.StatusOK, Topic{Name: t.Name, Config: configJSON(t.Config), CreatedAt: t.CreatedAt})
				return nil // the update succeeded; the stats are best effort
			}
			writeJSON(w, http.StatusOK, topicJSON(info))
			return nil
		}
		if !errors.Is(err, storage.ErrTopicChanged) {
			return err
		}
		if attempt == topicUpdateAttempts {
			return fmt.Errorf("%w: topic %q: other updates of its configuration landed during each of the %d attempts "+
				"to apply this one; this request changed nothing, send it again", storage.ErrTopicChanged, name, attempt)
		}
		if cur, err = h.b.TopicConfig(r.Context(), name); err != nil {
			return err
		}
	}
}

// applyTopicConfig applies the body data of a configuration update to the configuration cur read
// and writes the result if the topic's configuration is still cur (storage.ErrTopicChanged).
func (h *Handler) applyTopicConfig(ctx context.Context, name string, cur storage.TopicConfig, data []byte) (*storage.Topic, error) {
	req := UpdateTopicRequest{TopicConfig: configJSON(cur)}
	if err := unmarshalJSON(data, &req, false); err != nil {
		return nil, err
	}
	// The current window means nothing once max_failures is off: an update that turns it off
	// keeps no window behind. A window the body gives without max_failures is refused.
	if p := req.PoisonRules; p != nil && p.MaxFailures == 0 && !setsPoisonWindow(data) {
		p.Window = 0
	}
	// queue_to_group means something only for that change: accepted elsewhere, it would be ignored.
	if req.QueueToGroup != "" && (cur.Semantics != storage.Queue || storage.Semantics(req.Semantics) != storage.PubSub) {
		return nil, invalidf("queue_to_group is only for a change from QUEUE to PUB_SUB; topic %q is %s and the update makes it %s",
			name, cur.Semantics, req.Semantics)
	}
	// The current count is at least 1, so 0 came from the body; left to the defaults it would
	// become 1 and be refused as "got 1".
	if req.Partitions == 0 {
		return nil, invalidf("partitions must be between 1 and %d, got 0", storage.MaxPartitions)
	}
	return h.b.UpdateTopic(ctx, broker.UpdateTopicParams{
		Name: name, Config: configStorage(req.TopicConfig), QueueToGroup: req.QueueToGroup, Expect: &cur,
	})
}

func (h *Handler) deleteTopic(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("topic")
	force, err := queryBool(r, "force")
	if err != nil {
		return err
	}
	if err := h.b.DeleteTopic(r.Context(), name, force); err != nil {
		return err
	}
	h.metrics.ForgetTopic(name)
	h.pulls.closeTopic(name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// GroupList is the response of the group listings.
type GroupList = api.GroupList

func (h *Handler) listGroups(w http.ResponseWriter, r *http.Request) error {
	group, state, err := groupFilter(r)
	if err != nil {
		return err
	}
	topic := r.URL.Query().Get("topic")
	after, limit, err := idPage(r)
	if err != nil {
		return err
	}
	// Paged by subscription ID: only the page's subscriptions have their figures read.
	infos, next, err := h.b.GroupsPage(r.Context(), broker.GroupPageParams{
		Topic: topic, Group: group, State: state, AfterID: after, Limit: int(limit)})
	if err != nil {
		return err
	}
	members := memberMap(h.b)
	out := GroupList{Groups: make([]Group, 0, len(infos))}
	for _, g := range infos {
		out.Groups = append(out.Groups, groupJSON(g, members, true))
	}
	if next != 0 {
		out.NextAfterID = &next
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// groupFilter reads the group and state query parameters of the group listings.
func groupFilter(r *http.Request) (string, storage.SubscriptionState, error) {
	q := r.URL.Query()
	state := storage.SubscriptionState(q.Get("state"))
	switch state {
	case "", storage.Active, storage.Paused, storage.Dead, storage.Cancelled:
	default:
		return "", "", invalidf("query parameter state must be ACTIVE, PAUSED, DEAD or CANCELLED, got %q", state)
	}
	return q.Get("group"), state, nil
}

// listTopicGroups lists a topic's groups with their oldest unacked message, a page at a time
// (default and most maxPageLimit): each group's figures are read per request, so an unpaged list
// of a topic with tens of thousands of groups would make one request read all of theirs. It takes
// the filters of listGroups but topic.
func (h *Handler) listTopicGroups(w http.ResponseWriter, r *http.Request) error {
	topic := r.PathValue("topic")
	group, state, err := groupFilter(r)
	if err != nil {
		return err
	}
	after, limit, err := idPageOf(r, maxPageLimit)
	if err != nil {
		return err
	}
	infos, next, err := h.b.GroupsPage(r.Context(), broker.GroupPageParams{Topic: topic, Group: group, State: state,
		AfterID: after, Limit: int(limit)})
	if err != nil {
		return err
	}
	members := memberMap(h.b)
	out := GroupList{Groups: []Group{}}
	for _, g := range infos {
		out.Groups = append(out.Groups, groupJSON(g, members, true))
	}
	if next != 0 {
		out.NextAfterID = &next
	}
	if len(out.Groups) == 0 && after == 0 {
		// An unknown topic is TOPIC_NOT_FOUND, not an empty list.
		if _, err := h.b.Topic(r.Context(), topic); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) getGroup(w http.ResponseWriter, r *http.Request) error {
	return h.writeGroup(w, r, r.PathValue("topic"), r.PathValue("group"))
}

func (h *Handler) writeGroup(w http.ResponseWriter, r *http.Request, topic, group string) error {
	g, err := h.b.Group(r.Context(), topic, group)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, groupJSON(g, memberMap(h.b), false))
	return nil
}

// groupOp returns the handler of a group operation (Broker.PauseGroup, ResumeGroup, CancelGroup);
// it answers with the group afterwards.
func (h *Handler) groupOp(op func(ctx context.Context, topic, group string) (*storage.Subscription, error)) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		topic, group := r.PathValue("topic"), r.PathValue("group")
		if _, err := op(r.Context(), topic, group); err != nil {
			return err
		}
		return h.writeGroup(w, r, topic, group)
	}
}

// MemberList is the response of GET /api/v1/members.
type MemberList struct {
	Members []Member `json:"members"`
}

func (h *Handler) listMembers(w http.ResponseWriter, r *http.Request) error {
	out := MemberList{Members: []Member{}}
	for _, m := range h.b.Members() {
		out.Members = append(out.Members, memberJSON(m))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// BindingList is the response of GET /api/v1/bindings.
type BindingList struct {
	Bindings []*storage.Binding `json:"bindings"`
}

func (h *Handler) listBindings(w http.ResponseWriter, r *http.Request) error {
	bs, err := h.b.Bindings(r.Context())
	if err != nil {
		return err
	}
	if bs == nil {
		bs = []*storage.Binding{}
	}
	writeJSON(w, http.StatusOK, BindingList{Bindings: bs})
	return nil
}

func (h *Handler) deleteBinding(w http.ResponseWriter, r *http.Request) error {
	if err := h.b.DeleteBinding(r.Context(), r.PathValue("group"), r.PathValue("pattern")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

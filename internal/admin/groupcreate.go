package admin

import (
	"net/http"
	"net/url"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// CreateGroupRequest is the body of POST /api/v1/topics/{topic}/groups: a consumer group created
// ahead of its consumers on a PUB_SUB topic.
type CreateGroupRequest struct {
	// Group is the consumer group. Required.
	Group string `json:"group"`
	// Start is where the group starts (kind FROM_NOW, the default, FROM_BEGINNING,
	// FROM_TIMESTAMP with time, FROM_MESSAGE_ID with partition and offset).
	Start storage.StartPosition `json:"start"`
	// HeartbeatTimeout is how long the group may have no live consumer before it becomes DEAD
	// (default 300s, 5s to 168h).
	HeartbeatTimeout Duration `json:"heartbeat_timeout,omitempty"`
	// MaxBackfillMessages bounds the group's backfill ranges (the messages from its start to the
	// log end at creation, and what it missed while DEAD): only the newest are kept, the others
	// are counted in spool_backfill_missed_messages_total. 0: 1,000,000 (default); -1: no bound.
	MaxBackfillMessages int64 `json:"max_backfill_messages,omitempty"`
}

// UpdateGroupRequest is the body of PUT /api/v1/topics/{topic}/groups/{group}/config: what to
// change (absent fields keep their values).
type UpdateGroupRequest struct {
	// Start is the new start position, accepted only while the group has delivered nothing
	// (409 INVALID_TRANSITION otherwise).
	Start *storage.StartPosition `json:"start,omitempty"`
	// HeartbeatTimeout is the new heartbeat timeout.
	HeartbeatTimeout Duration `json:"heartbeat_timeout,omitempty"`
}

func (h *Handler) createGroup(w http.ResponseWriter, r *http.Request) error {
	var req CreateGroupRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	if req.Group == "" {
		return invalidf("group is required")
	}
	topic := r.PathValue("topic")
	sub, err := h.b.CreateGroup(r.Context(), broker.CreateGroupParams{
		Topic: topic, Group: req.Group, Start: req.Start, HeartbeatTimeout: time.Duration(req.HeartbeatTimeout),
		MaxBackfillMessages: req.MaxBackfillMessages,
	})
	if err != nil {
		return err
	}
	g, err := h.b.Group(r.Context(), topic, sub.Group)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/v1/topics/"+url.PathEscape(topic)+"/groups/"+url.PathEscape(sub.Group))
	writeJSON(w, http.StatusCreated, groupJSON(g, memberMap(h.b), false))
	return nil
}

func (h *Handler) updateGroup(w http.ResponseWriter, r *http.Request) error {
	var req UpdateGroupRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	topic, group := r.PathValue("topic"), r.PathValue("group")
	if _, err := h.b.UpdateGroup(r.Context(), broker.UpdateGroupParams{
		Topic: topic, Group: group, Start: req.Start, HeartbeatTimeout: time.Duration(req.HeartbeatTimeout),
	}); err != nil {
		return err
	}
	return h.writeGroup(w, r, topic, group)
}

package admin

import (
	"net/http"
	"net/url"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// CreateGroupRequest is the body of POST /api/v1/topics/{topic}/groups: a consumer group created
// ahead of its consumers on a PUB_SUB topic (group, start, heartbeat_timeout,
// max_backfill_messages).
type CreateGroupRequest = api.CreateGroupRequest

// UpdateGroupRequest is the body of PUT /api/v1/topics/{topic}/groups/{group}/config: what to
// change (absent fields keep their values; a new start only while the group delivered nothing).
type UpdateGroupRequest = api.UpdateGroupRequest

func (h *Handler) createGroup(w http.ResponseWriter, r *http.Request) error {
	var req CreateGroupRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	if req.Group == "" {
		return invalidf("group is required")
	}
	var ordered bool
	switch req.Mode {
	case "", "shared":
	case "ordered":
		ordered = true
	default:
		return invalidf("mode %q: want shared or ordered", req.Mode)
	}
	topic := r.PathValue("topic")
	sub, err := h.b.CreateGroup(r.Context(), broker.CreateGroupParams{
		Topic: topic, Group: req.Group, Start: startStorage(req.Start), HeartbeatTimeout: time.Duration(req.HeartbeatTimeout),
		MaxBackfillMessages: req.MaxBackfillMessages,
		Ordered:             ordered, Strategy: req.Strategy, MaxInFlightPerPartition: req.MaxInFlightPerPartition,
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
	var start *storage.StartPosition
	if req.Start != nil {
		sp := startStorage(*req.Start)
		start = &sp
	}
	if _, err := h.b.UpdateGroup(r.Context(), broker.UpdateGroupParams{
		Topic: topic, Group: group, Start: start, HeartbeatTimeout: time.Duration(req.HeartbeatTimeout),
	}); err != nil {
		return err
	}
	return h.writeGroup(w, r, topic, group)
}

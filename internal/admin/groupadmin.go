package admin

import (
	"net/http"
	"time"

	"github.com/spoolmq/spool/internal/broker"
)

// Seed 000's manual admin operations on a group (broker/groupadmin.go): remove, resurrect,
// force-complete. They need the admin permission on the topic.

// ResurrectRequest is the optional body of POST .../groups/{group}/resurrect.
type ResurrectRequest struct {
	// Backfill (seed 000: deliver what the group missed while DEAD) is not built: true is refused
	// with INVALID_ARGUMENT "not implemented yet".
	Backfill bool `json:"backfill,omitempty"`
}

// ForceCompleteRequest is the body of POST .../groups/{group}/force-complete.
type ForceCompleteRequest struct {
	// OlderThan: the group's messages published more than this ago are completed. Required, at
	// least 1s.
	OlderThan Duration `json:"older_than"`
	// Limit is the most messages one call completes or scans (default 100000, at most 1000000);
	// truncated in the answer says to call again.
	Limit int `json:"limit,omitempty"`
}

// ForceCompleteResult is the answer of POST .../groups/{group}/force-complete.
type ForceCompleteResult struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	// Completed counts the messages this call completed for the group (also counted in
	// spool_messages_force_completed_total{topic,group}).
	Completed int `json:"completed"`
	// AlreadyDone counts scanned messages the group had already completed.
	AlreadyDone int `json:"already_done"`
	// Before is the cutoff: messages published before it were completed.
	Before time.Time `json:"before"`
	// Truncated: the call stopped at its limit; call again for the rest.
	Truncated bool `json:"truncated"`
}

// groupAdminRoutes are the routes of this file, appended to routeTable's.
func (h *Handler) groupAdminRoutes() []*route {
	return []*route{
		{method: "DELETE", path: "/api/v1/topics/{topic}/groups/{group}", handle: h.removeGroup, doc: opDoc{
			id: "removeGroup", tag: "groups", summary: "Remove a group: cancel it and delete it at once.",
			desc: "Seed 000's removeConsumerGroup. The subscription is CANCELLED (its consumers are detached, it holds no retention, " +
				"leases on its messages are fenced: a later ack answers already done) and DELETED at once, without waiting subscription_retention. " +
				"Subscribing again creates a new subscription. The queue subscription of a QUEUE topic is refused (409 INVALID_TRANSITION).",
			ok: 204, errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/resurrect", handle: h.resurrectGroup, doc: opDoc{
			id: "resurrectGroup", tag: "groups", summary: "Make a DEAD group ACTIVE again.",
			desc: "Seed 000's resurrectConsumerGroup. Any other state is refused with 409 INVALID_TRANSITION (resume a PAUSED group). " +
				"A consumer subscribing does the same. backfill is not built: true is refused with 400.",
			body: typeOf[ResurrectRequest](), bodyOptional: true, ok: 200, resp: typeOf[Group](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/force-complete", handle: h.forceCompleteGroup, doc: opDoc{
			id: "forceCompleteGroup", tag: "groups", summary: "Complete, for this group, every message published more than older_than ago.",
			desc: "Seed 000's forceCompleteOrphanedMessages for one group: the group's unfinished messages (never delivered, leased, " +
				"waiting for redelivery) published before now - older_than are acked, so retention can remove them. Work a live consumer " +
				"still does on them is lost to the group (its ack answers already done). Dead-lettered messages stay in the DLQ. " +
				"ORDERED groups are refused (not implemented yet).",
			body: typeOf[ForceCompleteRequest](), ok: 200, resp: typeOf[ForceCompleteResult](), errs: errsWrite}},
	}
}

func (h *Handler) removeGroup(w http.ResponseWriter, r *http.Request) error {
	if _, err := h.b.RemoveGroup(r.Context(), r.PathValue("topic"), r.PathValue("group")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) resurrectGroup(w http.ResponseWriter, r *http.Request) error {
	var req ResurrectRequest
	if err := decodeJSON(r, &req, true); err != nil {
		return err
	}
	topic, group := r.PathValue("topic"), r.PathValue("group")
	if _, err := h.b.ResurrectGroup(r.Context(), topic, group, req.Backfill); err != nil {
		return err
	}
	return h.writeGroup(w, r, topic, group)
}

func (h *Handler) forceCompleteGroup(w http.ResponseWriter, r *http.Request) error {
	var req ForceCompleteRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	topic, group := r.PathValue("topic"), r.PathValue("group")
	res, err := h.b.ForceCompleteGroup(r.Context(), broker.ForceCompleteParams{
		Topic: topic, Group: group, OlderThan: time.Duration(req.OlderThan), Limit: req.Limit,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ForceCompleteResult{Topic: topic, Group: group, Completed: res.Completed,
		AlreadyDone: res.AlreadyDone, Before: res.Before, Truncated: res.Truncated})
	return nil
}

package admin

import (
	"net/http"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// Seed 000's manual admin operations on a group (broker/groupadmin.go): remove, resurrect,
// force-complete. They need the admin permission on the topic.

// Bodies and answers of the routes of this file (package client/admin documents the fields).
type (
	// ResurrectRequest is the optional body of POST .../groups/{group}/resurrect.
	ResurrectRequest = api.ResurrectRequest
	// BackfillActionRequest is the optional body of POST .../groups/{group}/backfill/cancel.
	BackfillActionRequest = api.BackfillActionRequest
	// ForceCompleteRequest is the body of POST .../groups/{group}/force-complete.
	ForceCompleteRequest = api.ForceCompleteRequest
	// ForceCompleteResult is the answer of POST .../groups/{group}/force-complete.
	ForceCompleteResult = api.ForceCompleteResult
	// BackfillInfo is a group's backfill (broker.BackfillInfo): GET .../backfill and the
	// answer of cancel and resume.
	BackfillInfo = api.BackfillInfo
	// ForceCompleteTopicResult is the answer of POST /api/v1/topics/{topic}/force-complete.
	ForceCompleteTopicResult = api.ForceCompleteTopicResult
)

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
				"A consumer subscribing does the same, with a bounded backfill. backfill true: the group gets what it missed while DEAD, " +
				"bounded to its newest max_backfill_messages; false: it gives that up (counted) and continues at the log end.",
			body: typeOf[ResurrectRequest](), bodyOptional: true, ok: 200, resp: typeOf[Group](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/force-complete", handle: h.forceCompleteGroup, doc: opDoc{
			id: "forceCompleteGroup", tag: "groups", summary: "Complete, for this group, every message published more than older_than ago.",
			desc: "Seed 000's forceCompleteOrphanedMessages for one group: the group's unfinished messages (never delivered, leased, " +
				"waiting for redelivery) published before now - older_than are acked, so retention can remove them. Work a live consumer " +
				"still does on them is lost to the group (its ack answers already done). Dead-lettered messages stay in the DLQ. " +
				"ORDERED groups are refused (400 INVALID_ARGUMENT): their acks are fenced by partition ownership, which an admin does not hold.",
			body: typeOf[ForceCompleteRequest](), ok: 200, resp: typeOf[ForceCompleteResult](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/force-complete", handle: h.forceCompleteTopic, doc: opDoc{
			id: "forceCompleteTopic", tag: "groups", summary: "Complete, for every group of the topic, every message published more than older_than ago.",
			desc: "Seed 000's forceCompleteOrphanedMessages(topic, olderThan): the group force-complete for every group holding " +
				"messages (ACTIVE, PAUSED and DEAD; not CANCELLED), with one cutoff, counted per group. limit spans the groups; " +
				"groups it left out are listed with skipped and truncated. ORDERED groups are skipped with the reason: their acks " +
				"are fenced by partition ownership.",
			body: typeOf[ForceCompleteRequest](), ok: 200, resp: typeOf[ForceCompleteTopicResult](), errs: errsWrite}},
		{method: "GET", path: "/api/v1/topics/{topic}/groups/{group}/backfill", handle: h.getBackfill, doc: opDoc{
			id: "getBackfill", tag: "groups", summary: "Get a group's backfill: state, processed, total, rate, ETA.",
			desc: "The same object as the backfill field of the group. rate and eta_seconds are measured by this broker instance " +
				"(0 when it has no consumer of the group).",
			ok: 200, resp: typeOf[BackfillInfo](), errs: errsRead}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/backfill/cancel", handle: h.backfillOp(storage.BackfillCancel), doc: opDoc{
			id: "cancelBackfill", tag: "groups", summary: "Stop a group's backfill (CANCELLED).",
			desc: "The rest of the range is held back: in partitions still inside it nothing is delivered until resume. " +
				"skip true gives the rest up at once instead (the group continues after the range; counted). " +
				"409 INVALID_TRANSITION unless the backfill is IN_PROGRESS or FAILED (skip: also CANCELLED).",
			body: typeOf[BackfillActionRequest](), bodyOptional: true, ok: 200, resp: typeOf[BackfillInfo](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/backfill/resume", handle: h.backfillOp(storage.BackfillResume), doc: opDoc{
			id: "resumeBackfill", tag: "groups", summary: "Resume a CANCELLED or FAILED backfill where it stopped.",
			desc: "Delivery continues at the group's ack floors (the checkpoint). 409 INVALID_TRANSITION in any other state.",
			ok:   200, resp: typeOf[BackfillInfo](), errs: errsWrite}},
	}
}

func (h *Handler) getBackfill(w http.ResponseWriter, r *http.Request) error {
	info, err := h.b.GroupBackfill(r.Context(), r.PathValue("topic"), r.PathValue("group"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, backfillJSON(info))
	return nil
}

func (h *Handler) backfillOp(action storage.BackfillAction) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		act := action
		if action == storage.BackfillCancel {
			var req BackfillActionRequest
			if err := decodeJSON(r, &req, true); err != nil {
				return err
			}
			if req.Skip {
				act = storage.BackfillSkip
			}
		}
		info, err := h.b.BackfillAction(r.Context(), r.PathValue("topic"), r.PathValue("group"), act)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, backfillJSON(info))
		return nil
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

func (h *Handler) forceCompleteTopic(w http.ResponseWriter, r *http.Request) error {
	var req ForceCompleteRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	topic := r.PathValue("topic")
	res, err := h.b.ForceCompleteTopic(r.Context(), broker.ForceCompleteTopicParams{
		Topic: topic, OlderThan: time.Duration(req.OlderThan), Limit: req.Limit,
	})
	if err != nil {
		return err
	}
	out := ForceCompleteTopicResult{Topic: topic, Completed: res.Completed, Before: res.Before,
		Truncated: res.Truncated, Groups: make([]api.GroupForceComplete, len(res.Groups))}
	for i, g := range res.Groups {
		out.Groups[i] = api.GroupForceComplete(g)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

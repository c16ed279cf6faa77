package admin

import (
	"net/http"

	api "github.com/spoolmq/spool/client/admin"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// RebalanceRequest is the (optional) body of POST /api/v1/topics/{topic}/groups/{group}/rebalance
// (package client/admin documents the fields).
type RebalanceRequest = api.RebalanceRequest

// rebalanceGroup runs an ordered group's rebalance and answers with the group.
func (h *Handler) rebalanceGroup(w http.ResponseWriter, r *http.Request) error {
	var req RebalanceRequest
	if err := decodeJSON(r, &req, true); err != nil {
		return err
	}
	topic, group := r.PathValue("topic"), r.PathValue("group")
	if _, err := h.b.RebalanceGroup(r.Context(), broker.RebalanceParams{
		Topic: topic, Group: group, Strategy: req.Strategy, DropForeign: req.DropForeign,
	}); err != nil {
		return err
	}
	return h.writeGroup(w, r, topic, group)
}

// orderedJSON fills the mode fields of a group.
func orderedJSON(out *Group, g *broker.GroupInfo) {
	out.Mode = "shared"
	if g.Subscription == nil || g.Subscription.Mode != storage.ModeOrdered {
		return
	}
	s := g.Subscription
	out.Mode = string(storage.ModeOrdered)
	out.Strategy = s.Strategy
	out.MaxInFlightPerPartition = s.MaxInFlightPerPartition
	out.Assignment = map[string][]int32{}
	if a := g.Assignment; a != nil {
		out.Generation = a.Generation
		out.Strategy = a.Strategy
		for m, ps := range a.Members {
			out.Assignment[m] = ps
		}
	}
}

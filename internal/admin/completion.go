package admin

import (
	"net/http"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// MessageCompletion is the completion record of a message of a refcount topic (GET
// /api/v1/topics/{topic}/messages/{id}/completion): the groups it waits or waited for.
type MessageCompletion struct {
	// ID is the message id (the offset, or partition:offset on a topic with several partitions).
	ID          string    `json:"id"`
	Topic       string    `json:"topic"`
	Partition   int32     `json:"partition"`
	Offset      int64     `json:"offset"`
	PublishedAt time.Time `json:"published_at"`
	// Complete: no group is pending and at least one acked or dead-lettered it (a message whose
	// set is empty waits for a group to join, within zero_subscription_retention).
	Complete bool              `json:"complete"`
	Groups   []GroupCompletion `json:"groups"`
}

// GroupCompletion is one group's entry: pending, acked, dead_lettered or removed (it left the
// set while the message was pending for it: DEAD or CANCELLED), with the time of the ack, the
// dead-lettering or the leaving (absent while pending).
type GroupCompletion struct {
	Group          string                  `json:"group"`
	SubscriptionID int64                   `json:"subscription_id"`
	State          storage.CompletionState `json:"state"`
	At             *time.Time              `json:"at,omitempty"`
}

// messageCompletion serves GET /api/v1/topics/{topic}/messages/{id}/completion.
func (h *Handler) messageCompletion(w http.ResponseWriter, r *http.Request) error {
	topic := r.PathValue("topic")
	p, o, err := storage.ParseMessageID(r.PathValue("id"))
	if err != nil {
		return err
	}
	mc, err := h.b.MessageCompletion(r.Context(), topic, p, o)
	if err != nil {
		return err
	}
	out := MessageCompletion{ID: storage.MessageID(h.partitions(r.Context(), topic), p, o), Topic: mc.Topic, Partition: mc.Partition,
		Offset: mc.Offset, PublishedAt: mc.PublishedAt, Complete: mc.Complete, Groups: make([]GroupCompletion, 0, len(mc.Groups))}
	for _, g := range mc.Groups {
		gc := GroupCompletion{Group: g.Group, SubscriptionID: g.SubscriptionID, State: g.State}
		if !g.At.IsZero() {
			at := g.At
			gc.At = &at
		}
		out.Groups = append(out.Groups, gc)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

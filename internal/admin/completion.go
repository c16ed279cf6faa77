package admin

import (
	"net/http"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/storage"
)

// MessageCompletion is the completion record of a message of a refcount topic (GET
// /api/v1/topics/{topic}/messages/{id}/completion): the engine's record (the groups it waits or
// waited for, each pending, acked, dead_lettered or removed, with the time of the ack, the
// dead-lettering or the leaving, absent while pending) and the message id.
type MessageCompletion = api.MessageCompletion

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
	out := MessageCompletion{ID: storage.MessageID(h.partitions(r.Context(), topic), p, o), Topic: mc.Topic,
		Partition: mc.Partition, Offset: mc.Offset, PublishedAt: mc.PublishedAt, Complete: mc.Complete,
		Groups: make([]api.GroupCompletion, 0, len(mc.Groups))} // [], not null
	for _, g := range mc.Groups {
		out.Groups = append(out.Groups, api.GroupCompletion{SubscriptionID: g.SubscriptionID, Group: g.Group,
			State: api.CompletionState(g.State), At: g.At})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

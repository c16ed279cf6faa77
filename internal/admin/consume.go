package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// PullRequest is the body of POST .../pull (all fields optional).
type PullRequest struct {
	// Max is the most messages to return. Defaults to 1; at most Config.PullMaxBatch.
	Max int `json:"max,omitempty"`
	// Wait is how long to wait for a first message when none is ready. Defaults to
	// Config.DefaultPullWait; at most Config.MaxPullWait. A pull that finds nothing waits at least
	// 100 ms, the time the broker gets to claim what is ready.
	Wait *Duration `json:"wait,omitempty"`
	// Start is where the group's subscription starts if this pull creates it (a PUB_SUB topic the
	// group has no subscription on yet). Defaults to FROM_NOW.
	Start *api.StartPosition `json:"start,omitempty"`
	// Filter is a member filter over message headers ("region=eu", grammar in docs/protocol.md
	// section 8.1.1): the pull session of (topic, group, filter) takes only the messages it
	// matches. Nack and extend of its messages name the same filter.
	Filter string `json:"filter,omitempty"`
}

// PulledMessage is a message leased to the HTTP consumer: ack or nack it by id (or partition and
// offset) before lease_deadline, else it is redelivered.
type PulledMessage struct {
	Message
	SubscriptionID int64     `json:"subscription_id"`
	Attempt        int       `json:"attempt"`
	LeaseDeadline  time.Time `json:"lease_deadline"`
}

// PullResult is the response of a pull; messages is empty when none arrived within the wait.
type PullResult struct {
	Messages []PulledMessage `json:"messages"`
}

func (h *Handler) pull(w http.ResponseWriter, r *http.Request) error {
	topic, group := r.PathValue("topic"), r.PathValue("group")
	var req PullRequest
	if err := decodeJSON(r, &req, true); err != nil {
		return err
	}
	cfg := h.pulls.cfg
	n := req.Max
	if n == 0 {
		n = 1
	}
	if n < 0 || n > cfg.maxBatch {
		return invalidf("max must be between 1 and %d, got %d", cfg.maxBatch, req.Max)
	}
	wait := cfg.defWait
	if req.Wait != nil {
		wait = time.Duration(*req.Wait)
	}
	if wait < 0 || wait > cfg.maxWait {
		return invalidf("wait must be between 0s and %s, got %s", cfg.maxWait, wait)
	}
	var start storage.StartPosition
	if req.Start != nil {
		start = startStorage(*req.Start)
	}
	s, err := h.pulls.acquire(r.Context(), topic, group, req.Filter, start, n)
	if err != nil {
		return err
	}
	defer s.release()
	ds, err := s.pull(r.Context(), n, wait)
	if err != nil {
		return err
	}
	out := PullResult{Messages: make([]PulledMessage, len(ds))}
	for i, d := range ds {
		out.Messages[i] = PulledMessage{
			Message: messageJSON(&d.Message, s.parts), SubscriptionID: d.SubscriptionID, Attempt: d.Attempt,
			LeaseDeadline: d.LeaseDeadline,
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// RefsRequest names deliveries: refs ({"partition", "offset"}) and/or ids (message ids, "offset"
// or "partition:offset"), of subscription subscription_id (default: the subscription of the URL's
// topic and group).
type RefsRequest struct {
	SubscriptionID int64                 `json:"subscription_id,omitempty"`
	Refs           []storage.DeliveryRef `json:"refs,omitempty"`
	IDs            []string              `json:"ids,omitempty"`
	// Filter is the filter the messages were pulled with (PullRequest.Filter): nack and extend
	// need the pull session that holds their leases.
	Filter string `json:"filter,omitempty"`
}

func (q *RefsRequest) refs() ([]storage.DeliveryRef, error) {
	refs := append([]storage.DeliveryRef(nil), q.Refs...)
	for _, id := range q.IDs {
		p, o, err := storage.ParseMessageID(id)
		if err != nil {
			return nil, err
		}
		refs = append(refs, storage.DeliveryRef{Partition: p, Offset: o})
	}
	if len(refs) == 0 {
		return nil, invalidf("give refs or ids")
	}
	if q.SubscriptionID < 0 {
		return nil, invalidf("subscription_id must be positive, got %d", q.SubscriptionID)
	}
	return refs, nil
}

// AckResult is the response of ack and nack.
type AckResult struct {
	Acked  *int `json:"acked,omitempty"`
	Nacked *int `json:"nacked,omitempty"`
}

// subscriptionID resolves the subscription of refs: the one the pull session is attached to, or
// the subscription of (topic, group) (for a QUEUE topic pulled with a group name: its queue
// subscription). A subscription id given in the request must be that one: the permission checked
// is the URL's topic and group, so an id of another group's subscription would settle messages
// that group never received. It also returns the subscription's group, the group label of its
// metrics (broker.Member.SubscriptionGroup): "$queue" for a QUEUE topic pulled with a group name.
func (h *Handler) subscriptionID(ctx context.Context, topic, group string, given int64, s *session) (int64, string, error) {
	id, subGroup, err := h.groupSubscriptionID(ctx, topic, group, s)
	if err != nil {
		return 0, "", err
	}
	if given != 0 && given != id {
		return 0, "", invalidf("subscription_id %d is not the subscription of group %q of topic %q (%d): the group was created again since the pull, or the id is another group's",
			given, group, topic, id)
	}
	return id, subGroup, nil
}

func (h *Handler) groupSubscriptionID(ctx context.Context, topic, group string, s *session) (int64, string, error) {
	if s != nil {
		if id, ok := s.subscription(); ok {
			return id, s.member.SubscriptionGroup(id), nil
		}
	}
	g, err := h.b.Group(ctx, topic, group)
	if errors.Is(err, storage.ErrSubscriptionNotFound) && group != storage.QueueGroup {
		info, terr := h.b.Topic(ctx, topic)
		if terr == nil && info.Topic.Config.Semantics == storage.Queue {
			g, err = h.b.Group(ctx, topic, storage.QueueGroup)
		}
	}
	if err != nil {
		return 0, "", err
	}
	return g.Subscription.ID, g.Subscription.Group, nil
}

// ack serves POST .../ack. Any member of a subscription may ack, so this needs no pull session:
// an ack after the session closed (or through another broker instance) works too. Refs that name
// no message make it INVALID_ARGUMENT after the others were acked (as routes.go documents).
func (h *Handler) ack(w http.ResponseWriter, r *http.Request) error {
	topic, group := r.PathValue("topic"), r.PathValue("group")
	var req RefsRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	refs, err := req.refs()
	if err != nil {
		return err
	}
	s, err := h.pulls.existing(sessionKey{topic, group, req.Filter})
	if err != nil && !errors.Is(err, errPullClosed) {
		return err
	}
	memberID := "http"
	if s != nil {
		defer s.release()
		memberID = s.member.ID()
	}
	sub, subGroup, err := h.subscriptionID(r.Context(), topic, group, req.SubscriptionID, s)
	if err != nil {
		return err
	}
	res, err := h.b.AckBatch(r.Context(), sub, memberID, refs)
	if err != nil {
		return err
	}
	if s != nil {
		s.forget(sub, refs)
	}
	// The answer counts every ref that names a message (acks are idempotent); the metric only
	// those this call completed, as over TCP: an ack of a message already done is not counted again.
	n := len(refs) - len(res.Unknown)
	h.metrics.ObserveAck(topic, subGroup, res.Acked)
	if len(res.Unknown) > 0 {
		return invalidf("%d of %d refs name no message (first %d:%d); the others were acked",
			len(res.Unknown), len(refs), res.Unknown[0].Partition, res.Unknown[0].Offset)
	}
	writeJSON(w, http.StatusOK, AckResult{Acked: &n})
	return nil
}

// leaseSession returns the pull session that holds the leases of (topic, group, filter), for nack
// and extend, which need the lease holder.
func (h *Handler) leaseSession(topic, group, filter string) (*session, error) {
	s, err := h.pulls.existing(sessionKey{topic, group, filter})
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, fmt.Errorf("no pull session of group %q on topic %q holds leases (they expired or were released): %w",
			group, topic, storage.ErrLeaseNotHeld)
	}
	return s, nil
}

// leaseHolder returns the pull session holding the leases of (topic, group), with a request
// counted (release it), and the subscription of the refs (see subscriptionID).
func (h *Handler) leaseHolder(ctx context.Context, topic, group, filter string, given int64) (*session, int64, error) {
	s, err := h.leaseSession(topic, group, filter)
	if err != nil {
		return nil, 0, err
	}
	sub, _, err := h.subscriptionID(ctx, topic, group, given, s)
	if err != nil {
		s.release()
		return nil, 0, err
	}
	return s, sub, nil
}

func notHeldErr(op string, notHeld []storage.DeliveryRef, total int) error {
	return fmt.Errorf("%s: %d of %d refs are not held (first %d:%d; expired, settled or never pulled); the others succeeded: %w",
		op, len(notHeld), total, notHeld[0].Partition, notHeld[0].Offset, storage.ErrLeaseNotHeld)
}

// NackRequest is the body of POST .../nack.
type NackRequest struct {
	RefsRequest
	// Delay before the messages are available again (0: at once).
	Delay Duration `json:"delay,omitempty"`
	// ToDLQ dead-letters the messages at once.
	ToDLQ bool `json:"to_dlq,omitempty"`
	// Reason is recorded as the DLQ entry's last error.
	Reason string `json:"reason,omitempty"`
}

func (h *Handler) nack(w http.ResponseWriter, r *http.Request) error {
	topic, group := r.PathValue("topic"), r.PathValue("group")
	var req NackRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	refs, err := req.refs()
	if err != nil {
		return err
	}
	if req.Delay < 0 {
		return invalidf("delay must not be negative, got %s", time.Duration(req.Delay))
	}
	s, sub, err := h.leaseHolder(r.Context(), topic, group, req.Filter, req.SubscriptionID)
	if err != nil {
		return err
	}
	defer s.release()
	res, err := s.member.NackBatch(r.Context(), sub, refs, broker.NackOptions{
		Delay: time.Duration(req.Delay), ToDLQ: req.ToDLQ, Reason: req.Reason,
	})
	if err != nil {
		return err
	}
	// Refs not held are not this session's any more either.
	s.forget(sub, refs)
	n := len(refs) - len(res.NotHeld)
	h.metrics.ObserveNack(topic, s.member.SubscriptionGroup(sub), res.Nacked, res.DeadLettered)
	if len(res.NotHeld) > 0 {
		return notHeldErr("nack", res.NotHeld, len(refs))
	}
	writeJSON(w, http.StatusOK, AckResult{Nacked: &n})
	return nil
}

// refSet returns refs as a set.
func refSet(refs []storage.DeliveryRef) map[storage.DeliveryRef]bool {
	set := make(map[storage.DeliveryRef]bool, len(refs))
	for _, r := range refs {
		set[r] = true
	}
	return set
}

// ExtendRequest is the body of POST .../extend.
type ExtendRequest struct {
	RefsRequest
	// Duration is the new lease from now; 0 means the topic's ack_wait.
	Duration Duration `json:"duration,omitempty"`
}

// ExtendResult is the response of extend.
type ExtendResult struct {
	LeaseDeadline time.Time `json:"lease_deadline"`
}

func (h *Handler) extend(w http.ResponseWriter, r *http.Request) error {
	topic, group := r.PathValue("topic"), r.PathValue("group")
	var req ExtendRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return err
	}
	refs, err := req.refs()
	if err != nil {
		return err
	}
	if err := broker.CheckLeaseDuration("duration", time.Duration(req.Duration)); err != nil {
		return err
	}
	s, sub, err := h.leaseHolder(r.Context(), topic, group, req.Filter, req.SubscriptionID)
	if err != nil {
		return err
	}
	defer s.release()
	res, err := s.member.ExtendBatch(r.Context(), sub, refs, time.Duration(req.Duration))
	if err != nil {
		return err
	}
	notHeld := refSet(res.NotHeld)
	var held []storage.DeliveryRef
	for _, ref := range refs {
		if !notHeld[ref] {
			held = append(held, ref)
		}
	}
	s.setDeadline(sub, held, res.Deadline)
	s.forget(sub, res.NotHeld)
	if len(res.NotHeld) > 0 {
		return notHeldErr("extend", res.NotHeld, len(refs))
	}
	writeJSON(w, http.StatusOK, ExtendResult{LeaseDeadline: res.Deadline})
	return nil
}

package server

import (
	"context"
	"errors"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/errmap"
	"github.com/spoolmq/spool/internal/storage"
)

// Settling the refs of one subscription, shared by the binary Ack and Nack (binary.go) and the
// text mode's ACK and NACK (text.go), which settle a request's subscriptions one at a time alike
// (docs/protocol.md sections 8.4 and 11.4): a gone one's refs are unknown or not held
// (subscriptionGone) and the next subscription is tried; a failure of the subscription's refs
// (STALE_GENERATION, part of a batch) is answered once all of them were tried (settleFailure);
// a failure of the storage itself (storageFailed) stops the request there, and the request is
// answered with it without calling the engine for the subscriptions left.

// ackGroup acks the refs of one group on behalf of member and returns what was done (nil:
// nothing) and why the rest was not, if it failed for another reason than its subscription being
// gone (whose refs it returns as unknown).
func (c *conn) ackGroup(g refGroup, member string) (*storage.DeliveriesAckResult, error) {
	r, err := c.srv.broker.AckBatchGen(c.ctx, g.sub, member, g.gen, g.refs)
	switch {
	case errors.Is(err, storage.ErrStaleGeneration):
		// Ordered groups: the engine refused the whole group; ack the partitions the member
		// still owns and answer STALE_GENERATION (the Go client then acks its refs one by one
		// to learn which were refused).
		return c.ackByPartition(g, member)
	case subscriptionGone(err):
		// Deleted or cancelled meanwhile: its messages are gone for this connection.
		return &storage.DeliveriesAckResult{Unknown: g.refs}, nil
	}
	return r, err
}

// ackByPartition acks the refs of g one partition at a time and returns the sum and the failure
// of the partitions that were not acked (settleFailure), storage.ErrStaleGeneration for one the
// member lost.
func (c *conn) ackByPartition(g refGroup, member string) (*storage.DeliveriesAckResult, error) {
	sum := &storage.DeliveriesAckResult{}
	var failed error
	byPart := map[int32][]storage.DeliveryRef{}
	var order []int32
	for _, r := range g.refs {
		if _, ok := byPart[r.Partition]; !ok {
			order = append(order, r.Partition)
		}
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	for _, p := range order {
		r, err := c.srv.broker.AckBatchGen(c.ctx, g.sub, member, g.gen, byPart[p])
		switch {
		case subscriptionGone(err):
			sum.Unknown = append(sum.Unknown, byPart[p]...)
		case storageFailed(err):
			return sum, settleFailure(failed, err) // the other partitions would wait on it too
		case err != nil:
			failed = settleFailure(failed, err)
		default:
			sum.Acked += r.Acked
			sum.AlreadyDone += r.AlreadyDone
			sum.Unknown = append(sum.Unknown, r.Unknown...)
		}
	}
	return sum, failed
}

// nackGroup nacks the refs of one group through the handles hs attached to its subscription
// (eachHolder: a gone subscription's refs, and those no handle held, are not held) and returns
// the messages nacked and dead-lettered, also those of handles tried before a failure, and the
// refs not held, or the failure.
func (c *conn) nackGroup(hs []*handle, g refGroup, opts broker.NackOptions) (nacked, dead int, notHeld []storage.DeliveryRef, err error) {
	notHeld, err = c.eachHolder(hs, g.refs, func(h *handle, refs []storage.DeliveryRef) ([]storage.DeliveryRef, error) {
		r, err := h.member.NackBatchGen(c.ctx, g.sub, g.gen, refs, opts)
		if err != nil {
			return nil, err
		}
		c.observeNack(g.sub, r.Nacked, r.DeadLettered)
		nacked += r.Nacked
		dead += r.DeadLettered
		return r.NotHeld, nil
	})
	return nacked, dead, notHeld, err
}

// subscriptionGone reports whether err says that a subscription is gone for good: deleted (with
// its topic or alone) or cancelled, by this broker or another instance on the same database. Its
// deliveries name nothing that can be acked, nacked or extended any more: an Ack lists their refs
// unknown, a Nack or Extend not held.
func subscriptionGone(err error) bool {
	return errors.Is(err, storage.ErrSubscriptionNotFound) || errors.Is(err, storage.ErrSubscriptionNotActive) ||
		errors.Is(err, storage.ErrTopicNotFound)
}

// storageFailed reports whether err, a subscription's settle failure, is a failure of the storage
// itself rather than of the subscription's refs: unavailable, full, or a call that gave up waiting
// for it (TIMEOUT). The engine's calls for the request's other subscriptions would fail alike, each
// only after waiting as long (a database that stopped answering: Config.TxTimeout each), so an
// Ack, Nack or Extend stops at the first one and answers it (settleFailure) without making them.
func storageFailed(err error) bool {
	return errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrFull) || errors.Is(err, context.DeadlineExceeded)
}

// settleFailure returns the error an Ack, Nack or Extend answers when its groups failed with prev
// (nil: none so far) and err (nil: this group did not fail): the first retryable one, so that the
// client may send the request again, else the first. Every group was tried, unless a storage
// failure (storageFailed, retryable) stopped the request: that one is then answered, unless a
// retryable failure came before it.
func settleFailure(prev, err error) error {
	switch {
	case err == nil:
		return prev
	case prev == nil:
		return err
	case !errmap.ErrorFrom(prev).Retryable && errmap.ErrorFrom(err).Retryable:
		return err
	}
	return prev
}

package client

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Delivery is one message leased to this consumer. The exported fields are read-only data; the
// methods settle the delivery or extend its lease, and are safe for concurrent use.
type Delivery struct {
	// Topic is the message's topic (a pattern subscription receives several).
	Topic string
	// Partition and Offset identify the message inside its topic.
	Partition int32
	Offset    int64
	// Partitions is the topic's partition count when the message was delivered (0 if the broker
	// did not know it), which decides the form of MessageID.
	Partitions int
	// Attempt is 1 for the first delivery and grows with every redelivery.
	Attempt int
	// PublishTime is when the message was appended (broker clock).
	PublishTime time.Time
	// LeaseDeadline is when the lease ends (broker clock) unless settled or extended.
	LeaseDeadline time.Time
	// ProducerID is the producer's id of the message, if it had one.
	ProducerID string
	// Key, Headers and Payload are the message's; the delivery owns them (no copy is needed to
	// keep them after the handler returned).
	Key     []byte
	Headers map[string]string
	Payload []byte
	// SubscriptionID is the broker's id of the subscription the message is leased in.
	SubscriptionID int64
	// BatchLen is 0, or the size of the per-key batch the delivery belongs to (SubscribeBatch):
	// the BatchLen consecutive offsets of the partition from BatchOffset.
	BatchLen    int
	BatchOffset int64

	sub     *Subscription
	cn      *conn
	ref     protocol.Ref
	settled atomic.Bool
	// batch is set on the first delivery of a per-key batch queued for a BatchHandler: the
	// whole batch (batch.go).
	batch []*Delivery
}

func newDelivery(s *Subscription, cn *conn, pd *protocol.Delivery) *Delivery {
	return &Delivery{
		Topic:          pd.Topic,
		Partition:      pd.Partition,
		Offset:         pd.Offset,
		Partitions:     int(pd.Partitions),
		Attempt:        int(pd.Attempt),
		PublishTime:    pd.PublishTime,
		LeaseDeadline:  pd.LeaseDeadline,
		ProducerID:     pd.ProducerID,
		Key:            pd.Key,
		Headers:        pd.Headers,
		Payload:        pd.Payload,
		SubscriptionID: pd.SubscriptionID,
		BatchLen:       int(pd.BatchLen),
		BatchOffset:    pd.BatchOffset,
		sub:            s,
		cn:             cn,
		ref:            pd.Ref(),
	}
}

// partOfBatch refuses to settle one delivery of a per-key batch of several (SubscribeBatch): the
// broker refuses a part of a batch, and would refuse with it the whole Ack frame this ack shares
// with the coalesced acks of other subscriptions. The batch is settled by the handler's return.
func (d *Delivery) partOfBatch(op string) error {
	if d.BatchLen > 1 && d.sub != nil && d.sub.batchHandler != nil {
		return fmt.Errorf("client: %s %s/%s: %w: one delivery of a batch of %d; the batch handler's return settles the batch",
			op, d.Topic, d.MessageID(), protocol.ErrInvalidArgument, d.BatchLen)
	}
	return nil
}

// MessageID returns the message id users see everywhere (see Position.MessageID): the offset on a
// one-partition topic, "partition:offset" otherwise.
func (d *Delivery) MessageID() string {
	return protocol.WireMessageID(uint32(max(d.Partitions, 0)), d.Partition, d.Offset)
}

// Ack completes the delivery for its subscription and waits for the broker's answer (the ack is
// then durable). It shares its Ack frame with the acks queued at the same moment. It fails with
// ErrAlreadySettled after an earlier Ack or Nack, ErrConnectionLost when the delivery's connection
// broke (the broker redelivers the message), ErrUnknownMessage when the broker no longer knows the
// subscription, or ctx's error (the ack may still be applied). Use it with ManualAck; without, a
// handler may still call it and its return value then only matters for the hook. On a delivery
// of a batch of several (SubscribeBatch) it fails with an error wrapping
// protocol.ErrInvalidArgument and sends nothing, and so does Nack.
func (d *Delivery) Ack(ctx context.Context) error {
	if err := d.partOfBatch("ack"); err != nil {
		return err
	}
	if !d.settled.CompareAndSwap(false, true) {
		return ErrAlreadySettled
	}
	ch := make(chan error, 1)
	d.cn.ack(d.ref, func(err error) { ch <- err }, true)
	select {
	case err := <-ch:
		if err != nil {
			return fmt.Errorf("client: ack %s/%s: %w", d.Topic, d.MessageID(), err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Nack gives the delivery back for redelivery and waits for the broker's answer. reason (may be
// nil) is recorded as the last error; wrap it with ToDLQ to dead-letter the message, or with
// NackWithDelay to choose the delay (default: the subscription's NackDelay). It fails with
// ErrAlreadySettled, ErrConnectionLost (the broker redelivers anyway), an error wrapping
// protocol.ErrLeaseNotHeld when the lease had expired or moved to another member, or ctx's error.
func (d *Delivery) Nack(ctx context.Context, reason error) error {
	if err := d.partOfBatch("nack"); err != nil {
		return err
	}
	if !d.settled.CompareAndSwap(false, true) {
		return ErrAlreadySettled
	}
	resp, err := d.cn.roundTrip(ctx, d.sub.nackRequest(d, reason), false)
	if err != nil {
		return fmt.Errorf("client: nack %s/%s: %w", d.Topic, d.MessageID(), err)
	}
	if ok, isOK := resp.(*protocol.NackOK); isOK && len(ok.NotHeld) > 0 {
		return fmt.Errorf("client: nack %s/%s: %w", d.Topic, d.MessageID(), protocol.ErrLeaseNotHeld)
	}
	return nil
}

// Extend pushes the lease deadline to dur from now on the broker's clock (0: the topic's
// ack_wait), for work that takes longer than the lease, and returns the new deadline. Call it
// before LeaseDeadline; the field itself is not updated. It fails with an error wrapping
// protocol.ErrLeaseNotHeld when the lease was already lost (the message may be given, or already
// was given, to another member), ErrAlreadySettled, ErrConnectionLost, or ctx's error.
func (d *Delivery) Extend(ctx context.Context, dur time.Duration) (time.Time, error) {
	if d.settled.Load() {
		return time.Time{}, ErrAlreadySettled
	}
	if dur < 0 || dur > protocol.MaxDuration {
		return time.Time{}, fmt.Errorf("client: extend: %w: duration %v out of range", protocol.ErrInvalidArgument, dur)
	}
	resp, err := d.cn.roundTrip(ctx, &protocol.Extend{Duration: dur, Refs: []protocol.Ref{d.ref}}, false)
	if err != nil {
		return time.Time{}, fmt.Errorf("client: extend %s/%s: %w", d.Topic, d.MessageID(), err)
	}
	ok, isOK := resp.(*protocol.ExtendOK)
	if !isOK {
		return time.Time{}, fmt.Errorf("client: extend: %w: unexpected answer %T", protocol.ErrMalformedFrame, resp)
	}
	if len(ok.NotHeld) > 0 || ok.Extended == 0 {
		return time.Time{}, fmt.Errorf("client: extend %s/%s: %w", d.Topic, d.MessageID(), protocol.ErrLeaseNotHeld)
	}
	return ok.Deadline, nil
}

package server

import (
	"fmt"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// startPosition converts a wire start position to the engine's. Bad input returns an error
// wrapping storage.ErrInvalidArgument.
func startPosition(p protocol.StartPosition) (storage.StartPosition, error) {
	switch p.Kind {
	case protocol.StartFromNow:
		return storage.StartPosition{Kind: storage.FromNow}, nil
	case protocol.StartFromBeginning:
		return storage.StartPosition{Kind: storage.FromBeginning}, nil
	case protocol.StartFromTimestamp:
		if p.Time.IsZero() {
			return storage.StartPosition{}, fmt.Errorf("%w: FROM_TIMESTAMP needs a time", storage.ErrInvalidArgument)
		}
		return storage.StartPosition{Kind: storage.FromTimestamp, Time: p.Time}, nil
	case protocol.StartFromMessageID:
		part, off, err := storage.ParseMessageID(p.MessageID)
		if err != nil {
			return storage.StartPosition{}, err
		}
		return storage.StartPosition{Kind: storage.FromMessageID, Partition: part, Offset: off}, nil
	}
	return storage.StartPosition{}, fmt.Errorf("%w: unknown start kind %d", storage.ErrInvalidArgument, p.Kind)
}

// appendMessages converts a Publish batch to the engine's messages. TTLs become expiry times and
// delays (version 6) not-before times on the broker's clock, now being its receipt of the batch
// (BRIEF 2b: the broker's clock, never a client's).
func appendMessages(msgs []protocol.PublishMessage, now time.Time) []storage.AppendMessage {
	return appendMessagesTo(make([]storage.AppendMessage, 0, len(msgs)), msgs, now)
}

// appendMessagesTo appends the engine's messages of a Publish batch to out.
func appendMessagesTo(out []storage.AppendMessage, msgs []protocol.PublishMessage, now time.Time) []storage.AppendMessage {
	for i := range msgs {
		m := &msgs[i]
		a := storage.AppendMessage{
			Partition:  m.Partition,
			Key:        m.Key,
			Headers:    m.Headers,
			Payload:    m.Payload,
			ProducerID: m.ProducerID,
			NotBefore:  m.NotBefore,
		}
		if m.TTL > 0 {
			a.ExpiresAt = now.Add(m.TTL)
		}
		if m.Delay > 0 {
			a.NotBefore = now.Add(m.Delay) // checkDelays refused a NotBefore with it
		}
		out = append(out, a)
	}
	return out
}

// checkDelays refuses a batch with a message that has both an absolute not_before and a relative
// delay (version 6): the two disagree as soon as the clocks do, so neither may win silently. The
// error wraps storage.ErrInvalidArgument.
func checkDelays(msgs []protocol.PublishMessage) error {
	for i := range msgs {
		if msgs[i].Delay > 0 && !msgs[i].NotBefore.IsZero() {
			return fmt.Errorf("%w: message %d has both not_before and delay, send one of them", storage.ErrInvalidArgument, i)
		}
	}
	return nil
}

// positions converts the engine's positions to PublishOK positions.
func positions(ps []storage.MessagePosition) []protocol.Position {
	out := make([]protocol.Position, len(ps))
	for i, p := range ps {
		out[i] = protocol.Position{Partition: p.Partition, Offset: p.Offset, PublishTime: p.PublishedAt, Duplicate: p.Duplicate}
	}
	return out
}

// delivery converts an engine delivery of handle h to a wire delivery.
func delivery(h uint32, d *storage.Delivery) protocol.Delivery {
	return protocol.Delivery{
		Handle:         h,
		SubscriptionID: d.SubscriptionID,
		Topic:          d.Topic,
		Partition:      d.Partition,
		Offset:         d.Offset,
		Generation:     uint32(max(d.Generation, 0)),
		Attempt:        uint32(max(d.Attempt, 0)),
		LeaseDeadline:  d.LeaseDeadline,
		PublishTime:    d.PublishedAt,
		ProducerID:     d.ProducerID,
		Key:            d.Key,
		Headers:        d.Headers,
		Payload:        d.Payload,
		BatchLen:       uint32(max(d.Batch.Len, 0)),
		BatchOffset:    d.Batch.Offset,
	}
}

// refGroup is the refs of one subscription and generation, in request order.
type refGroup struct {
	sub  int64
	gen  int64
	refs []storage.DeliveryRef
}

// refGroupKey identifies a refGroup.
type refGroupKey struct {
	sub int64
	gen uint32
}

// groupRefs splits wire refs by subscription and generation (0 in shared groups; in ordered
// groups the engine fences each group by its generation), keeping the order of first appearance.
func groupRefs(refs []protocol.Ref) []refGroup {
	var groups []refGroup
	idx := make(map[refGroupKey]int)
	for _, r := range refs {
		k := refGroupKey{r.SubscriptionID, r.Generation}
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, refGroup{sub: r.SubscriptionID, gen: int64(r.Generation)})
		}
		groups[i].refs = append(groups[i].refs, storage.DeliveryRef{Partition: r.Partition, Offset: r.Offset})
	}
	return groups
}

// checkRefs refuses refs that can name no message (a negative partition or offset) before any ref
// of an Ack, Nack or Extend is settled: INVALID_ARGUMENT then changed nothing, also for the
// request's other subscriptions.
func checkRefs(refs []protocol.Ref) *protocol.Error {
	for _, r := range refs {
		if r.Partition < 0 || r.Offset < 0 {
			return protocol.ErrInvalidArgument.Errorf("ref %d:%d of subscription %d: partition and offset must not be negative",
				r.Partition, r.Offset, r.SubscriptionID)
		}
	}
	return nil
}

// wireRefs converts refs of subscription sub back to wire refs.
func wireRefs(dst []protocol.Ref, sub int64, refs []storage.DeliveryRef) []protocol.Ref {
	for _, r := range refs {
		dst = append(dst, protocol.Ref{SubscriptionID: sub, Partition: r.Partition, Offset: r.Offset})
	}
	return dst
}

package protocol

import (
	"fmt"
	"time"
)

// Deliver is a server push (correlation id 0) with a batch of deliveries, possibly for several
// handles. The server never leaves more unsettled deliveries on a handle than its credit, and keeps
// each Deliver frame within the max frame size.
//
//	count u32 | count × Delivery
type Deliver struct {
	Deliveries []Delivery
}

// Delivery is one message leased to a member.
//
//	handle u32 | subscription_id i64 | topic string | partitions u32 | partition i32 | offset i64 |
//	generation u32 | attempt u32 | lease_deadline time | publish_time time |
//	producer_id string | key bytes | headers headers | payload bytes |
//	batch_len u32 (version 4 and later) | batch_offset i64 (when batch_len > 0)
type Delivery struct {
	// Handle is the handle (SubscribeOK.Handle) the delivery counts against.
	Handle uint32
	// SubscriptionID is the subscription the message is leased in; Ack, Nack and Extend name it.
	SubscriptionID int64
	// Topic is the message's topic (a pattern handle receives several topics).
	Topic string
	// Partitions is the topic's partition count, for the message's user-facing id
	// FormatMessageID(Partitions, Partition, Offset); 0 means unknown (show "partition:offset").
	Partitions uint32
	// Partition and Offset identify the message inside the topic.
	Partition int32
	Offset    int64
	// Generation is 0 in shared groups; in ordered groups the partition's owner generation, to
	// copy into the Ref of an ack.
	Generation uint32
	// Attempt is 1 for the first delivery and grows by one with every redelivery.
	Attempt uint32
	// LeaseDeadline is when the lease ends (broker clock): unless acked, nacked or extended by
	// then, the message is redelivered after a backoff, or dead-lettered after max_deliveries.
	LeaseDeadline time.Time
	// PublishTime is the broker's clock when the message was appended.
	PublishTime time.Time
	// ProducerID is the producer's id of the message (PublishMessage.ProducerID), if any.
	ProducerID string
	Key        []byte
	Headers    map[string]string
	Payload    []byte
	// BatchLen (protocol version 4) is 0, or the number of messages of the per-key batch the
	// delivery belongs to (a handle subscribed with Subscribe.BatchSize): the batch is the
	// BatchLen consecutive offsets of the partition from BatchOffset, delivered in offset order
	// (possibly over several Deliver frames), and acked or nacked as a unit. At most MaxBatchLen;
	// BatchOffset <= Offset < BatchOffset + BatchLen.
	BatchLen    uint32
	BatchOffset int64
}

// Minimum encoded size of a Delivery.
const sizeDelivery = 4 + 8 + 4 + 4 + 4 + 8 + 4 + 4 + 8 + 8 + 4 + 4 + 4 + 4

// DeliverOverhead is the size of a Deliver frame without its deliveries: the frame header and the
// count.
const DeliverOverhead = HeaderSize + 4

// EncodedLen returns the size of d's encoding, to fill a Deliver frame up to the max frame size:
// a frame holds deliveries whose EncodedLen add up to at most max frame size - DeliverOverhead.
// The size is that of MaxVersion's layout, at least that of earlier versions.
func (d *Delivery) EncodedLen() int {
	n := sizeDelivery + 4 + len(d.Topic) + len(d.ProducerID) + len(d.Key) + headersLen(d.Headers) + len(d.Payload)
	if d.BatchLen > 0 {
		n += 8
	}
	return n
}

// batchErr describes what is wrong with a delivery's batch fields ("" if nothing).
func (d *Delivery) batchErr() string {
	switch {
	case d.BatchLen == 0 && d.BatchOffset != 0:
		return fmt.Sprintf("batch_offset %d without a batch", d.BatchOffset)
	case d.BatchLen == 0:
		return ""
	case d.BatchLen > MaxBatchLen:
		return fmt.Sprintf("batch_len %d exceeds the protocol limit of %d", d.BatchLen, MaxBatchLen)
	case d.BatchOffset < 0 || d.BatchOffset > d.Offset || d.Offset-d.BatchOffset >= int64(d.BatchLen):
		return fmt.Sprintf("offset %d is not in the batch of %d from offset %d", d.Offset, d.BatchLen, d.BatchOffset)
	}
	return ""
}

// Ref returns the reference to ack, nack or extend this delivery.
func (d *Delivery) Ref() Ref {
	return Ref{SubscriptionID: d.SubscriptionID, Partition: d.Partition, Offset: d.Offset, Generation: d.Generation}
}

// Opcode returns OpDeliver.
func (*Deliver) Opcode() Opcode { return OpDeliver }

// FromServer marks Deliver as a server message.
func (*Deliver) FromServer() {}

// Encode appends the body to dst (MaxVersion's layout).
func (m *Deliver) Encode(dst []byte) ([]byte, error) { return m.encodeVersion(dst, MaxVersion) }

// Decode replaces m with the body in src (MaxVersion's layout).
func (m *Deliver) Decode(src []byte) error { return m.decodeVersion(src, MaxVersion) }

func (m *Deliver) encodeVersion(dst []byte, v uint16) ([]byte, error) {
	e := newEnc(dst, OpDeliver)
	e.batch("deliveries", len(m.Deliveries))
	for i := range m.Deliveries {
		d := &m.Deliveries[i]
		e.u32(d.Handle)
		e.i64(d.SubscriptionID)
		e.str("deliveries.topic", d.Topic)
		e.u32(d.Partitions)
		e.i32(d.Partition)
		e.i64(d.Offset)
		e.u32(d.Generation)
		e.u32(d.Attempt)
		e.time("deliveries.lease_deadline", d.LeaseDeadline)
		e.time("deliveries.publish_time", d.PublishTime)
		e.str("deliveries.producer_id", d.ProducerID)
		e.bytes("deliveries.key", d.Key)
		e.headers("deliveries.headers", d.Headers)
		e.bytes("deliveries.payload", d.Payload)
		switch {
		case d.batchErr() != "":
			e.fail("deliveries.batch_len", "%s", d.batchErr())
		case v >= Version4:
			e.u32(d.BatchLen)
			if d.BatchLen > 0 {
				e.i64(d.BatchOffset)
			}
		case d.BatchLen > 0:
			e.fail("deliveries.batch_len", "batches need protocol version 4, the session speaks %d", v)
		}
	}
	return e.done()
}

func (m *Deliver) decodeVersion(src []byte, v uint16) error {
	d := newDec(src, OpDeliver)
	*m = Deliver{}
	size := sizeDelivery
	if v >= Version4 {
		size += 4
	}
	if n := d.batch("deliveries", size); n > 0 {
		m.Deliveries = make([]Delivery, n)
		for i := range m.Deliveries {
			m.Deliveries[i] = Delivery{
				Handle:         d.u32("deliveries.handle"),
				SubscriptionID: d.i64("deliveries.subscription_id"),
				Topic:          d.str("deliveries.topic"),
				Partitions:     d.u32("deliveries.partitions"),
				Partition:      d.i32("deliveries.partition"),
				Offset:         d.i64("deliveries.offset"),
				Generation:     d.u32("deliveries.generation"),
				Attempt:        d.u32("deliveries.attempt"),
				LeaseDeadline:  d.time("deliveries.lease_deadline"),
				PublishTime:    d.time("deliveries.publish_time"),
				ProducerID:     d.str("deliveries.producer_id"),
				Key:            d.bytes("deliveries.key"),
				Headers:        d.headers("deliveries.headers"),
				Payload:        d.bytes("deliveries.payload"),
			}
			if dv := &m.Deliveries[i]; v >= Version4 {
				at := d.off
				if dv.BatchLen = d.u32("deliveries.batch_len"); dv.BatchLen > 0 {
					dv.BatchOffset = d.i64("deliveries.batch_offset")
				}
				if msg := dv.batchErr(); d.err == nil && msg != "" {
					d.off = at
					d.fail("deliveries.batch_len", "%s", msg)
				}
			}
			if d.err != nil {
				break
			}
		}
	}
	if err := d.finish(); err != nil {
		*m = Deliver{}
		return err
	}
	return nil
}

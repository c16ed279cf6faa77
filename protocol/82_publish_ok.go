package protocol

import "time"

// PublishOK answers a Publish: the topic's partition count and the position of each message, in
// the order of the batch.
//
//	partitions u32 | count u32 | count × Position
type PublishOK struct {
	// Partitions is the topic's partition count, so that a client shows the message id users see
	// everywhere else: FormatMessageID(Partitions, Partition, Offset). 0 means unknown (show
	// "partition:offset").
	Partitions uint32
	Positions  []Position
}

// Position is where a published message was stored.
//
//	partition i32 | offset i64 | publish_time time | duplicate bool
type Position struct {
	Partition int32
	Offset    int64
	// PublishTime is the broker's clock when the message was appended.
	PublishTime time.Time
	// Duplicate reports that the message was dropped as a duplicate of an earlier one with the
	// same ProducerID; the position is the earlier message's.
	Duplicate bool
}

const sizePosition = 4 + 8 + 8 + 1

// Opcode returns OpPublishOK.
func (*PublishOK) Opcode() Opcode { return OpPublishOK }

// FromServer marks PublishOK as a server message.
func (*PublishOK) FromServer() {}

// Encode appends the body to dst.
func (m *PublishOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpPublishOK)
	e.u32(m.Partitions)
	e.batch("positions", len(m.Positions))
	for _, p := range m.Positions {
		e.i32(p.Partition)
		e.i64(p.Offset)
		e.time("positions.publish_time", p.PublishTime)
		e.boolean(p.Duplicate)
	}
	return e.done()
}

// Decode replaces m with the body in src.
func (m *PublishOK) Decode(src []byte) error {
	d := newDec(src, OpPublishOK)
	*m = PublishOK{Partitions: d.u32("partitions")}
	if n := d.batch("positions", sizePosition); n > 0 {
		m.Positions = make([]Position, n)
		for i := range m.Positions {
			m.Positions[i] = Position{
				Partition:   d.i32("positions.partition"),
				Offset:      d.i64("positions.offset"),
				PublishTime: d.time("positions.publish_time"),
				Duplicate:   d.boolean("positions.duplicate"),
			}
		}
	}
	if err := d.finish(); err != nil {
		*m = PublishOK{}
		return err
	}
	return nil
}

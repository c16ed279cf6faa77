package protocol

import "time"

// Nack gives deliveries back. Without ToDLQ each message is available again after Delay (at once
// when 0, preferably to another member of the group); a nack of a message's max_deliveries-th
// delivery dead-letters it. With ToDLQ the messages go straight to the subscription's dead-letter
// queue, with Reason as last error. Only the member holding a lease may nack it: refs it does not
// hold are listed in NackOK.NotHeld.
//
//	delay duration | to_dlq bool | reason string | count u32 | count × Ref
type Nack struct {
	Delay time.Duration
	ToDLQ bool
	// Reason is recorded as the DLQ entry's last error (and logged); may be empty.
	Reason string
	Refs   []Ref
}

// Opcode returns OpNack.
func (*Nack) Opcode() Opcode { return OpNack }

// FromClient marks Nack as a client message.
func (*Nack) FromClient() {}

// Encode appends the body to dst.
func (m *Nack) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpNack)
	e.duration("delay", m.Delay)
	e.boolean(m.ToDLQ)
	e.str("reason", m.Reason)
	e.refs("refs", m.Refs)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Nack) Decode(src []byte) error {
	d := newDec(src, OpNack)
	*m = Nack{
		Delay:  d.duration("delay"),
		ToDLQ:  d.boolean("to_dlq"),
		Reason: d.str("reason"),
		Refs:   d.refs("refs"),
	}
	if err := d.finish(); err != nil {
		*m = Nack{}
		return err
	}
	return nil
}

package protocol

// Ack completes deliveries: each ref's message is done for its subscription and is never
// delivered to it again, also after a broker restart (the ack is durable when AckOK is sent).
// Acks are idempotent and any member of the subscription may send them, also after its lease
// expired. One batch may name several subscriptions of this connection; it is not atomic across
// them, and an Error leaves some acks possibly applied: resending the whole batch is safe.
//
//	count u32 | count × Ref
type Ack struct {
	Refs []Ref
}

// Opcode returns OpAck.
func (*Ack) Opcode() Opcode { return OpAck }

// FromClient marks Ack as a client message.
func (*Ack) FromClient() {}

// Encode appends the body to dst.
func (m *Ack) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpAck)
	e.refs("refs", m.Refs)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Ack) Decode(src []byte) error {
	d := newDec(src, OpAck)
	*m = Ack{Refs: d.refs("refs")}
	if err := d.finish(); err != nil {
		*m = Ack{}
		return err
	}
	return nil
}

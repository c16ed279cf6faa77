package protocol

// Unsubscribe closes a handle: the member leaves its subscriptions (leaving is not cancelling: a
// durable group's subscription stays, an ephemeral one ends). The server stops delivering on the
// handle, releases the leases the member still holds (they are redelivered at once, to another
// member where one exists) and answers UnsubscribeOK. Deliveries of the handle already on the
// wire may still arrive before the UnsubscribeOK; acks for them are still accepted.
//
//	handle u32
type Unsubscribe struct {
	Handle uint32
}

// Opcode returns OpUnsubscribe.
func (*Unsubscribe) Opcode() Opcode { return OpUnsubscribe }

// FromClient marks Unsubscribe as a client message.
func (*Unsubscribe) FromClient() {}

// Encode appends the body to dst.
func (m *Unsubscribe) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpUnsubscribe)
	e.u32(m.Handle)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Unsubscribe) Decode(src []byte) error {
	d := newDec(src, OpUnsubscribe)
	*m = Unsubscribe{Handle: d.u32("handle")}
	if err := d.finish(); err != nil {
		*m = Unsubscribe{}
		return err
	}
	return nil
}

package protocol

// AckOK answers an Ack.
//
//	acked u32 | already_done u32 | count u32 | count × Ref (unknown)
type AckOK struct {
	// Acked counts the messages this Ack completed.
	Acked uint32
	// AlreadyDone counts the messages that were already complete (acked, dead-lettered, or
	// below the ack floor): a duplicate ack, harmless.
	AlreadyDone uint32
	// Unknown lists the refs that name no message: a subscription this connection never joined,
	// a partition that does not exist, an offset above the high-water mark.
	Unknown []Ref
}

// Opcode returns OpAckOK.
func (*AckOK) Opcode() Opcode { return OpAckOK }

// FromServer marks AckOK as a server message.
func (*AckOK) FromServer() {}

// Encode appends the body to dst.
func (m *AckOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpAckOK)
	e.u32(m.Acked)
	e.u32(m.AlreadyDone)
	e.refs("unknown", m.Unknown)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *AckOK) Decode(src []byte) error {
	d := newDec(src, OpAckOK)
	*m = AckOK{Acked: d.u32("acked"), AlreadyDone: d.u32("already_done"), Unknown: d.refs("unknown")}
	if err := d.finish(); err != nil {
		*m = AckOK{}
		return err
	}
	return nil
}

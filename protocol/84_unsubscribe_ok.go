package protocol

// UnsubscribeOK answers an Unsubscribe. After it, no Deliver for the handle arrives.
//
//	released u32
type UnsubscribeOK struct {
	// Released counts the leases the member still held and gave back.
	Released uint32
}

// Opcode returns OpUnsubscribeOK.
func (*UnsubscribeOK) Opcode() Opcode { return OpUnsubscribeOK }

// FromServer marks UnsubscribeOK as a server message.
func (*UnsubscribeOK) FromServer() {}

// Encode appends the body to dst.
func (m *UnsubscribeOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpUnsubscribeOK)
	e.u32(m.Released)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *UnsubscribeOK) Decode(src []byte) error {
	d := newDec(src, OpUnsubscribeOK)
	*m = UnsubscribeOK{Released: d.u32("released")}
	if err := d.finish(); err != nil {
		*m = UnsubscribeOK{}
		return err
	}
	return nil
}

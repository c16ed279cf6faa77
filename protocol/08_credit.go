package protocol

// Credit raises a handle's credit (Subscribe.MaxInFlight) by Additional: the server may then leave
// that many more deliveries unsettled on the handle. Credit has no success response; it may carry
// correlation id 0, and a failure (UNKNOWN_HANDLE, INVALID_ARGUMENT when the total would exceed
// the server's cap) comes back as an Error with the frame's correlation id.
//
//	handle u32 | additional u32
type Credit struct {
	Handle     uint32
	Additional uint32
}

// Opcode returns OpCredit.
func (*Credit) Opcode() Opcode { return OpCredit }

// FromClient marks Credit as a client message.
func (*Credit) FromClient() {}

// Encode appends the body to dst.
func (m *Credit) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpCredit)
	e.u32(m.Handle)
	e.u32(m.Additional)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Credit) Decode(src []byte) error {
	d := newDec(src, OpCredit)
	*m = Credit{Handle: d.u32("handle"), Additional: d.u32("additional")}
	if err := d.finish(); err != nil {
		*m = Credit{}
		return err
	}
	return nil
}

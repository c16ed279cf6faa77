package protocol

import "time"

// ExtendOK answers an Extend.
//
//	deadline time | extended u32 | count u32 | count × Ref (not_held)
type ExtendOK struct {
	// Deadline is the earliest new lease deadline among the extended deliveries (they differ
	// only when Extend.Duration is 0 and the refs span topics with different ack_wait); zero when
	// nothing was extended.
	Deadline time.Time
	// Extended counts the leases extended.
	Extended uint32
	// NotHeld lists the refs whose lease the member does not hold; they were not extended, and
	// the work on them may be given to another member (or already was).
	NotHeld []Ref
}

// Opcode returns OpExtendOK.
func (*ExtendOK) Opcode() Opcode { return OpExtendOK }

// FromServer marks ExtendOK as a server message.
func (*ExtendOK) FromServer() {}

// Encode appends the body to dst.
func (m *ExtendOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpExtendOK)
	e.time("deadline", m.Deadline)
	e.u32(m.Extended)
	e.refs("not_held", m.NotHeld)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *ExtendOK) Decode(src []byte) error {
	d := newDec(src, OpExtendOK)
	*m = ExtendOK{Deadline: d.time("deadline"), Extended: d.u32("extended"), NotHeld: d.refs("not_held")}
	if err := d.finish(); err != nil {
		*m = ExtendOK{}
		return err
	}
	return nil
}

package protocol

import "time"

// Extend pushes the lease deadlines of deliveries the member holds to now + Duration on the
// broker's clock ("in progress"), so that a slow handler keeps its messages.
//
//	duration duration | count u32 | count × Ref
type Extend struct {
	// Duration is the new lease from now; 0 means each topic's ack_wait.
	Duration time.Duration
	Refs     []Ref
}

// Opcode returns OpExtend.
func (*Extend) Opcode() Opcode { return OpExtend }

// FromClient marks Extend as a client message.
func (*Extend) FromClient() {}

// Encode appends the body to dst.
func (m *Extend) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpExtend)
	e.duration("duration", m.Duration)
	e.refs("refs", m.Refs)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Extend) Decode(src []byte) error {
	d := newDec(src, OpExtend)
	*m = Extend{Duration: d.duration("duration"), Refs: d.refs("refs")}
	if err := d.finish(); err != nil {
		*m = Extend{}
		return err
	}
	return nil
}

package protocol

// NackOK answers a Nack.
//
//	nacked u32 | dead_lettered u32 | count u32 | count × Ref (not_held)
type NackOK struct {
	// Nacked counts the messages given back for redelivery.
	Nacked uint32
	// DeadLettered counts the messages that went to the dead-letter queue (ToDLQ, or their
	// max_deliveries-th delivery).
	DeadLettered uint32
	// NotHeld lists the refs whose lease the member does not hold (expired, given to another
	// member, already acked, unknown); nothing was done for them.
	NotHeld []Ref
}

// Opcode returns OpNackOK.
func (*NackOK) Opcode() Opcode { return OpNackOK }

// FromServer marks NackOK as a server message.
func (*NackOK) FromServer() {}

// Encode appends the body to dst.
func (m *NackOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpNackOK)
	e.u32(m.Nacked)
	e.u32(m.DeadLettered)
	e.refs("not_held", m.NotHeld)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *NackOK) Decode(src []byte) error {
	d := newDec(src, OpNackOK)
	*m = NackOK{Nacked: d.u32("nacked"), DeadLettered: d.u32("dead_lettered"), NotHeld: d.refs("not_held")}
	if err := d.finish(); err != nil {
		*m = NackOK{}
		return err
	}
	return nil
}

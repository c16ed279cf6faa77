package protocol

// Goodbye announces a clean close; either side may send it, with a non-zero correlation id.
//
// Sent by a client: the server stops delivering, processes every frame received before the
// Goodbye, releases the leases the connection's members still hold (redelivered at once to other
// members), answers GoodbyeOK and closes the connection. Settle deliveries before saying goodbye.
//
// Sent by a server (shutdown, drain, rebalancing connections): the server sends no more
// deliveries but keeps accepting Ack, Nack and Extend for a grace period (server setting, default
// 5 s). The client settles what it can, answers GoodbyeOK, and reconnects (after a backoff,
// possibly to another instance); the server closes at GoodbyeOK or when the grace period ends.
//
//	code u16 | reason string
type Goodbye struct {
	// Code is 0 for a normal close, otherwise an error code (CLOSED for a server shutting down,
	// SESSION_TIMEOUT, ...).
	Code uint16
	// Reason is a human-readable explanation; may be empty.
	Reason string
}

// Opcode returns OpGoodbye.
func (*Goodbye) Opcode() Opcode { return OpGoodbye }

// FromClient marks Goodbye as a client message.
func (*Goodbye) FromClient() {}

// FromServer marks Goodbye as a server message.
func (*Goodbye) FromServer() {}

// Encode appends the body to dst.
func (m *Goodbye) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpGoodbye)
	e.u16(m.Code)
	e.str("reason", m.Reason)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Goodbye) Decode(src []byte) error {
	d := newDec(src, OpGoodbye)
	*m = Goodbye{Code: d.u16("code"), Reason: d.str("reason")}
	if err := d.finish(); err != nil {
		*m = Goodbye{}
		return err
	}
	return nil
}

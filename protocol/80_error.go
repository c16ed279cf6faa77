package protocol

// The Error frame (opcode 0x80) carries an *Error (errors.go). It answers a failed request with
// the request's correlation id, or reports a connection-level problem with correlation id 0 just
// before the server closes the connection. Its layout is the same in every protocol version:
//
//	code u16 | retryable bool | retry_after duration | message string
//
// Name is not on the wire: Decode fills it from the table (empty for an unknown code).

// Opcode returns OpError.
func (*Error) Opcode() Opcode { return OpError }

// FromServer marks Error as a server message.
func (*Error) FromServer() {}

// Encode appends the body to dst.
func (m *Error) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpError)
	e.u16(m.Code)
	e.boolean(m.Retryable)
	e.duration("retry_after", m.RetryAfter)
	e.str("message", m.Message)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Error) Decode(src []byte) error {
	d := newDec(src, OpError)
	*m = Error{
		Code:       d.u16("code"),
		Retryable:  d.boolean("retryable"),
		RetryAfter: d.duration("retry_after"),
		Message:    d.str("message"),
	}
	if err := d.finish(); err != nil {
		*m = Error{}
		return err
	}
	if t, ok := errorsByCode[m.Code]; ok {
		m.Name = t.Name
	}
	return nil
}

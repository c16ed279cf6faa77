package protocol

// SubscriptionEnded is a server push (correlation id 0): the server stopped delivering a
// subscription on a handle, or closed the handle, for a reason other than the client's
// Unsubscribe: an administrator cancelled the group's subscription (SUBSCRIPTION_NOT_ACTIVE), or
// deleted the subscription or its topic (SUBSCRIPTION_NOT_FOUND).
//
// With SubscriptionID 0 the whole handle is closed, as if unsubscribed: the handle's leases were
// released and no Deliver for it follows. With a SubscriptionID, the handle stays open for its
// other subscriptions and for topics that match it later. Leases on the ended subscription are
// gone: acks for them report Unknown or are ignored.
//
//	handle u32 | subscription_id i64 | topic string | code u16 | message string
type SubscriptionEnded struct {
	Handle uint32
	// SubscriptionID is the subscription that ended, or 0 for the whole handle.
	SubscriptionID int64
	// Topic is the topic of SubscriptionID; empty when SubscriptionID is 0.
	Topic string
	// Code is the error code that says why (the error table, section 9 of docs/protocol.md).
	Code uint16
	// Message is a human-readable explanation.
	Message string
}

// Opcode returns OpSubscriptionEnded.
func (*SubscriptionEnded) Opcode() Opcode { return OpSubscriptionEnded }

// FromServer marks SubscriptionEnded as a server message.
func (*SubscriptionEnded) FromServer() {}

// Encode appends the body to dst.
func (m *SubscriptionEnded) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpSubscriptionEnded)
	e.u32(m.Handle)
	e.i64(m.SubscriptionID)
	e.str("topic", m.Topic)
	e.u16(m.Code)
	e.str("message", m.Message)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *SubscriptionEnded) Decode(src []byte) error {
	d := newDec(src, OpSubscriptionEnded)
	*m = SubscriptionEnded{
		Handle:         d.u32("handle"),
		SubscriptionID: d.i64("subscription_id"),
		Topic:          d.str("topic"),
		Code:           d.u16("code"),
		Message:        d.str("message"),
	}
	if err := d.finish(); err != nil {
		*m = SubscriptionEnded{}
		return err
	}
	return nil
}

// Err returns the reason as an *Error of the table.
func (m *SubscriptionEnded) Err() *Error {
	e, _ := ErrorForCode(m.Code)
	e.Message = m.Message
	return e
}

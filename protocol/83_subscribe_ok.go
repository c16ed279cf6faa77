package protocol

// SubscribeOK answers a Subscribe.
//
//	handle u32 | member_id string | count u32 | count × (subscription_id i64 | topic string)
type SubscribeOK struct {
	// Handle names the new handle in Deliver, Credit, Unsubscribe and SubscriptionEnded. It is
	// local to the connection, never 0, and never reused on the connection.
	Handle uint32
	// MemberID is the member's id: Subscribe.MemberID, or the one the server assigned.
	MemberID string
	// Subscriptions lists the subscriptions the member joined now, one per matching topic
	// (empty for a pattern no topic matches yet). Topics created later join silently: their
	// deliveries carry their own subscription id and topic.
	Subscriptions []SubscriptionInfo
}

// SubscriptionInfo names one subscription a member joined.
type SubscriptionInfo struct {
	SubscriptionID int64
	Topic          string
}

const sizeSubscriptionInfo = 8 + sizeString

// Opcode returns OpSubscribeOK.
func (*SubscribeOK) Opcode() Opcode { return OpSubscribeOK }

// FromServer marks SubscribeOK as a server message.
func (*SubscribeOK) FromServer() {}

// Encode appends the body to dst.
func (m *SubscribeOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpSubscribeOK)
	e.u32(m.Handle)
	e.str("member_id", m.MemberID)
	e.length("subscriptions", len(m.Subscriptions))
	for _, s := range m.Subscriptions {
		e.i64(s.SubscriptionID)
		e.str("subscriptions.topic", s.Topic)
	}
	return e.done()
}

// Decode replaces m with the body in src.
func (m *SubscribeOK) Decode(src []byte) error {
	d := newDec(src, OpSubscribeOK)
	*m = SubscribeOK{Handle: d.u32("handle"), MemberID: d.str("member_id")}
	if n := d.count("subscriptions", sizeSubscriptionInfo); n > 0 {
		m.Subscriptions = make([]SubscriptionInfo, n)
		for i := range m.Subscriptions {
			m.Subscriptions[i] = SubscriptionInfo{
				SubscriptionID: d.i64("subscriptions.subscription_id"),
				Topic:          d.str("subscriptions.topic"),
			}
			if d.err != nil {
				break
			}
		}
	}
	if err := d.finish(); err != nil {
		*m = SubscribeOK{}
		return err
	}
	return nil
}

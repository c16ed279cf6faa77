package protocol

import "time"

// Subscribe makes the connection a member of the subscriptions of every topic that matches Topic
// (now, and created later while the handle is open) and opens a handle for them. The server
// answers SubscribeOK, then pushes Deliver frames for the handle, never more unsettled deliveries
// than the handle's credit.
//
//	topic string | group string | member_id string | mode u8 | max_in_flight u32 |
//	lease_duration duration | start StartPosition | filter string (version 3 and later) |
//	batch_size u32 (version 4 and later) | rejoin i64 (version 5 and later)
type Subscribe struct {
	// Topic is a topic name or a wildcard pattern (orders.*.created, orders.#).
	Topic string
	// Group is the consumer group; "" means none: on a QUEUE topic the member shares the topic's
	// one subscription, on a PUB_SUB topic it gets an ephemeral subscription that ends with the
	// handle.
	Group string
	// MemberID identifies this member inside its group (stable across reconnects if the
	// application wants it to be); "" lets the server assign one (SubscribeOK.MemberID).
	MemberID string
	// Mode is GroupShared (default) or GroupOrdered; every member of a group must ask for the
	// mode the group's subscription was created with (SUBSCRIPTION_EXISTS otherwise; a server
	// without ordered groups answers GroupOrdered with INVALID_ARGUMENT).
	Mode GroupMode
	// MaxInFlight is the handle's credit: the most deliveries the server leaves unsettled on this
	// handle at a time (a delivery is settled by Ack, Nack, or its lease deadline passing). 0
	// means the server's default (10); the server may cap it (65536). Credit raises it.
	MaxInFlight uint32
	// LeaseDuration overrides the topic's ack_wait for deliveries to this handle; 0 keeps the
	// topic's (default 30 s).
	LeaseDuration time.Duration
	// Start is where the group's subscription starts if this Subscribe creates it; ignored for a
	// subscription that exists. The zero value is FROM_NOW.
	Start StartPosition
	// Filter (protocol version 3) is a member filter over message headers ("region=eu", see
	// docs/protocol.md): the handle gets only the messages it matches, and a message no member
	// of the group matches is completed for the group. "" matches everything. A server refuses a
	// bad one with INVALID_ARGUMENT. Encoding a Subscribe with a filter for version 2 fails.
	Filter string
	// BatchSize (protocol version 4), when not 0, makes an ordered member (Mode GroupOrdered)
	// take per-key batches of up to BatchSize messages per partition, extended so that the
	// messages of one key written by one publish are never split (Delivery.BatchOffset and
	// BatchLen), acked and nacked as a unit. A server refuses it for a shared member and above
	// 1000 (INVALID_ARGUMENT). Encoding a Subscribe with a batch size for version 2 or 3 fails.
	BatchSize uint32
	// Rejoin (protocol version 5), when not 0, makes the Subscribe a resubscription that only
	// joins: it names the subscription the handle had before a reconnect (SubscribeOK, or the
	// deliveries' SubscriptionID), and Topic must be a topic name. The server then creates
	// nothing: a topic that does not exist is refused with TOPIC_NOT_FOUND (no binding waits for
	// it), and a group whose subscription Rejoin ended meanwhile with SUBSCRIPTION_NOT_ACTIVE
	// (cancelled) or SUBSCRIPTION_NOT_FOUND (deleted, or its topic deleted), instead of making a
	// new subscription of the group. 0 keeps the Subscribe of earlier versions, which creates
	// what is missing. Encoding a Subscribe with Rejoin for version 4 or earlier fails.
	Rejoin int64
}

// Opcode returns OpSubscribe.
func (*Subscribe) Opcode() Opcode { return OpSubscribe }

// FromClient marks Subscribe as a client message.
func (*Subscribe) FromClient() {}

// Encode appends the body to dst (MaxVersion's layout).
func (m *Subscribe) Encode(dst []byte) ([]byte, error) { return m.encodeVersion(dst, MaxVersion) }

// Decode replaces m with the body in src (MaxVersion's layout).
func (m *Subscribe) Decode(src []byte) error { return m.decodeVersion(src, MaxVersion) }

func (m *Subscribe) encodeVersion(dst []byte, v uint16) ([]byte, error) {
	e := newEnc(dst, OpSubscribe)
	e.str("topic", m.Topic)
	e.str("group", m.Group)
	e.str("member_id", m.MemberID)
	if m.Mode > GroupOrdered {
		e.fail("mode", "undefined group mode %d", m.Mode)
	}
	e.u8(uint8(m.Mode))
	e.u32(m.MaxInFlight)
	e.duration("lease_duration", m.LeaseDuration)
	e.start(m.Start)
	switch {
	case v >= Version3:
		e.str("filter", m.Filter)
	case m.Filter != "":
		e.fail("filter", "member filters need protocol version 3, the session speaks %d", v)
	}
	switch {
	case v >= Version4:
		e.u32(m.BatchSize)
	case m.BatchSize != 0:
		e.fail("batch_size", "batches need protocol version 4, the session speaks %d", v)
	}
	switch {
	case v >= Version5:
		e.i64(m.Rejoin)
	case m.Rejoin != 0:
		e.fail("rejoin", "rejoin needs protocol version 5, the session speaks %d", v)
	}
	return e.done()
}

func (m *Subscribe) decodeVersion(src []byte, v uint16) error {
	d := newDec(src, OpSubscribe)
	*m = Subscribe{
		Topic:    d.str("topic"),
		Group:    d.str("group"),
		MemberID: d.str("member_id"),
	}
	at := d.off
	if m.Mode = GroupMode(d.u8("mode")); d.err == nil && m.Mode > GroupOrdered {
		d.off = at
		d.fail("mode", "undefined group mode %d", m.Mode)
	}
	m.MaxInFlight = d.u32("max_in_flight")
	m.LeaseDuration = d.duration("lease_duration")
	m.Start = d.start()
	if v >= Version3 {
		m.Filter = d.str("filter")
	}
	if v >= Version4 {
		m.BatchSize = d.u32("batch_size")
	}
	if v >= Version5 {
		m.Rejoin = d.i64("rejoin")
	}
	if err := d.finish(); err != nil {
		*m = Subscribe{}
		return err
	}
	return nil
}

package protocol

import "time"

// Publish appends a batch of messages to one topic. The server answers PublishOK with one
// position per message, in order, once the batch is durable (as the server's durability setting
// says), or Error. A batch is all or nothing: on Error no message of it was appended, except for
// the codes whose outcome is unknown (INTERNAL, TIMEOUT, CLOSED after the request was read), where
// a retry may duplicate; set ProducerID to let the server drop such duplicates.
//
//	topic string | count u32 | count × PublishMessage
type Publish struct {
	// Topic is the topic name (not a pattern). An unknown topic is created on first publish
	// unless the server disables auto-creation (then TOPIC_NOT_FOUND).
	Topic    string
	Messages []PublishMessage
}

// PublishMessage is one message of a Publish.
//
//	partition i32 | key bytes | headers headers | payload bytes | producer_id string |
//	not_before time | ttl duration | delay duration (version 6 and later)
type PublishMessage struct {
	// Partition is the target partition, or PartitionAuto (-1): hash(key) mod partitions for a
	// keyed message, any partition otherwise.
	Partition int32
	// Key routes the message to a partition and is delivered with it; may be empty.
	Key []byte
	// Headers are delivered with the message.
	Headers map[string]string
	Payload []byte
	// ProducerID is the producer's own id for this message; the server drops a second message
	// with the same ProducerID on the same topic inside its de-duplication window and answers
	// with the first one's position (Position.Duplicate). Empty: no de-duplication.
	ProducerID string
	// NotBefore delays delivery until that time on the broker's clock; zero: deliver at once.
	// An absolute time is only as good as the sender's clock agrees with the broker's: clients
	// delaying by a duration send Delay instead.
	NotBefore time.Time
	// TTL drops the message undelivered once it is older than TTL (counted from its publish
	// time on the broker's clock); 0: never. At most MaxDuration.
	TTL time.Duration
	// Delay (protocol version 6) delays delivery by that long, counted like TTL on the broker's
	// clock from its receipt of the Publish, so that a skewed client clock does not move it;
	// 0: none. At most MaxDuration, rounded up to milliseconds. A message with both Delay and
	// NotBefore is refused by the server (INVALID_ARGUMENT): neither is silently dropped.
	// Encoding a Delay for version 5 or earlier fails; the sender converts it to NotBefore on
	// its own clock, or refuses.
	Delay time.Duration
}

// Minimum encoded sizes of a PublishMessage: version 2 to 5, and version 6 (delay).
const (
	sizePublishMessageV2 = 4 + 4 + 4 + 4 + 4 + 8 + 4
	sizePublishMessage   = sizePublishMessageV2 + 4
)

// EncodedLen returns the size of m's encoding in MaxVersion's layout, to fill a Publish up to a
// frame size (at most 4 bytes more than an older version's).
func (m *PublishMessage) EncodedLen() int {
	return sizePublishMessage + len(m.Key) + headersLen(m.Headers) + len(m.Payload) + len(m.ProducerID)
}

func headersLen(h map[string]string) int {
	n := 0
	for k, v := range h {
		n += sizeHeader + len(k) + len(v)
	}
	return n
}

// Opcode returns OpPublish.
func (*Publish) Opcode() Opcode { return OpPublish }

// FromClient marks Publish as a client message.
func (*Publish) FromClient() {}

// Encode appends the body to dst (MaxVersion's layout).
func (m *Publish) Encode(dst []byte) ([]byte, error) { return m.encodeVersion(dst, MaxVersion) }

// Decode replaces m with the body in src (MaxVersion's layout).
func (m *Publish) Decode(src []byte) error { return m.decodeVersion(src, MaxVersion) }

func (m *Publish) encodeVersion(dst []byte, v uint16) ([]byte, error) {
	e := newEnc(dst, OpPublish)
	e.str("topic", m.Topic)
	e.batch("messages", len(m.Messages))
	for i := range m.Messages {
		p := &m.Messages[i]
		e.i32(p.Partition)
		e.bytes("messages.key", p.Key)
		e.headers("messages.headers", p.Headers)
		e.bytes("messages.payload", p.Payload)
		e.str("messages.producer_id", p.ProducerID)
		e.time("messages.not_before", p.NotBefore)
		e.duration("messages.ttl", p.TTL)
		switch {
		case v >= Version6:
			e.duration("messages.delay", p.Delay)
		case p.Delay != 0:
			e.fail("messages.delay", "a relative delay needs protocol version 6, the session speaks %d", v)
		}
	}
	return e.done()
}

func (m *Publish) decodeVersion(src []byte, v uint16) error {
	d := newDec(src, OpPublish)
	*m = Publish{Topic: d.str("topic")}
	size := sizePublishMessage
	if v < Version6 {
		size = sizePublishMessageV2
	}
	if n := d.batch("messages", size); n > 0 {
		m.Messages = make([]PublishMessage, n)
		for i := range m.Messages {
			m.Messages[i] = PublishMessage{
				Partition:  d.i32("messages.partition"),
				Key:        d.bytes("messages.key"),
				Headers:    d.headers("messages.headers"),
				Payload:    d.bytes("messages.payload"),
				ProducerID: d.str("messages.producer_id"),
				NotBefore:  d.time("messages.not_before"),
				TTL:        d.duration("messages.ttl"),
			}
			if v >= Version6 {
				m.Messages[i].Delay = d.duration("messages.delay")
			}
			if d.err != nil {
				break
			}
		}
	}
	if err := d.finish(); err != nil {
		*m = Publish{}
		return err
	}
	return nil
}

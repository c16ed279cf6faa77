package protocol

import (
	"time"
)

// ts returns the time a decoder produces for n nanoseconds since the epoch.
func ts(n int64) time.Time { return time.Unix(0, n).UTC() }

// sample is one message value with a name for its golden file.
type sample struct {
	name string
	corr uint32
	msg  Message
}

var (
	t1 = ts(1_700_000_000_123_456_789)
	t2 = ts(1_700_000_030_000_000_000)
)

// samples returns one fully populated value of every message type, plus a few variants. Every
// opcode must appear at least once (TestSamplesCoverEveryOpcode).
func samples() []sample {
	refs := []Ref{
		{SubscriptionID: 7, Partition: 0, Offset: 41},
		{SubscriptionID: 7, Partition: 2, Offset: 1 << 40, Generation: 3},
	}
	return []sample{
		{"hello", 1, &Hello{
			MinVersion: 2, MaxVersion: 2, ClientName: "billing-worker-3", Token: "s3cr3t",
			HeartbeatInterval: 10 * time.Second,
			Properties:        map[string]string{"client.library": "spool-go", "client.version": "0.1.0"},
		}},
		{"hello_ok", 1, &HelloOK{
			Version: 2, ServerName: "spool-1", SessionID: "01J9ZQ6M3X", HeartbeatInterval: 10 * time.Second,
			SessionTimeout: 30 * time.Second, MaxFrameSize: DefaultMaxFrameSize, MaxMessageSize: DefaultMaxMessageSize,
			Properties: map[string]string{"server.version": "0.1.0"},
		}},
		{"publish", 2, &Publish{Topic: "orders.created", Messages: []PublishMessage{
			{Partition: PartitionAuto, Key: []byte("customer-42"), Headers: map[string]string{"b": "2", "a": "1", "content-type": "application/json"},
				Payload: []byte(`{"id":1}`), ProducerID: "p-1", NotBefore: t1, TTL: time.Hour},
			{Partition: 3, Payload: []byte("hello-world")},
		}}},
		{"publish_delay", 2, &Publish{Topic: "orders.created", Messages: []PublishMessage{
			{Partition: PartitionAuto, Key: []byte("customer-42"), Payload: []byte(`{"id":1}`), TTL: time.Hour, Delay: 90 * time.Second},
			{Partition: 3, Payload: []byte("hello-world")},
		}}},
		{"publish_ok", 2, &PublishOK{Partitions: 4, Positions: []Position{
			{Partition: 1, Offset: 100, PublishTime: t1},
			{Partition: 3, Offset: 7, PublishTime: t1, Duplicate: true},
		}}},
		{"subscribe", 3, &Subscribe{
			Topic: "orders.*.created", Group: "billing", MemberID: "worker-3", Mode: GroupShared,
			MaxInFlight: 64, LeaseDuration: 45 * time.Second,
			Start: StartPosition{Kind: StartFromTimestamp, Time: t1}, Filter: "region in (eu,us), !test",
		}},
		{"subscribe_message_id", 4, &Subscribe{
			Topic: "orders.#", Group: "audit", Mode: GroupOrdered,
			Start: StartPosition{Kind: StartFromMessageID, MessageID: "2:1041"},
		}},
		{"subscribe_batch", 4, &Subscribe{
			Topic: "orders", Group: "ledger", Mode: GroupOrdered, MaxInFlight: 100, BatchSize: 50,
			Start: StartPosition{Kind: StartFromBeginning},
		}},
		{"subscribe_rejoin", 4, &Subscribe{Topic: "orders", Group: "billing", MaxInFlight: 20, Rejoin: 42}},
		{"subscribe_ok", 3, &SubscribeOK{Handle: 1, MemberID: "worker-3", Subscriptions: []SubscriptionInfo{
			{SubscriptionID: 7, Topic: "orders.eu.created"}, {SubscriptionID: 9, Topic: "orders.us.created"},
		}}},
		{"unsubscribe", 5, &Unsubscribe{Handle: 1}},
		{"unsubscribe_ok", 5, &UnsubscribeOK{Released: 2}},
		{"ack", 6, &Ack{Refs: refs}},
		{"ack_ok", 6, &AckOK{Acked: 1, AlreadyDone: 1, Unknown: []Ref{{SubscriptionID: 99, Partition: 0, Offset: 5}}}},
		{"nack", 7, &Nack{Delay: 1500 * time.Millisecond, ToDLQ: true, Reason: "schema mismatch", Refs: refs}},
		{"nack_ok", 7, &NackOK{Nacked: 0, DeadLettered: 1, NotHeld: refs[1:]}},
		{"extend", 8, &Extend{Duration: time.Minute, Refs: refs}},
		{"extend_ok", 8, &ExtendOK{Deadline: t2, Extended: 1, NotHeld: refs[:1]}},
		{"credit", 0, &Credit{Handle: 1, Additional: 16}},
		{"heartbeat", 9, &Heartbeat{Time: t1}},
		{"heartbeat_ok", 9, &HeartbeatOK{Echo: t1, Time: t2}},
		{"goodbye", 10, &Goodbye{Code: CodeClosed, Reason: "server shutting down"}},
		{"goodbye_ok", 10, &GoodbyeOK{}},
		{"deliver", 0, &Deliver{Deliveries: []Delivery{
			{Handle: 1, SubscriptionID: 7, Topic: "orders.eu.created", Partitions: 1, Partition: 0, Offset: 41, Attempt: 1,
				LeaseDeadline: t2, PublishTime: t1, ProducerID: "p-1", Key: []byte("customer-42"),
				Headers: map[string]string{"content-type": "application/json"}, Payload: []byte(`{"id":1}`)},
			{Handle: 1, SubscriptionID: 9, Topic: "orders.us.created", Partitions: 4, Partition: 2, Offset: 1 << 40, Generation: 3,
				Attempt: 2, LeaseDeadline: t2, PublishTime: t1, Payload: []byte("hello-world")},
			{Handle: 2, SubscriptionID: 11, Topic: "orders", Partitions: 8, Partition: 5, Offset: 1001, Generation: 4,
				Attempt: 1, LeaseDeadline: t2, PublishTime: t1, Key: []byte("account-7"), Payload: []byte("debit"),
				BatchLen: 3, BatchOffset: 1000},
		}}},
		{"subscription_ended", 0, &SubscriptionEnded{Handle: 1, SubscriptionID: 9, Topic: "orders.us.created",
			Code: CodeSubNotFound, Message: "subscription 9 was cancelled"}},
		{"error", 2, ErrTopicNotFound.WithMessage(`topic "orders.created" does not exist`)},
		{"error_retry_after", 2, &Error{Code: CodeOverloaded, Name: "OVERLOADED", Retryable: true, RetryAfter: 250 * time.Millisecond, Message: "too many requests in flight"}},
	}
}

// allMessageTypes returns a zero value of every message type.
func allMessageTypes() []Message {
	return []Message{
		new(Hello), new(HelloOK), new(Publish), new(PublishOK), new(Subscribe), new(SubscribeOK),
		new(Unsubscribe), new(UnsubscribeOK), new(Ack), new(AckOK), new(Nack), new(NackOK),
		new(Extend), new(ExtendOK), new(Credit), new(Heartbeat), new(HeartbeatOK), new(Goodbye),
		new(GoodbyeOK), new(Deliver), new(SubscriptionEnded), new(Error),
	}
}

// newMessage returns a zero message of op, whichever side may receive it.
func newMessage(op Opcode) (Message, error) {
	if m, err := NewClientMessage(op); err == nil {
		return m, nil
	}
	return NewServerMessage(op)
}

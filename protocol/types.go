package protocol

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Value types shared by several messages.

// PartitionAuto in PublishMessage.Partition lets the server choose: hash(key) mod partitions for a
// keyed message, any partition otherwise.
const PartitionAuto int32 = -1

// Ref names one delivered message inside a subscription, for Ack, Nack and Extend.
//
// Wire layout (24 bytes): subscription_id i64 | partition i32 | offset i64 | generation u32.
type Ref struct {
	// SubscriptionID is Delivery.SubscriptionID of the delivery.
	SubscriptionID int64
	Partition      int32
	Offset         int64
	// Generation is Delivery.Generation of the delivery: 0 in shared groups; in ordered groups the
	// partition's owner generation, which fences acks of a member that lost the partition.
	Generation uint32
}

const sizeRef = 8 + 4 + 8 + 4

func (e *enc) ref(r Ref) {
	e.i64(r.SubscriptionID)
	e.i32(r.Partition)
	e.i64(r.Offset)
	e.u32(r.Generation)
}

func (d *dec) ref() Ref {
	return Ref{
		SubscriptionID: d.i64("ref.subscription_id"),
		Partition:      d.i32("ref.partition"),
		Offset:         d.i64("ref.offset"),
		Generation:     d.u32("ref.generation"),
	}
}

func (e *enc) refs(field string, rs []Ref) {
	e.length(field, len(rs))
	for _, r := range rs {
		e.ref(r)
	}
}

func (d *dec) refs(field string) []Ref {
	n := d.count(field, sizeRef)
	if n == 0 {
		return nil
	}
	rs := make([]Ref, n)
	for i := range rs {
		rs[i] = d.ref()
	}
	return rs
}

// StartKind says where a new subscription starts (BRIEF.md section 4). Wire: u8.
type StartKind uint8

// Start kinds. Part of the wire contract: never change a value.
const (
	// StartFromNow starts after the last message published before the subscription was created.
	// The default.
	StartFromNow StartKind = 0
	// StartFromBeginning starts at the first retained message.
	StartFromBeginning StartKind = 1
	// StartFromTimestamp starts at the first message published at or after StartPosition.Time
	// (broker clock).
	StartFromTimestamp StartKind = 2
	// StartFromMessageID starts at StartPosition.MessageID.
	StartFromMessageID StartKind = 3
)

var startKindNames = [...]string{"FROM_NOW", "FROM_BEGINNING", "FROM_TIMESTAMP", "FROM_MESSAGE_ID"}

// String returns FROM_NOW, FROM_BEGINNING, FROM_TIMESTAMP or FROM_MESSAGE_ID.
func (k StartKind) String() string {
	if int(k) < len(startKindNames) {
		return startKindNames[k]
	}
	return "StartKind(" + strconv.Itoa(int(k)) + ")"
}

// ParseStartKind parses a name printed by StartKind.String (case-insensitive).
func ParseStartKind(s string) (StartKind, bool) {
	for i, n := range startKindNames {
		if strings.EqualFold(s, n) {
			return StartKind(i), true
		}
	}
	return 0, false
}

// StartPosition is where a subscription starts when a Subscribe creates it; it is ignored when the
// group's subscription already exists. The zero value is FROM_NOW.
//
// Wire layout: kind u8 | time time | message_id string.
type StartPosition struct {
	Kind StartKind
	// Time is the timestamp of FROM_TIMESTAMP; zero otherwise.
	Time time.Time
	// MessageID is the message id of FROM_MESSAGE_ID, "offset" or "partition:offset" (see
	// FormatMessageID); empty otherwise.
	MessageID string
}

func (e *enc) start(s StartPosition) {
	if s.Kind > StartFromMessageID {
		e.fail("start.kind", "undefined start kind %d", s.Kind)
		return
	}
	e.u8(uint8(s.Kind))
	e.time("start.time", s.Time)
	e.str("start.message_id", s.MessageID)
}

func (d *dec) start() StartPosition {
	at := d.off
	k := StartKind(d.u8("start.kind"))
	if d.err == nil && k > StartFromMessageID {
		d.off = at
		d.fail("start.kind", "undefined start kind %d", k)
	}
	return StartPosition{Kind: k, Time: d.time("start.time"), MessageID: d.str("start.message_id")}
}

// GroupMode says how a consumer group shares its subscription. Wire: u8.
type GroupMode uint8

// Group modes. Part of the wire contract: never change a value.
const (
	// GroupShared: any member gets any message (the default).
	GroupShared GroupMode = 0
	// GroupOrdered: each partition is owned by one member at a time and delivered in offset
	// order; ownership is fenced by a generation (Delivery.Generation, Ref.Generation).
	GroupOrdered GroupMode = 1
)

// String returns SHARED or ORDERED.
func (m GroupMode) String() string {
	switch m {
	case GroupShared:
		return "SHARED"
	case GroupOrdered:
		return "ORDERED"
	}
	return "GroupMode(" + strconv.Itoa(int(m)) + ")"
}

// FormatMessageID formats the message id shown to users (BRIEF.md section 2b): the offset when
// the topic has one partition, "partition:offset" otherwise. The format is storage.MessageID's,
// the one the engines and the admin API use.
func FormatMessageID(partitions int, partition int32, offset int64) string {
	return storage.MessageID(partitions, partition, offset)
}

// WireMessageID is FormatMessageID for the partition count a PublishOK or a Delivery carries, where
// 0 means unknown and gives "partition:offset" (always accepted as a message id).
func WireMessageID(partitions uint32, partition int32, offset int64) string {
	if partitions == 0 {
		return strconv.FormatInt(int64(partition), 10) + ":" + strconv.FormatInt(offset, 10)
	}
	return FormatMessageID(int(partitions), partition, offset)
}

// ParseMessageID parses a message id made by FormatMessageID: "offset" (partition 0) or
// "partition:offset", both non-negative decimal numbers (storage.ParseMessageID), failing with
// ErrInvalidArgument.
func ParseMessageID(id string) (partition int32, offset int64, err error) {
	p, o, err := storage.ParseMessageID(id)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: message id %q: want OFFSET or PARTITION:OFFSET", ErrInvalidArgument, id)
	}
	return p, o, nil
}

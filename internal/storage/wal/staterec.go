package wal

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
)

// State record types: the first byte of every state log record. Part of the on-disk format; never
// change or reuse a value.
const (
	recMarker        byte = 1  // snapshot marker: no payload
	recTopicCreate   byte = 2  // JSON topicCreateRec
	recTopicUpdate   byte = 3  // JSON topicUpdateRec
	recTopicDelete   byte = 4  // JSON topicDeleteRec
	recBindingCreate byte = 5  // JSON storage.Binding
	recBindingDelete byte = 6  // JSON bindingDeleteRec
	recSubCreate     byte = 7  // JSON subRec
	recSubUpdate     byte = 8  // JSON subUpdateRec
	recSubDelete     byte = 9  // JSON subDeleteRec
	recClaim         byte = 10 // binary, see encodeClaim
	recAck           byte = 11 // binary, see encodeAck
	recNack          byte = 12 // binary, see encodeNack
	recDLQ           byte = 13 // binary, see encodeDLQ
	recDLQReplay     byte = 14 // binary, see encodeDLQIDs
	recDLQPurge      byte = 15 // binary, see encodeDLQIDs
	recRetention     byte = 16 // binary, see encodeRetention
	recSubIDs        byte = 17 // binary: uvarint next subscription ID
	recCleanClose    byte = 18 // no payload: Close ended cleanly; the last record of such a log
	recUnclean       byte = 19 // no payload: Open after an unclean shutdown (see applyUnclean)
	recHorizon       byte = 20 // binary, see encodeHorizon
	recFailure       byte = 24 // binary, see encodeFailures (poison rules)
	recRejoin        byte = 26 // binary, see encodeRejoin (refcount topics)
)

// topicCreateRec creates a topic and, atomically, its queue subscription or binding
// subscriptions.
type topicCreateRec struct {
	Topic storage.Topic `json:"topic"`
	Subs  []subRec      `json:"subs,omitempty"`
}

// subRec creates a subscription whose partition i starts (floor and cursor) at Starts[i].
type subRec struct {
	Sub    storage.Subscription `json:"sub"`
	Starts []int64              `json:"starts"`
	// Skips (refcount topics) are, per partition, runs [lo, hi) above the start that the
	// subscription marks done: completed out of order before it joined (not in its set).
	Skips [][][2]int64 `json:"skips,omitempty"`
}

// topicUpdateRec replaces a topic's config. New partitions start at offset 0 for every
// subscription; Renames change subscription groups (QUEUE <-> PUB_SUB); NewSubs are created.
type topicUpdateRec struct {
	Name    string              `json:"name"`
	Config  storage.TopicConfig `json:"config"`
	Renames []subRename         `json:"renames,omitempty"`
	NewSubs []subRec            `json:"new_subs,omitempty"`
	At      time.Time           `json:"at"`
}

type subRename struct {
	ID    int64  `json:"id"`
	Group string `json:"group"`
}

// topicDeleteRec deletes a topic; its subscriptions become DELETED.
type topicDeleteRec struct {
	Name string    `json:"name"`
	At   time.Time `json:"at"`
}

type bindingDeleteRec struct {
	Group   string `json:"group"`
	Pattern string `json:"pattern"`
}

// subUpdateRec changes a subscription's state.
type subUpdateRec struct {
	ID    int64                     `json:"id"`
	State storage.SubscriptionState `json:"state"`
	At    time.Time                 `json:"at"`
	// HeartbeatTimeout, when not zero, is a new heartbeat timeout (SubscriptionConfigure; State is
	// then the current state).
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout,omitempty"`
}

// subDeleteRec deletes a subscription (state DELETED, delivery state dropped).
type subDeleteRec struct {
	ID int64     `json:"id"`
	At time.Time `json:"at"`
}

func encodeJSON(typ byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain structs of strings, numbers and times are marshalled.
		panic(fmt.Sprintf("wal: marshal state record %d: %v", typ, err))
	}
	return append([]byte{typ}, b...)
}

// Claim record items. Part of the on-disk format; never change a value.
const (
	claimDeliver  byte = 1 // (partition, offset) delivered for attempt
	claimReplayed byte = 2 // replayed DLQ copy of (partition, offset) delivered for attempt
	claimDelay    byte = 3 // never-delivered (partition, offset) waits for its NotBefore (due)
	claimComplete byte = 4 // (partition, offset) done without delivery (expired, or gone)
)

type claimItem struct {
	kind      byte
	partition int32
	offset    int64
	n         int64 // attempt (deliver, replayed) or due time (delay)
}

type cursorItem struct {
	partition int32
	cursor    int64
}

// encodeClaim: type | uvarint sub | uvarint n | n x (kind u8, uvarint partition, uvarint offset,
// varint attempt-or-due) | uvarint m | m x (uvarint partition, uvarint cursor).
func encodeClaim(subID int64, items []claimItem, cursors []cursorItem) []byte {
	e := enc{b: make([]byte, 0, 8+len(items)*8+len(cursors)*6)}
	e.u8(recClaim)
	e.uvarint(uint64(subID))
	e.uvarint(uint64(len(items)))
	for _, it := range items {
		e.u8(it.kind)
		e.uvarint(uint64(it.partition))
		e.uvarint(uint64(it.offset))
		e.varint(it.n)
	}
	e.uvarint(uint64(len(cursors)))
	for _, c := range cursors {
		e.uvarint(uint64(c.partition))
		e.uvarint(uint64(c.cursor))
	}
	return e.b
}

func decodeClaim(b []byte) (subID int64, items []claimItem, cursors []cursorItem, err error) {
	d := dec{b: b[1:]}
	subID = int64(d.uvarint())
	items = make([]claimItem, d.count(4))
	for i := range items {
		items[i] = claimItem{kind: d.u8(), partition: int32(d.uvarint()), offset: int64(d.uvarint()), n: d.varint()}
	}
	cursors = make([]cursorItem, d.count(2))
	for i := range cursors {
		cursors[i] = cursorItem{partition: int32(d.uvarint()), cursor: int64(d.uvarint())}
	}
	return subID, items, cursors, d.done("claim record")
}

// encodeSubItems encodes the shape of the records of one subscription's items: type | uvarint
// sub | uvarint n | n x item; itemSize is an estimate of an item's size, for the buffer.
func encodeSubItems[T any](typ byte, subID int64, items []T, itemSize int, item func(*enc, *T)) []byte {
	e := enc{b: make([]byte, 0, 4+len(items)*itemSize)}
	e.u8(typ)
	e.uvarint(uint64(subID))
	e.uvarint(uint64(len(items)))
	for i := range items {
		item(&e, &items[i])
	}
	return e.b
}

// decodeSubItems decodes what encodeSubItems encoded; minSize is an item's smallest encoding
// (it bounds n by the bytes left), what names the record in errors.
func decodeSubItems[T any](b []byte, what string, minSize int, item func(*dec) T) (subID int64, items []T, err error) {
	d := dec{b: b[1:]}
	subID = int64(d.uvarint())
	items = make([]T, d.count(minSize))
	for i := range items {
		items[i] = item(&d)
	}
	return subID, items, d.done(what)
}

// encodeAck: type | uvarint sub | uvarint n | n x (uvarint partition, uvarint offset).
func encodeAck(subID int64, refs []storage.DeliveryRef) []byte {
	return encodeSubItems(recAck, subID, refs, 6, func(e *enc, r *storage.DeliveryRef) {
		e.uvarint(uint64(r.Partition))
		e.uvarint(uint64(r.Offset))
	})
}

func decodeAck(b []byte) (subID int64, refs []storage.DeliveryRef, err error) {
	return decodeSubItems(b, "ack record", 2, func(d *dec) storage.DeliveryRef {
		return storage.DeliveryRef{Partition: int32(d.uvarint()), Offset: int64(d.uvarint())}
	})
}

type nackItem struct {
	partition int32
	offset    int64
	due       int64
	replayed  bool
	givenBack bool // a give-back: the restore undoes the delivery's attempt
}

// encodeNack: type | uvarint sub | uvarint n | n x (uvarint partition, uvarint offset, varint
// due unix ns, u8 flags: bit 0 replayed, bit 1 given back).
func encodeNack(subID int64, items []nackItem) []byte {
	return encodeSubItems(recNack, subID, items, 16, func(e *enc, it *nackItem) {
		e.uvarint(uint64(it.partition))
		e.uvarint(uint64(it.offset))
		e.varint(it.due)
		var flags uint8
		if it.replayed {
			flags |= 1
		}
		if it.givenBack {
			flags |= 2
		}
		e.u8(flags)
	})
}

func decodeNack(b []byte) (subID int64, items []nackItem, err error) {
	return decodeSubItems(b, "nack record", 4, func(d *dec) nackItem {
		it := nackItem{partition: int32(d.uvarint()), offset: int64(d.uvarint()), due: d.varint()}
		flags := d.u8()
		it.replayed, it.givenBack = flags&1 != 0, flags&2 != 0
		return it
	})
}

// flag encodes b as one byte, 1 or 0.
func (e *enc) flag(b bool) {
	if b {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

// encodeDLQ: type | uvarint sub | DLQ entry (see enc.dlqEntry).
func encodeDLQ(subID int64, de *storage.DLQEntry) []byte {
	e := enc{b: make([]byte, 0, 64+len(de.Message.Payload)+len(de.Message.Key))}
	e.u8(recDLQ)
	e.uvarint(uint64(subID))
	e.dlqEntry(de)
	return e.b
}

// dlqEntry: uvarint id | str reason | uvarint attempts | str last error | time dead at | message
// | optional poison tail (enc.dlqPoison), absent before poison rules existed and when empty.
func (e *enc) dlqEntry(de *storage.DLQEntry) {
	e.uvarint(uint64(de.ID))
	e.str(string(de.Reason))
	e.uvarint(uint64(de.Attempts))
	e.str(de.LastError)
	e.time(de.DeadAt)
	e.message(&de.Message)
	e.dlqPoison(de)
}

func (d *dec) dlqEntry(subID int64) *storage.DLQEntry {
	de := &storage.DLQEntry{SubscriptionID: subID}
	de.ID = int64(d.uvarint())
	de.Reason = storage.DLQReason(d.str())
	de.Attempts = int(d.uvarint())
	de.LastError = d.str()
	de.DeadAt = d.time()
	d.message(&de.Message)
	return de
}

// dlqPoison writes a DLQ entry's poison tail when it has one: str rule | uvarint n | n x (str
// member, str reason, time at). It ends a record: records written before it existed simply end
// earlier, so a reader takes it only when bytes remain (dec.dlqPoison).
func (e *enc) dlqPoison(de *storage.DLQEntry) {
	if de.Rule == "" && len(de.Failures) == 0 {
		return
	}
	e.str(string(de.Rule))
	e.uvarint(uint64(len(de.Failures)))
	for _, f := range de.Failures {
		e.str(f.Member)
		e.str(f.Reason)
		e.time(f.At)
	}
}

// dlqPoison reads the poison tail of a DLQ entry at the end of a record, if there is one.
func (d *dec) dlqPoison(de *storage.DLQEntry) {
	if len(d.b) == 0 || d.err != nil {
		return
	}
	de.Rule = storage.PoisonRule(d.str())
	if n := d.count(3); n > 0 {
		de.Failures = make([]storage.DeliveryFailure, n)
		for i := range de.Failures {
			f := &de.Failures[i]
			f.Member = d.str()
			f.Reason = d.str()
			f.At = d.time()
		}
	}
}

func decodeDLQ(b []byte) (subID int64, de *storage.DLQEntry, err error) {
	d := dec{b: b[1:]}
	subID = int64(d.uvarint())
	de = d.dlqEntry(subID)
	d.dlqPoison(de)
	return subID, de, d.done("dlq record")
}

// encodeDLQIDs: type | uvarint sub | varint time unix ns | uvarint n | n x uvarint id. The time
// is the due time of a replay (unused by purge).
func encodeDLQIDs(typ byte, subID int64, at int64, ids []int64) []byte {
	e := enc{b: make([]byte, 0, 16+len(ids)*3)}
	e.u8(typ)
	e.uvarint(uint64(subID))
	e.varint(at)
	e.uvarint(uint64(len(ids)))
	for _, id := range ids {
		e.uvarint(uint64(id))
	}
	return e.b
}

func decodeDLQIDs(b []byte) (subID int64, at int64, ids []int64, err error) {
	d := dec{b: b[1:]}
	subID = int64(d.uvarint())
	at = d.varint()
	ids = make([]int64, d.count(1))
	for i := range ids {
		ids[i] = int64(d.uvarint())
	}
	return subID, at, ids, d.done("dlq ids record")
}

type floorItem struct {
	sub       int64
	partition int32
	floor     int64
}

type dlqExpiry struct {
	sub int64
	ids []int64
}

// encodeRetention: type | uvarint n | n x (uvarint sub, uvarint partition, uvarint floor) |
// uvarint m | m x (uvarint sub, uvarint k, k x uvarint id).
func encodeRetention(floors []floorItem, expired []dlqExpiry) []byte {
	e := enc{}
	e.u8(recRetention)
	e.uvarint(uint64(len(floors)))
	for _, f := range floors {
		e.uvarint(uint64(f.sub))
		e.uvarint(uint64(f.partition))
		e.uvarint(uint64(f.floor))
	}
	e.uvarint(uint64(len(expired)))
	for _, x := range expired {
		e.uvarint(uint64(x.sub))
		e.uvarint(uint64(len(x.ids)))
		for _, id := range x.ids {
			e.uvarint(uint64(id))
		}
	}
	return e.b
}

func decodeRetention(b []byte) (floors []floorItem, expired []dlqExpiry, err error) {
	d := dec{b: b[1:]}
	floors = make([]floorItem, d.count(3))
	for i := range floors {
		floors[i] = floorItem{sub: int64(d.uvarint()), partition: int32(d.uvarint()), floor: int64(d.uvarint())}
	}
	expired = make([]dlqExpiry, d.count(2))
	for i := range expired {
		expired[i].sub = int64(d.uvarint())
		expired[i].ids = make([]int64, d.count(1))
		for j := range expired[i].ids {
			expired[i].ids[j] = int64(d.uvarint())
		}
	}
	return floors, expired, d.done("retention record")
}

type horizonItem struct {
	partition int32
	horizon   int64
}

// encodeHorizon: type | uvarint sub | uvarint n | n x (uvarint partition, uvarint horizon).
func encodeHorizon(subID int64, items []horizonItem) []byte {
	return encodeSubItems(recHorizon, subID, items, 6, func(e *enc, it *horizonItem) {
		e.uvarint(uint64(it.partition))
		e.uvarint(uint64(it.horizon))
	})
}

func decodeHorizon(b []byte) (subID int64, items []horizonItem, err error) {
	return decodeSubItems(b, "horizon record", 2, func(d *dec) horizonItem {
		return horizonItem{partition: int32(d.uvarint()), horizon: int64(d.uvarint())}
	})
}

func encodeSubIDs(next int64) []byte {
	e := enc{}
	e.u8(recSubIDs)
	e.uvarint(uint64(next))
	return e.b
}

func decodeSubIDs(b []byte) (int64, error) {
	d := dec{b: b[1:]}
	n := int64(d.uvarint())
	return n, d.done("subscription ids record")
}

// encodeRejoin: type | uvarint sub | varint left at (unix ns) | uvarint n | n x (uvarint
// partition, uvarint floor, uvarint k, k x (uvarint lo, uvarint hi)): a subscription of a
// refcount topic back from DEAD skips the messages completed while it was away (rejoinLocked):
// its floors move up, the runs [lo, hi) above them are marked done, and the offsets passed that it
// had not completed are recorded as removed at the time it left.
func encodeRejoin(subID int64, leftAt int64, items []rejoinItem) []byte {
	e := enc{b: make([]byte, 0, 12+len(items)*8)}
	e.u8(recRejoin)
	e.uvarint(uint64(subID))
	e.varint(leftAt)
	e.uvarint(uint64(len(items)))
	for _, it := range items {
		e.uvarint(uint64(it.partition))
		e.uvarint(uint64(it.floor))
		e.uvarint(uint64(len(it.skips)))
		for _, r := range it.skips {
			e.uvarint(uint64(r[0]))
			e.uvarint(uint64(r[1]))
		}
	}
	return e.b
}

func decodeRejoin(b []byte) (subID int64, leftAt int64, items []rejoinItem, err error) {
	d := dec{b: b[1:]}
	subID = int64(d.uvarint())
	leftAt = d.varint()
	items = make([]rejoinItem, d.count(3))
	for i := range items {
		items[i] = rejoinItem{partition: int32(d.uvarint()), floor: int64(d.uvarint())}
		items[i].skips = make([][2]int64, d.count(2))
		for j := range items[i].skips {
			lo := int64(d.uvarint())
			hi := int64(d.uvarint())
			if hi < lo || hi-lo > substate.MaxDoneSpan {
				return 0, 0, nil, fmt.Errorf("rejoin record: run [%d, %d) out of range", lo, hi)
			}
			items[i].skips[j] = [2]int64{lo, hi}
		}
	}
	return subID, leftAt, items, d.done("rejoin record")
}

package wal

import (
	"encoding/binary"
	"hash/crc32"
	"reflect"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func TestStateRecordRoundTrip(t *testing.T) {
	t.Parallel()
	items := []claimItem{{claimDeliver, 0, 5, 1}, {claimReplayed, 3, 1 << 40, 7}, {claimDelay, 1, 6, 1234567890123}, {claimComplete, 0, 7, 0}}
	cursors := []cursorItem{{0, 8}, {1, 7}}
	id, gi, gc, err := decodeClaim(encodeClaim(42, items, cursors))
	if err != nil || id != 42 || !reflect.DeepEqual(gi, items) || !reflect.DeepEqual(gc, cursors) {
		t.Fatalf("claim: %v %d %v %v", err, id, gi, gc)
	}
	refs := []storage.DeliveryRef{{Partition: 0, Offset: 0}, {Partition: 4095, Offset: 1 << 50}}
	id, gr, err := decodeAck(encodeAck(7, refs))
	if err != nil || id != 7 || !reflect.DeepEqual(gr, refs) {
		t.Fatalf("ack: %v %d %v", err, id, gr)
	}
	nacks := []nackItem{{1, 2, -5, true, false}, {0, 9, 1 << 60, false, true}, {3, 4, 0, true, true}}
	id, gn, err := decodeNack(encodeNack(9, nacks))
	if err != nil || id != 9 || !reflect.DeepEqual(gn, nacks) {
		t.Fatalf("nack: %v %d %v", err, id, gn)
	}
	de := &storage.DLQEntry{
		ID: 3, SubscriptionID: 11, Reason: storage.DLQRejected, Attempts: 4, LastError: "boom",
		DeadAt: time.Unix(0, 1700000000123456789).UTC(),
		Message: storage.Message{
			Topic: "a.b", Partition: 2, Offset: 99, Key: []byte("k"), Headers: map[string]string{"z": "1", "a": ""},
			Payload: []byte("payload"), PublishedAt: time.Unix(5, 6).UTC(), ProducerID: "p-1",
			NotBefore: time.Unix(7, 0).UTC(),
		},
	}
	id, gd, err := decodeDLQ(encodeDLQ(11, de))
	if err != nil || id != 11 || !reflect.DeepEqual(gd, de) {
		t.Fatalf("dlq: %v %d\n%+v\n%+v", err, id, gd, de)
	}
	id, at, ids, err := decodeDLQIDs(encodeDLQIDs(recDLQReplay, 5, -3, []int64{1, 2, 300}))
	if err != nil || id != 5 || at != -3 || !reflect.DeepEqual(ids, []int64{1, 2, 300}) {
		t.Fatalf("dlq ids: %v %d %d %v", err, id, at, ids)
	}
	hz := []horizonItem{{0, 1024}, {4095, 1 << 50}}
	id, gh, err := decodeHorizon(encodeHorizon(12, hz))
	if err != nil || id != 12 || !reflect.DeepEqual(gh, hz) {
		t.Fatalf("horizon: %v %d %v", err, id, gh)
	}
	if _, _, err := decodeHorizon(append(encodeHorizon(12, hz), 0)); err == nil {
		t.Fatal("horizon record with a trailing byte decoded")
	}
	for _, typ := range []byte{recCleanClose, recUnclean} {
		e := bareEngine()
		seedEngineState(e)
		if err := e.applyRecord([]byte{typ}); err != nil {
			t.Fatalf("record %d: %v", typ, err)
		}
		if err := e.applyRecord([]byte{typ, 0}); err == nil {
			t.Fatalf("record %d with a payload applied", typ)
		}
	}
	floors := []floorItem{{1, 0, 10}, {2, 3, 1 << 33}}
	expired := []dlqExpiry{{1, []int64{4, 5}}, {9, []int64{}}}
	gf, ge, err := decodeRetention(encodeRetention(floors, expired))
	if err != nil || !reflect.DeepEqual(gf, floors) || !reflect.DeepEqual(ge, expired) {
		t.Fatalf("retention: %v %v %v", err, gf, ge)
	}
	// Truncation anywhere is an error, never a panic or a short record taken as whole.
	rec := encodeDLQ(11, de)
	for i := 1; i < len(rec); i++ {
		if _, _, err := decodeDLQ(rec[:i]); err == nil {
			t.Fatalf("dlq record truncated to %d bytes decoded", i)
		}
	}
}

// bareEngine is an engine with maps and no files, for decoding tests.
func bareEngine() *Engine {
	e := &Engine{}
	e.resetMaps()
	return e
}

func seedEngineState(e *Engine) {
	e.applyTopicCreate(&topicCreateRec{
		Topic: storage.Topic{Name: "t", Config: storage.TopicConfig{Partitions: 2}.WithDefaults()},
		Subs:  []subRec{{Sub: storage.Subscription{ID: 1, Topic: "t", Group: storage.QueueGroup, State: storage.Active}, Starts: []int64{0, 0}}},
	})
}

// FuzzStateRecord: replaying any record body never panics, whatever it contains.
func FuzzStateRecord(f *testing.F) {
	f.Add(encodeClaim(1, []claimItem{{claimDeliver, 0, 0, 1}, {claimDelay, 1, 0, 5}}, []cursorItem{{0, 1}}))
	f.Add(encodeAck(1, []storage.DeliveryRef{{Partition: 0, Offset: 0}}))
	f.Add(encodeNack(1, []nackItem{{0, 0, 3, false, true}}))
	f.Add(encodeDLQ(1, &storage.DLQEntry{ID: 1, Message: storage.Message{Payload: []byte("x")}}))
	f.Add(encodeDLQIDs(recDLQReplay, 1, 0, []int64{1}))
	f.Add(encodeRetention([]floorItem{{1, 0, 3}}, nil))
	f.Add(encodeHorizon(1, []horizonItem{{0, 1024}, {1, 7}}))
	f.Add([]byte{recUnclean})
	f.Add([]byte{recCleanClose})
	f.Add(encodeJSON(recSubUpdate, &subUpdateRec{ID: 1, State: storage.Paused}))
	f.Add(encodeJSON(recTopicUpdate, &topicUpdateRec{Name: "t", Config: storage.TopicConfig{Partitions: 3}.WithDefaults()}))
	f.Fuzz(func(t *testing.T, body []byte) {
		e := bareEngine()
		seedEngineState(e)
		_ = e.applyRecord(body)
	})
}

// FuzzSnapshot: decoding any snapshot file never panics; a valid one round-trips.
func FuzzSnapshot(f *testing.F) {
	e := bareEngine()
	seedEngineState(e)
	st := e.subs[1].st
	st.Deliver(0, 0, "m", 10)
	st.Deliver(0, 1, "m", 10)
	st.Ack(0, 1, 5)
	st.SetHorizon(0, 1026)
	st.UncleanRestart()
	valid := e.encodeSnapshotLocked(7)
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		// Fix up the header and checksum so the fuzzer explores the body decoder, of version 1
		// (odd lengths) or the current version.
		if len(b) >= snapshotHeaderBytes+4 {
			b = append([]byte(nil), b...)
			copy(b, snapshotMagic)
			version := uint32(snapshotVersion)
			if len(b)%2 == 1 {
				version = 1
			}
			binary.LittleEndian.PutUint32(b[8:], version)
			binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
		}
		e := bareEngine()
		idx, err := e.decodeSnapshot(b)
		if err == nil && idx < 0 {
			t.Fatalf("negative index %d", idx)
		}
	})
}

func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	e := bareEngine()
	seedEngineState(e)
	st := e.subs[1].st
	for o := int64(0); o < 5; o++ {
		st.Deliver(0, o, "m", 10)
	}
	st.Ack(0, 3, 10)
	st.SetHorizon(0, 1029)
	st.SetHorizon(1, 1024)
	st.UncleanRestart()
	st.Delay(1, 0, 99)
	st.DeadLetterAt(0, 2, 0) // DLQ entry 1
	st.DeadLetterAt(1, 7, 0) // 2
	st.DeadLetterAt(1, 8, 0) // 3
	st.DeadLetterAt(1, 9, 0) // 4
	st.DLQPurge([]int64{3})
	st.DLQPurge([]int64{1})
	st.Replay(0, 2, 1, 50)
	e.bindings[bindingKey{"g", "t.#"}] = &storage.Binding{Group: "g", Pattern: "t.#"}
	e.nextSubID = 9
	b := e.encodeSnapshotLocked(1234)
	e2 := bareEngine()
	idx, err := e2.decodeSnapshot(b)
	if err != nil || idx != 1234 {
		t.Fatalf("decode: %v %d", err, idx)
	}
	if !reflect.DeepEqual(e2.encodeSnapshotLocked(1234), b) {
		t.Fatal("snapshot does not round-trip")
	}
	p1, d1 := st.Export()
	p2, d2 := e2.subs[1].st.Export()
	if !reflect.DeepEqual(p1, p2) || !reflect.DeepEqual(d1, d2) || e2.nextSubID != 9 {
		t.Fatalf("state differs:\n%+v\n%+v", p1, p2)
	}
}

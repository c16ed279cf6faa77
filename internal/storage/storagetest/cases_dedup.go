package storagetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Producer de-duplication (storage.Engine.MessagesAppend, TopicConfig.DedupWindow).
func dedupCases() []testCase {
	return []testCase{
		{name: "inside_window", fn: testDedupInsideWindow},
		{name: "after_window", fn: testDedupAfterWindow},
		{name: "batch", fn: testDedupBatch},
		{name: "inside_one_batch", fn: testDedupInsideBatch},
		{name: "per_topic", fn: testDedupPerTopic},
		{name: "across_partitions", fn: testDedupAcrossPartitions},
		{name: "concurrent", fn: testDedupConcurrent},
		{name: "refused_batch_reserves_nothing", fn: testDedupRefused},
		{name: "window_config", fn: testDedupWindowConfig},
		{name: "across_restart", restart: true, fn: testDedupRestart},
		{name: "bounded", fn: testDedupBounded},
	}
}

func withID(id, payload string) storage.AppendMessage {
	m := msg(payload)
	m.ProducerID = id
	return m
}

// requireDup checks that got is the duplicate answer of the stored position orig.
func requireDup(t testing.TB, got, orig storage.MessagePosition, what string) {
	t.Helper()
	isTrue(t, got.Duplicate, "%s: Duplicate", what)
	equal(t, got.Partition, orig.Partition, "%s: partition of the original", what)
	equal(t, got.Offset, orig.Offset, "%s: offset of the original", what)
	timeEqual(t, got.PublishedAt, orig.PublishedAt, "%s: PublishedAt of the original", what)
}

func testDedupInsideWindow(t *testing.T, x *env) {
	x.createTopic("dd", storage.TopicConfig{})
	first := x.publish("dd", withID("order-1001", "x"))[0]
	isTrue(t, !first.Duplicate, "the first message is not a duplicate")
	x.advance(time.Minute)
	again := x.publish("dd", withID("order-1001", "x"))[0]
	requireDup(t, again, first, "same producer id a minute later (default window 2 min)")
	other := x.publish("dd", withID("order-1002", "x"))[0]
	equal(t, other.Offset, int64(1), "another producer id is stored")
	// Messages without a producer id are never duplicates.
	a := x.publish("dd", msg("same"))[0]
	b := x.publish("dd", msg("same"))[0]
	isTrue(t, !a.Duplicate && !b.Duplicate && b.Offset == a.Offset+1, "messages without producer id are all stored: %+v %+v", a, b)
	deepEqual(t, x.highWaters("dd"), []int64{4}, "high water: the duplicate was not stored")
	ms := x.read("dd", 0, 0)
	equal(t, ms[0].ProducerID, "order-1001", "stored producer id")
}

func testDedupAfterWindow(t *testing.T, x *env) {
	x.createTopic("dw", storage.TopicConfig{DedupWindow: 10 * time.Second})
	first := x.publish("dw", withID("p", "1"))[0]
	x.advance(10*time.Second - time.Millisecond)
	requireDup(t, x.publish("dw", withID("p", "2"))[0], first, "just inside the window")
	x.advance(time.Millisecond)
	second := x.publish("dw", withID("p", "3"))[0]
	isTrue(t, !second.Duplicate, "at the end of the window the id is forgotten: a new copy is stored")
	equal(t, second.Offset, int64(1), "offset of the new copy")
	x.advance(5 * time.Second)
	requireDup(t, x.publish("dw", withID("p", "4"))[0], second, "the new copy starts a new window")
	// Retention prunes the ids of an idle topic; the answers stay the same.
	x.advance(time.Hour)
	_, err := x.e.RetentionApply(x.ctx)
	noErr(t, err, "RetentionApply")
	third := x.publish("dw", withID("p", "5"))[0]
	isTrue(t, !third.Duplicate && third.Offset == 2, "after the window and retention: stored at 2, got %+v", third)
	deepEqual(t, x.highWaters("dw"), []int64{3}, "high water")
}

func testDedupBatch(t *testing.T, x *env) {
	x.createTopic("db", storage.TopicConfig{})
	first := x.publish("db", withID("a", "a"), withID("b", "b"), msg("none"), withID("c", "c"))
	for i, p := range first {
		equal(t, p.Offset, int64(i), "offset of message %d", i)
		isTrue(t, !p.Duplicate, "message %d is new", i)
	}
	x.advance(time.Second)
	second := x.publish("db", withID("b", "b"), withID("d", "d"), withID("a", "a"), msg("none"))
	requireDup(t, second[0], first[1], "b again")
	isTrue(t, !second[1].Duplicate && second[1].Offset == 4, "d is new at offset 4: %+v", second[1])
	requireDup(t, second[2], first[0], "a again")
	isTrue(t, !second[3].Duplicate && second[3].Offset == 5, "the message without id is new at 5: %+v", second[3])
	all := x.publish("db", withID("a", "a"), withID("b", "b"), withID("c", "c"))
	for i, j := range []int{0, 1, 3} {
		requireDup(t, all[i], first[j], fmt.Sprintf("batch of duplicates only, message %d", i))
	}
	deepEqual(t, x.highWaters("db"), []int64{6}, "high water")
	ms := x.read("db", 0, 0)
	var payloads []string
	for _, m := range ms {
		payloads = append(payloads, string(m.Payload))
	}
	deepEqual(t, payloads, []string{"a", "b", "none", "c", "d", "none"}, "stored payloads")
}

func testDedupInsideBatch(t *testing.T, x *env) {
	x.createTopic("di", storage.TopicConfig{})
	pos := x.publish("di", withID("x", "x1"), withID("x", "x2"), withID("y", "y"), withID("x", "x3"))
	isTrue(t, !pos[0].Duplicate && pos[0].Offset == 0, "first x stored at 0: %+v", pos[0])
	requireDup(t, pos[1], pos[0], "second x of the batch")
	isTrue(t, !pos[2].Duplicate && pos[2].Offset == 1, "y stored at 1: %+v", pos[2])
	requireDup(t, pos[3], pos[0], "third x of the batch")
	ms := x.read("di", 0, 0)
	equal(t, len(ms), 2, "stored messages")
	equal(t, string(ms[0].Payload), "x1", "the first copy is the one stored")
	requireDup(t, x.publish("di", withID("x", "x4"))[0], pos[0], "x in a later batch")
}

func testDedupPerTopic(t *testing.T, x *env) {
	x.createTopic("t1", storage.TopicConfig{})
	x.createTopic("t2", storage.TopicConfig{})
	a := x.publish("t1", withID("same", "1"))[0]
	b := x.publish("t2", withID("same", "2"))[0]
	isTrue(t, !a.Duplicate && !b.Duplicate, "the same id on two topics is stored on both: %+v %+v", a, b)
	requireDup(t, x.publish("t2", withID("same", "3"))[0], b, "again on t2")
	deepEqual(t, x.highWaters("t1"), []int64{1}, "t1 high water")
	deepEqual(t, x.highWaters("t2"), []int64{1}, "t2 high water")
	// A deleted and re-created topic starts with no ids.
	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "t1", Force: true}), "TopicDelete")
	x.createTopic("t1", storage.TopicConfig{})
	c := x.publish("t1", withID("same", "4"))[0]
	isTrue(t, !c.Duplicate && c.Offset == 0, "re-created topic stores the id: %+v", c)
}

func testDedupAcrossPartitions(t *testing.T, x *env) {
	const parts = 4
	x.createTopic("dp", storage.TopicConfig{Partitions: parts})
	k1, k2 := "", ""
	for i := 0; k2 == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		switch {
		case k1 == "":
			k1 = k
		case storage.PartitionForKey([]byte(k), parts) != storage.PartitionForKey([]byte(k1), parts):
			k2 = k
		}
	}
	m1, m2 := keyed(k1, "1"), keyed(k2, "2")
	m1.ProducerID, m2.ProducerID = "id", "id"
	first := x.publish("dp", m1)[0]
	requireDup(t, x.publish("dp", m2)[0], first, "the id is per topic, whatever the partition")
	var total int64
	for _, hw := range x.highWaters("dp") {
		total += hw
	}
	equal(t, total, int64(1), "messages stored over all partitions")
}

func testDedupConcurrent(t *testing.T, x *env) {
	x.createTopic("dc", storage.TopicConfig{Partitions: 2})
	const writers = 8
	for round := range 5 {
		id := fmt.Sprintf("id-%d", round)
		var wg sync.WaitGroup
		pos := make([]storage.MessagePosition, writers)
		errs := make([]error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "dc",
					Messages: []storage.AppendMessage{msg("other"), withID(id, "w")}})
				errs[w] = err
				if err == nil {
					pos[w] = res.Positions[1]
				}
			}()
		}
		wg.Wait()
		stored := 0
		for w := range writers {
			noErr(t, errs[w], "round %d writer %d", round, w)
			if !pos[w].Duplicate {
				stored++
			}
			equal(t, pos[w].Offset, pos[0].Offset, "round %d writer %d: offset of the one copy", round, w)
			equal(t, pos[w].Partition, pos[0].Partition, "round %d writer %d: partition of the one copy", round, w)
		}
		equal(t, stored, 1, "round %d: copies stored by %d concurrent appends of one id", round, writers)
	}
	var total int64
	for _, hw := range x.highWaters("dc") {
		total += hw
	}
	equal(t, total, int64(5*writers+5), "messages stored: every message without id, one per id")
}

func testDedupRefused(t *testing.T, x *env) {
	x.createTopic("dr", storage.TopicConfig{MaxMessageBytes: 10})
	_, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "dr",
		Messages: []storage.AppendMessage{withID("a", "ok"), withID("b", "much too large")}})
	errIs(t, err, storage.ErrMessageTooLarge, "batch with an oversize message")
	p := x.publish("dr", withID("a", "ok"))[0]
	isTrue(t, !p.Duplicate && p.Offset == 0, "an id of a refused batch is not remembered: %+v", p)
	long := make([]byte, storage.MaxProducerIDLen+1)
	for i := range long {
		long[i] = 'x'
	}
	_, err = x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "dr",
		Messages: []storage.AppendMessage{withID(string(long), "ok")}})
	errIs(t, err, storage.ErrInvalidArgument, "producer id longer than MaxProducerIDLen")
	deepEqual(t, x.highWaters("dr"), []int64{1}, "high water")
}

func testDedupWindowConfig(t *testing.T, x *env) {
	tp := x.createTopic("dcfg", storage.TopicConfig{})
	equal(t, tp.Config.DedupWindow, storage.DefaultDedupWindow, "default dedup_window")
	equal(t, storage.DefaultDedupWindow, 2*time.Minute, "BRIEF section 5: dedup_window 2 min")
	for _, w := range []time.Duration{-time.Second, time.Microsecond, storage.MaxDedupWindow + time.Second} {
		_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "bad.window", Config: storage.TopicConfig{DedupWindow: w}})
		errIs(t, err, storage.ErrInvalidArgument, "dedup_window %s", w)
	}
	first := x.publish("dcfg", withID("p", "1"))[0]
	cfg := tp.Config
	cfg.DedupWindow = time.Hour
	up := x.updateTopic(storage.TopicUpdateParams{Name: "dcfg", Config: cfg})
	equal(t, up.Config.DedupWindow, time.Hour, "updated dedup_window")
	// The window applies to ids appended after the change; "p" keeps its 2 min.
	x.advance(2 * time.Minute)
	second := x.publish("dcfg", withID("p", "2"))[0]
	isTrue(t, !second.Duplicate && second.Offset == first.Offset+1, "p after its window: stored, got %+v", second)
	x.advance(59 * time.Minute)
	requireDup(t, x.publish("dcfg", withID("p", "3"))[0], second, "p inside its new 1 h window")
}

func testDedupRestart(t *testing.T, x *env) {
	x.createTopic("dx", storage.TopicConfig{Partitions: 2})
	old := x.publish("dx", withID("old", "o"))[0]
	x.advance(90 * time.Second)
	batch := x.publish("dx", withID("a", "a"), keyed("k", "keyed"), withID("b", "b"))
	x.restart()
	requireDup(t, x.publish("dx", withID("a", "a"))[0], batch[0], "a after a restart")
	requireDup(t, x.publish("dx", withID("b", "b"))[0], batch[2], "b after a restart")
	requireDup(t, x.publish("dx", withID("old", "o"))[0], old, "old after a restart, 90 s into its window")
	x.advance(31 * time.Second) // old: 121 s, a and b: 31 s
	x.restart()
	o := x.publish("dx", withID("old", "o2"))[0]
	isTrue(t, !o.Duplicate, "old past its window after a restart: a new copy, got %+v", o)
	requireDup(t, x.publish("dx", withID("a", "a"))[0], batch[0], "a after a second restart")
	x.advance(100 * time.Second) // a: 131 s, the new copy of old: 100 s
	x.restart()
	a := x.publish("dx", withID("a", "a2"))[0]
	isTrue(t, !a.Duplicate, "a past its window after a restart: a new copy, got %+v", a)
	requireDup(t, x.publish("dx", withID("old", "o3"))[0], o, "the new copy of old is remembered (100 s ago)")
}

// testDedupBounded: the producer ids an engine remembers are bounded, all topics together
// (Capabilities.MaxProducerIDs): a publish that would remember new ids past the bound is refused
// with ErrRateLimited and stores nothing, while repeats of remembered ids are still answered as
// duplicates and messages without an id are stored; once the ids' window ended and retention
// ran, new ids are taken again, up to the bound. A restart keeps the count.
func testDedupBounded(t *testing.T, x *env) {
	max := x.caps.MaxProducerIDs
	if max == 0 {
		t.Skip("engine does not declare Capabilities.MaxProducerIDs")
	}
	x.createTopic("cap.a", storage.TopicConfig{DedupWindow: time.Minute})
	x.createTopic("cap.b", storage.TopicConfig{DedupWindow: time.Hour})
	ids := func(prefix string, n int) []storage.AppendMessage {
		var ms []storage.AppendMessage
		for i := range n {
			ms = append(ms, withID(fmt.Sprint(prefix, i), prefix))
		}
		return ms
	}
	first := x.publish("cap.a", ids("a", max-4)...)
	for _, m := range ids("b", 4) {
		x.publish("cap.b", m)
	}
	refused := func(what string, ms ...storage.AppendMessage) {
		t.Helper()
		_, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "cap.b", Messages: ms})
		errIs(t, err, storage.ErrRateLimited, "%s past %d producer ids", what, max)
	}
	refused("a new id", withID("b-new", "x"))
	refused("a batch of a message without id, a repeat and a new id", msg("none"), withID("b0", "b"), withID("b-new", "x"))
	deepEqual(t, x.highWaters("cap.b"), []int64{4}, "cap.b high water after the refused appends")
	requireDup(t, x.publish("cap.a", withID("a0", "a"))[0], first[0], "a repeat at the bound")
	p := x.publish("cap.b", msg("no id"))[0]
	isTrue(t, !p.Duplicate && p.Offset == 4, "a message without id at the bound is stored at 4: %+v", p)
	if x.caps.Restart {
		x.restart()
		refused("a new id after a restart", withID("b-new", "x"))
	}

	x.advance(time.Minute) // cap.a's ids expire
	_, err := x.e.RetentionApply(x.ctx)
	noErr(t, err, "RetentionApply")
	p = x.publish("cap.b", withID("b-new", "x"))[0]
	isTrue(t, !p.Duplicate && p.Offset == 5, "a new id once cap.a's expired: stored at 5, got %+v", p)
	for i, q := range x.publish("cap.a", ids("a-late", max-5)...) {
		isTrue(t, !q.Duplicate, "late id %d of cap.a: stored, got %+v", i, q)
	}
	_, err = x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "cap.a", Messages: []storage.AppendMessage{withID("a-over", "x")}})
	errIs(t, err, storage.ErrRateLimited, "a new id at the bound again")
	deepEqual(t, x.highWaters("cap.a"), []int64{int64(2*max - 9)}, "cap.a high water")
}

package wal

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// TestDedupMemoryBounded: the producer ids of a topic are forgotten once their window passed, on
// the next append and on RetentionApply for an idle topic; a crash and reopen rebuilds only the
// ids of the last window (from the partition logs), and the crash between the commit and the
// answer still de-duplicates the retry.
func TestDedupMemoryBounded(t *testing.T) {
	h := newHarness(t)
	h.createTopic("mem", storage.TopicConfig{Partitions: 2, DedupWindow: time.Minute})
	ids := func(from, n int) []storage.AppendMessage {
		var ms []storage.AppendMessage
		for i := from; i < from+n; i++ {
			ms = append(ms, storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("x"), ProducerID: fmt.Sprintf("id-%d", i)})
		}
		return ms
	}
	table := func() *dedupTable { return &h.e.topics["mem"].dedup }
	h.publish("mem", ids(0, 500)...)
	equal(t, table().len(), 500, "ids remembered inside the window")
	h.clock.Advance(time.Minute)
	h.publish("mem", ids(500, 1)...)
	equal(t, table().len(), 1, "ids remembered after the window passed, one append later")
	h.clock.Advance(time.Minute)
	_, err := h.e.RetentionApply(h.ctx)
	h.must(err, "RetentionApply")
	equal(t, table().len(), 0, "ids of an idle topic after RetentionApply")

	h.publish("mem", ids(1000, 300)...)
	h.clock.Advance(40 * time.Second)
	last := h.publish("mem", ids(2000, 200)...)
	h.crash()
	equal(t, table().len(), 500, "ids rebuilt after a crash: both appends are inside the window")
	h.clock.Advance(30 * time.Second)
	h.crash()
	equal(t, table().len(), 200, "ids rebuilt after a crash: only the last append is inside the window")
	again := h.publish("mem", ids(2000, 200)...)
	for i, p := range again {
		if !p.Duplicate || p.Partition != last[i].Partition || p.Offset != last[i].Offset {
			t.Fatalf("retry after a crash, message %d: %+v, want the duplicate of %+v", i, p, last[i])
		}
	}
}

// TestDedupPendingStress: many appends of the same ids at once, so that most are duplicates of an
// append still in flight (pending): every answer must carry the one stored copy's position, set
// before the append returns (an append must not complete before the append it waits for).
func TestDedupPendingStress(t *testing.T) {
	h := newHarness(t)
	h.createTopic("stress", storage.TopicConfig{Partitions: 2})
	const writers, ids = 8, 300
	answers := make([][]storage.MessagePosition, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for k := range ids {
				id := fmt.Sprintf("id-%d", k)
				res, err := h.e.MessagesAppend(h.ctx, &storage.MessagesAppendParams{Topic: "stress", Messages: []storage.AppendMessage{
					{Partition: storage.PartitionAuto, Payload: []byte("x"), ProducerID: id},
					{Partition: storage.PartitionAuto, Payload: []byte("y"), ProducerID: id + "-b"}}})
				if err != nil {
					t.Error(err)
					return
				}
				answers[w] = append(answers[w], res.Positions...)
			}
		})
	}
	wg.Wait()
	for i := range 2 * ids {
		stored := 0
		var want storage.MessagePosition
		for w := range writers {
			p := answers[w][i]
			if p.PublishedAt.IsZero() {
				t.Fatalf("message %d of writer %d: no position: %+v", i, w, p)
			}
			if !p.Duplicate {
				stored++
				want = p
			}
		}
		if stored != 1 {
			t.Fatalf("message %d stored %d times", i, stored)
		}
		for w := range writers {
			if p := answers[w][i]; p.Partition != want.Partition || p.Offset != want.Offset || !p.PublishedAt.Equal(want.PublishedAt) {
				t.Fatalf("message %d of writer %d: %+v, want the position of the stored copy %+v", i, w, p, want)
			}
		}
	}
}

// TestDedupIDsCapped: the producer ids the engine remembers are bounded (Config.MaxProducerIDs, all
// topics together): an append that would remember more is refused with ErrRateLimited and stores
// nothing, a repeat of a remembered id is still answered as a duplicate, and new ids are taken
// again once old ones expired or their topic was deleted; the count survives a crash (rebuilt).
func TestDedupIDsCapped(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxProducerIDs = 10 })
	h.createTopic("cap.a", storage.TopicConfig{DedupWindow: time.Minute})
	h.createTopic("cap.b", storage.TopicConfig{DedupWindow: time.Hour})
	msg := func(id string) storage.AppendMessage {
		return storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte(id), ProducerID: id}
	}
	var first []storage.MessagePosition
	for i := range 6 {
		first = append(first, h.publish("cap.a", msg(fmt.Sprint("a", i)))...)
	}
	for i := range 4 {
		h.publish("cap.b", msg(fmt.Sprint("b", i)))
	}
	_, err := h.e.MessagesAppend(h.ctx, &storage.MessagesAppendParams{Topic: "cap.b", Messages: []storage.AppendMessage{msg("b-new")}})
	errIs(t, err, storage.ErrRateLimited, "an 11th producer id")
	st, err := h.e.TopicStats(h.ctx, "cap.b")
	h.must(err, "TopicStats")
	equal(t, st.Messages, int64(4), "messages of cap.b after the refused append")
	if again := h.publish("cap.a", msg("a0")); !again[0].Duplicate || again[0].Offset != first[0].Offset {
		t.Fatalf("a repeat while the table is full: %+v, want the duplicate of %+v", again[0], first[0])
	}
	h.publish("cap.b", storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("no id")}) // ids are not needed

	h.crash()
	_, err = h.e.MessagesAppend(h.ctx, &storage.MessagesAppendParams{Topic: "cap.b", Messages: []storage.AppendMessage{msg("b-new")}})
	errIs(t, err, storage.ErrRateLimited, "an 11th producer id after a crash")

	h.clock.Advance(time.Minute) // cap.a's ids expire
	h.publish("cap.b", msg("b-new"))
	h.must(h.e.TopicDelete(h.ctx, &storage.TopicDeleteParams{Name: "cap.b", Force: true}), "TopicDelete")
	for i := range 9 {
		h.publish("cap.a", msg(fmt.Sprint("a-late", i)))
	}
}

// BenchmarkDedupMemory reports the heap a topic's table holds per remembered producer id (36-byte
// ids, as UUIDs are) once their appends completed: Config.MaxProducerIDs is sized from it. Run:
// go test -run '^$' -bench DedupMemory -benchtime 1x ./internal/storage/wal/
func BenchmarkDedupMemory(b *testing.B) {
	const n = 1_000_000
	ids := make([]storage.AppendMessage, n)
	for i := range ids {
		ids[i] = storage.AppendMessage{ProducerID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)}
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for b.Loop() {
		var d dedupTable
		var total atomic.Int64
		var waiting atomic.Int32
		before := heap()
		start := time.Now()
		for i := 0; i < n; i += 100 {
			batch := ids[i : i+100]
			dp := d.reserve(batch, 1, time.Hour, &waiting, func() {}, &total)
			idx := make([]int, len(batch))
			for j := range idx {
				idx[j] = j
			}
			d.resolve(dp, idx, func(j int) storage.MessagePosition {
				return storage.MessagePosition{Offset: int64(i + j), PublishedAt: time.Unix(0, 1).UTC()}
			}, nil, &total)
		}
		took := time.Since(start)
		after := heap()
		gcStart := time.Now()
		runtime.GC()
		b.ReportMetric(float64(after-before)/n, "B/id")
		b.ReportMetric(float64(took.Nanoseconds())/n, "ns/id")
		b.ReportMetric(float64(time.Since(gcStart).Microseconds()), "us/GC")
		if d.len() != n {
			b.Fatalf("%d ids remembered, want %d", d.len(), n)
		}
		runtime.KeepAlive(&d)
	}
}

// TestDedupResolveAfterDrop: an append still pending when its topic is deleted (the table
// dropped) completes: its waiting duplicates get its position, and the ids it reserved are not
// in the table (nor counted) any more.
func TestDedupResolveAfterDrop(t *testing.T) {
	var d dedupTable
	var total atomic.Int64
	var waiting atomic.Int32
	msgs := []storage.AppendMessage{{ProducerID: "a"}, {ProducerID: "b"}}
	first := d.reserve(msgs, 1, time.Minute, &waiting, func() {}, &total)
	done := 0
	second := d.reserve(msgs[:1], 1, time.Minute, &waiting, func() { done++ }, &total)
	equal(t, int(waiting.Load()), 1, "duplicates waiting for the pending append")
	d.drop(&total)
	equal(t, d.len(), 0, "ids after the drop")
	equal(t, total.Load(), int64(0), "ids counted after the drop")
	// An append after the drop, pending while the first completes: the first must not touch it.
	c := []storage.AppendMessage{{ProducerID: "c"}}
	third := d.reserve(c, 1, time.Minute, &waiting, func() {}, &total)
	pos := storage.MessagePosition{Partition: 0, Offset: 7, PublishedAt: time.Unix(0, 5).UTC()}
	d.resolve(first, []int{0, 1}, func(int) storage.MessagePosition { return pos }, nil, &total)
	equal(t, done, 1, "waiters called")
	if dupC := d.reserve(c, 1, time.Minute, &waiting, func() {}, &total); dupC.stored(0) || waiting.Load() != 2 {
		t.Fatalf("a repeat of a pending id after the first append completed: stored %v, %d waiting; want a wait", dupC.stored(0), waiting.Load())
	}
	d.resolve(third, []int{0}, func(int) storage.MessagePosition { return storage.MessagePosition{Offset: 9} }, nil, &total)
	equal(t, total.Load(), int64(1), "ids counted: c")
	d.drop(&total)
	if got := second.pos[0]; !got.Duplicate || got.Offset != 7 || !got.PublishedAt.Equal(pos.PublishedAt) {
		t.Fatalf("waiting duplicate's position %+v, want the duplicate of %+v", got, pos)
	}
	equal(t, d.len(), 0, "ids after the pending append completed")
	equal(t, total.Load(), int64(0), "ids counted after the pending append completed")
	// The table takes ids again, with new sequence numbers.
	again := d.reserve(msgs[:1], 2, time.Minute, &waiting, func() {}, &total)
	if !again.stored(0) {
		t.Fatal("an id of the dropped table is a duplicate")
	}
	d.resolve(again, []int{0}, func(int) storage.MessagePosition { return pos }, nil, &total)
	dup := d.reserve(msgs[:1], 3, time.Minute, &waiting, func() {}, &total)
	if dup.stored(0) || dup.pos[0].Offset != 7 {
		t.Fatalf("a repeat: stored %v, position %+v", dup.stored(0), dup.pos[0])
	}
}

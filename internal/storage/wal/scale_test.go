package wal

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Scale measurements of the embedded engine. They load many small messages and a long DLQ into
// t.TempDir(), check the results and log how long the operations take whose cost could grow with
// retained messages or DLQ length. By default (CI) the data sets are small; the measurements of
// docs/benchmarks.md use the full sizes:
//
//	SPOOL_WAL_SCALE=1 go test -run TestScale -v -timeout 30m ./internal/storage/wal/
//
// SPOOL_WAL_SCALE_MSGS and SPOOL_WAL_SCALE_DLQ override the sizes (full 5,000,000 and 1,000,000,
// small 50,000 and 10,000). The full data set takes about 0.7 GB on disk.

// scaleSize returns the positive integer environment variable name, or by default full with
// SPOOL_WAL_SCALE=1 and small without.
func scaleSize(name string, full, small int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	if os.Getenv("SPOOL_WAL_SCALE") == "1" {
		return full
	}
	return small
}

// timeIt runs fn n times and logs the fastest and slowest run.
func timeIt(t *testing.T, what string, n int, fn func()) time.Duration {
	t.Helper()
	var lo, hi time.Duration
	for i := range n {
		start := time.Now()
		fn()
		d := time.Since(start)
		if i == 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	t.Logf("%-60s min %10s  max %10s  (%d runs)", what, lo.Round(time.Microsecond), hi.Round(time.Microsecond), n)
	return lo
}

func heapKiB() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc / 1024
}

// loadTopics appends total messages of 16 bytes to each of the topics in batches of batch,
// advancing the clock by step after each round of batches.
func loadTopics(h *harness, total, batch int, step time.Duration, topics ...string) {
	h.t.Helper()
	payload := []byte("0123456789abcdef")
	msgs := make([]storage.AppendMessage, batch)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload}
	}
	for done := 0; done < total; done += batch {
		n := min(batch, total-done)
		for _, tp := range topics {
			// The keyless messages of one call go to one partition, the next call's to the next.
			if _, err := h.e.MessagesAppend(h.ctx, &storage.MessagesAppendParams{Topic: tp, Messages: msgs[:n]}); err != nil {
				h.t.Fatalf("append to %s: %v", tp, err)
			}
		}
		h.clock.Advance(step)
	}
}

// TestScaleStartAndRetention measures SubscriptionCreate from a timestamp or a message ID and
// RetentionApply on topics with millions of retained messages.
func TestScaleStartAndRetention(t *testing.T) {
	total := scaleSize("SPOOL_WAL_SCALE_MSGS", 5_000_000, 50_000)
	h := newHarness(t, func(c *Config) {
		c.SegmentBytes = 16 << 20 // several segments per partition, so retention can cut
		c.Sync = UnsafeNoSync
	})
	cfg := storage.TopicConfig{Semantics: storage.PubSub, Partitions: 1, MessageRetention: time.Hour, ZeroSubscriptionRetention: time.Hour}
	h.createTopic("t1", cfg)
	cfg.Partitions = 4
	h.createTopic("t4", cfg)
	// The group holds every message of t1 (ack floor 0).
	hold := h.subscribe("t1", "hold", storage.StartPosition{Kind: storage.FromBeginning})

	const batch = 10_000
	rounds := (total + batch - 1) / batch
	span := 2 * time.Hour // messages span two hours: message_retention (1 h) cuts in the middle
	step := span / time.Duration(rounds)
	t0 := h.clock.Now()
	start := time.Now()
	loadTopics(h, total, batch, step, "t1", "t4")
	t.Logf("loaded %d messages into t1 (1 partition) and t4 (4 partitions) in %s", total, time.Since(start).Round(time.Millisecond))
	for _, name := range []string{"t1", "t4"} {
		ts, err := h.e.TopicStats(h.ctx, name)
		h.must(err, "topic stats")
		segs := 0
		for _, p := range h.e.topics[name].parts {
			segs += len(p.log.Segments())
		}
		t.Logf("%s: %d messages, %d MB, %d segments", name, ts.Messages, ts.Bytes>>20, segs)
	}

	n := 0
	for _, frac := range []struct {
		name string
		f    float64
	}{{"start", 0.001}, {"middle", 0.5}, {"end", 0.999}} {
		at := t0.Add(time.Duration(float64(span) * frac.f))
		for _, name := range []string{"t1", "t4"} {
			timeIt(t, "SubscriptionCreate "+name+" FromTimestamp "+frac.name, 5, func() {
				n++
				s := h.subscribe(name, "ts"+itoa(n), storage.StartPosition{Kind: storage.FromTimestamp, Time: at})
				h.must(h.e.SubscriptionDelete(h.ctx, s.ID), "delete")
			})
			off := int64(float64(total/4) * frac.f)
			timeIt(t, "SubscriptionCreate "+name+" FromMessageID p0 "+frac.name, 5, func() {
				n++
				s := h.subscribe(name, "id"+itoa(n), storage.StartPosition{Kind: storage.FromMessageID, Partition: 0, Offset: off})
				h.must(h.e.SubscriptionDelete(h.ctx, s.ID), "delete")
			})
		}
	}
	mid := h.subscribe("t4", "mid", storage.StartPosition{Kind: storage.FromTimestamp, Time: t0.Add(span / 2)})
	timeIt(t, "claim 100 + ack on t4 from the middle", 5, func() {
		ds := h.claim(mid.ID, "m", 100)
		h.ack(mid.ID, refs(ds)...)
	})
	timeIt(t, "claim 100 + ack on t1 group holding everything", 5, func() {
		ds := h.claim(hold.ID, "m", 100)
		h.ack(hold.ID, refs(ds)...)
	})
	timeIt(t, "SubscriptionStats t1 hold", 5, func() { h.stats(hold.ID) })
	h.must(h.e.SubscriptionDelete(h.ctx, mid.ID), "delete mid")

	// Retention: t1 is held by the group (nothing may go), t4 has no subscription, so
	// zero_subscription_retention (1 h) cuts it in the middle on the first run.
	var res *storage.RetentionResult
	timeIt(t, "RetentionApply (first: deletes half of t4)", 1, func() {
		var err error
		res, err = h.e.RetentionApply(h.ctx)
		h.must(err, "retention")
	})
	t.Logf("  result %+v", *res)
	timeIt(t, "RetentionApply (t1 held, nothing to delete)", 5, func() {
		var err error
		res, err = h.e.RetentionApply(h.ctx)
		h.must(err, "retention")
	})
	t.Logf("  result %+v", *res)
	timeIt(t, "restart (Close + Open) with 2 x 5M messages", 1, h.restart)
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return string(b[i:])
}

// TestScaleDLQ measures a subscription with a million DLQ entries: listing, stats, claims and
// acks next to it, retention, replay and purge of one entry, snapshots and restarts, and the
// memory per entry.
func TestScaleDLQ(t *testing.T) {
	total := scaleSize("SPOOL_WAL_SCALE_DLQ", 1_000_000, 10_000)
	h := newHarness(t, func(c *Config) {
		c.SegmentBytes = DefaultSegmentBytes
		c.Sync = UnsafeNoSync
	})
	h.createTopic("q", storage.TopicConfig{Partitions: 1, MaxDeliveries: 1})
	q := h.queueSub("q")
	loadTopics(h, total+10_000, 10_000, time.Millisecond, "q")
	heap0 := heapKiB()

	const chunk = 10_000
	start := time.Now()
	var worst time.Duration
	for done := 0; done < total; done += chunk {
		t0 := time.Now()
		ds := h.claim(q.ID, "m", min(chunk, total-done))
		if _, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{
			SubscriptionID: q.ID, Member: "m", Refs: refs(ds), ToDLQ: true, Reason: "scale"}); err != nil {
			t.Fatal(err)
		}
		h.clock.Advance(time.Millisecond)
		worst = max(worst, time.Since(t0))
	}
	t.Logf("dead-lettered %d messages in %s (slowest claim+nack of %d: %s)", total, time.Since(start).Round(time.Millisecond), chunk, worst.Round(time.Millisecond))
	heap1 := heapKiB()
	t.Logf("heap: %d KiB before the DLQ, %d KiB after: %.0f bytes per DLQ entry", heap0, heap1, float64(heap1-heap0)*1024/float64(total))
	equal(t, h.stats(q.ID).DeadLettered, int64(total), "dead-lettered")

	timeIt(t, "DLQList first page (100)", 5, func() {
		_, err := h.e.DLQList(h.ctx, &storage.DLQListParams{SubscriptionID: q.ID})
		h.must(err, "list")
	})
	timeIt(t, "DLQList late page (100)", 5, func() {
		_, err := h.e.DLQList(h.ctx, &storage.DLQListParams{SubscriptionID: q.ID, AfterID: int64(total - 200)})
		h.must(err, "list")
	})
	timeIt(t, "SubscriptionStats", 5, func() { h.stats(q.ID) })
	timeIt(t, "claim 100 + ack", 5, func() {
		ds := h.claim(q.ID, "m", 100)
		h.ack(q.ID, refs(ds)...)
	})
	timeIt(t, "claim 1 + nack to DLQ (one more entry)", 5, func() {
		ds := h.claim(q.ID, "m", 1)
		_, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m", Refs: refs(ds), ToDLQ: true})
		h.must(err, "nack")
	})
	timeIt(t, "RetentionApply (nothing expires)", 5, func() {
		_, err := h.e.RetentionApply(h.ctx)
		h.must(err, "retention")
	})
	id := int64(total / 2)
	timeIt(t, "DLQReplay of one ID", 5, func() {
		id++
		n, err := h.e.DLQReplay(h.ctx, &storage.DLQReplayParams{SubscriptionID: q.ID, IDs: []int64{id}})
		h.must(err, "replay")
		equal(t, n, 1, "replayed")
	})
	timeIt(t, "DLQPurge of one ID", 5, func() {
		id++
		n, err := h.e.DLQPurge(h.ctx, &storage.DLQPurgeParams{SubscriptionID: q.ID, IDs: []int64{id}})
		h.must(err, "purge")
		equal(t, n, 1, "purged")
	})
	var st *snapshotState
	timeIt(t, "snapshot export (Engine.mu held exclusively)", 3, func() {
		h.e.mu.Lock()
		st = h.e.exportSnapshotLocked()
		h.e.mu.Unlock()
	})
	var size int
	timeIt(t, "snapshot encoding (no lock held)", 3, func() { size = len(st.encode(0)) })
	st = nil
	t.Logf("  snapshot %d MB", size>>20)
	// The longest an operation waits while a snapshot is taken: SubscriptionStats in a loop.
	stop := make(chan struct{})
	worstc := make(chan time.Duration)
	go func() {
		var worst time.Duration
		for {
			select {
			case <-stop:
				worstc <- worst
				return
			default:
			}
			t0 := time.Now()
			if _, err := h.e.SubscriptionStats(h.ctx, q.ID); err != nil {
				t.Error(err)
			}
			worst = max(worst, time.Since(t0))
			time.Sleep(100 * time.Microsecond)
		}
	}()
	timeIt(t, "snapshot (whole)", 3, func() { h.must(h.e.snapshot(false), "snapshot") })
	close(stop)
	t.Logf("  slowest SubscriptionStats during the snapshots: %s", (<-worstc).Round(time.Microsecond))
	timeIt(t, "Close (final snapshot)", 1, func() { h.must(h.e.Close(), "close") })
	timeIt(t, "Open (snapshot load)", 1, h.open)
	heap2 := heapKiB()
	t.Logf("heap after restart: %d KiB", heap2)
	timeIt(t, "claim 100 + ack after restart", 3, func() {
		ds := h.claim(q.ID, "m", 100)
		h.ack(q.ID, refs(ds)...)
	})
	timeIt(t, "crash + Open (snapshot + state log replay)", 1, h.crash)

	// Expiry: every entry dead for longer than max_retention goes at the next retention run.
	h.clock.Advance(31 * 24 * time.Hour)
	var res *storage.RetentionResult
	timeIt(t, "RetentionApply (every DLQ entry expires)", 1, func() {
		var err error
		res, err = h.e.RetentionApply(h.ctx)
		h.must(err, "retention")
	})
	t.Logf("  result %+v", *res)
}

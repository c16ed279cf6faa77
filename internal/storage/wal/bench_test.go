package wal

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Benchmarks of the embedded engine. Run them explicitly, e.g.
//
//	go test -run '^$' -bench . -benchtime 5s ./internal/storage/wal/
//
// Conditions are reported with each figure in docs/benchmarks.md. All use SyncAlways (fdatasync
// before a call returns) unless their name says otherwise.

// syncCounter counts group-commit rounds and the records they made durable.
type syncCounter struct{ rounds, records atomic.Int64 }

func (c *syncCounter) onSync(_ time.Duration, records, _ int) {
	c.rounds.Add(1)
	c.records.Add(int64(records))
}

func (c *syncCounter) report(b *testing.B, msgs int64) {
	if r := c.rounds.Load(); r > 0 {
		b.ReportMetric(float64(msgs)/float64(r), "msgs/fsync")
	}
}

func openBench(b *testing.B, dir string, counter *syncCounter, mods ...func(*Config)) *Engine {
	b.Helper()
	cfg := Config{}
	if counter != nil {
		cfg.OnSync = counter.onSync
	}
	for _, m := range mods {
		m(&cfg)
	}
	e, err := Open(dir, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return e
}

var payload1KiB = []byte(strings.Repeat("x", 1024))

// benchAppend runs b.N messages through g goroutines, batch messages per MessagesAppend call.
func benchAppend(b *testing.B, g, batch, partitions int) {
	var counter syncCounter
	e := openBench(b, b.TempDir(), &counter)
	defer e.Close()
	ctx := context.Background()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bench", Config: storage.TopicConfig{Partitions: partitions}}); err != nil {
		b.Fatal(err)
	}
	msgs := make([]storage.AppendMessage, batch)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload1KiB}
	}
	calls := (b.N + batch - 1) / batch
	var next atomic.Int64
	b.SetBytes(int64(len(payload1KiB)))
	b.ReportAllocs()
	counter.rounds.Store(0)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range g {
		wg.Go(func() {
			for next.Add(1) <= int64(calls) {
				if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bench", Messages: msgs}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	n := int64(calls * batch)
	b.ReportMetric(float64(n)/el.Seconds(), "msgs/s")
	counter.report(b, n)
}

// BenchmarkAppend_1KiB_10Goroutines_Batch1: 10 goroutines each publishing one 1 KiB message per
// call and waiting for it to be durable. Target: >= 40,000 msg/s.
func BenchmarkAppend_1KiB_10Goroutines_Batch1(b *testing.B) { benchAppend(b, 10, 1, 1) }

// BenchmarkAppend_1KiB_10Goroutines_Batch100: 10 goroutines x 100 messages per call. Target:
// >= 200,000 msg/s.
func BenchmarkAppend_1KiB_10Goroutines_Batch100(b *testing.B) { benchAppend(b, 10, 100, 1) }

// BenchmarkAppend_1KiB_10Goroutines_Batch1_4Partitions: as Batch1, spread over 4 partitions (one
// fsync per touched log per round).
func BenchmarkAppend_1KiB_10Goroutines_Batch1_4Partitions(b *testing.B) { benchAppend(b, 10, 1, 4) }

// BenchmarkAppend_1KiB_1Goroutine_Batch1: one synchronous publisher: one fsync per message.
func BenchmarkAppend_1KiB_1Goroutine_Batch1(b *testing.B) { benchAppend(b, 1, 1, 1) }

// fill publishes n 1 KiB messages to a 1-partition QUEUE topic "bench" (fast: UnsafeNoSync and
// big batches; the data is synced by Close).
func fill(b testing.TB, dir string, n int) {
	e, err := Open(dir, Config{Sync: UnsafeNoSync})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bench"}); err != nil {
		b.Fatal(err)
	}
	const batch = 1000
	msgs := make([]storage.AppendMessage, batch)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload1KiB}
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 4 {
		wg.Go(func() {
			for next.Add(batch) <= int64(n) {
				if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bench", Messages: msgs}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := e.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkClaimAck_1KiB_Batch100: one member claims 100 messages and acks them in one call,
// from a backlog. Each ack waits for its fsync.
func BenchmarkClaimAck_1KiB_Batch100(b *testing.B) { benchClaimAck(b, 1, 100) }

// BenchmarkClaimAck_1KiB_Batch10_16Groups: 16 PUB_SUB groups, one member each, claiming and acking
// 10 at a time in parallel: fan-out and the per-subscription locks.
func BenchmarkClaimAck_1KiB_Batch10_16Groups(b *testing.B) { benchClaimAck(b, 16, 10) }

// BenchmarkClaimAck_1KiB_Batch10_16Groups_Refcount: the same on a refcount topic (completion
// records kept per ack).
func BenchmarkClaimAck_1KiB_Batch10_16Groups_Refcount(b *testing.B) {
	benchClaimAckMode(b, 16, 10, storage.Refcount)
}

func benchClaimAck(b *testing.B, groups, batch int) { benchClaimAckMode(b, groups, batch, "") }

func benchClaimAckMode(b *testing.B, groups, batch int, mode storage.CompletionTracking) {
	var counter syncCounter
	dir := b.TempDir()
	e := openBench(b, dir, &counter, func(c *Config) { c.Sync = UnsafeNoSync })
	ctx := context.Background()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bench",
		Config: storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: mode}}); err != nil {
		b.Fatal(err)
	}
	subs := make([]int64, groups)
	for i := range subs {
		s, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "bench", Group: fmt.Sprintf("g%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		subs[i] = s.ID
	}
	perGroup := b.N
	msgs := make([]storage.AppendMessage, 1000)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload1KiB}
	}
	for n := 0; n < perGroup+batch; n += len(msgs) {
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bench", Messages: msgs}); err != nil {
			b.Fatal(err)
		}
	}
	e.Close()
	e = openBench(b, dir, &counter) // SyncAlways for the measured part
	defer e.Close()
	counter.rounds.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	var total atomic.Int64
	for _, id := range subs {
		wg.Go(func() {
			for got := 0; got < perGroup; {
				res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: id, Member: "m", Max: batch})
				if err != nil || len(res.Deliveries) == 0 {
					b.Errorf("claim: %v, %d deliveries", err, len(res.Deliveries))
					return
				}
				if _, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: id, Refs: refs(res.Deliveries)}); err != nil {
					b.Error(err)
					return
				}
				got += len(res.Deliveries)
				total.Add(int64(len(res.Deliveries)))
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(total.Load())/el.Seconds(), "deliveries/s")
	if r := counter.rounds.Load(); r > 0 {
		b.ReportMetric(float64(total.Load())/float64(r), "acked/fsync")
	}
}

const million = 1_000_000

// backlogDir returns a directory holding 1,000,000 retained 1 KiB messages in one partition and
// one subscription (the queue subscription, nothing consumed). It is built once per process under
// SPOOL_BENCH_DIR (default: a temp dir removed at exit) and reused when it already exists there.
var backlogOnce struct {
	sync.Once
	dir     string
	created bool // a temp dir TestMain removes
}

// TestMain removes the backlog directory the benchmarks built in a temp dir.
func TestMain(m *testing.M) {
	code := m.Run()
	if backlogOnce.created {
		os.RemoveAll(backlogOnce.dir)
	}
	os.Exit(code)
}

func backlogDir(b *testing.B) string {
	backlogOnce.Do(func() {
		dir := os.Getenv("SPOOL_BENCH_DIR")
		if dir == "" {
			d, err := os.MkdirTemp("", "spool-bench-1m-")
			if err != nil {
				b.Fatal(err)
			}
			dir = d
			backlogOnce.created = true
		}
		if _, err := os.Stat(dir + "/topics/bench"); err != nil {
			start := time.Now()
			fill(b, dir, million)
			b.Logf("built a backlog of %d messages in %s", million, time.Since(start))
		}
		backlogOnce.dir = dir
	})
	return backlogOnce.dir
}

// BenchmarkRecovery_1M: Open (and Close) of a directory holding 1,000,000 retained 1 KiB messages
// with one subscription. Target: Open at most 3 s.
func BenchmarkRecovery_1M(b *testing.B) {
	dir := backlogDir(b)
	b.ResetTimer()
	var openTotal time.Duration
	for range b.N {
		start := time.Now()
		e, err := Open(dir, Config{})
		if err != nil {
			b.Fatal(err)
		}
		openTotal += time.Since(start)
		st, err := e.TopicStats(context.Background(), "bench")
		if err != nil || st.Messages != million {
			b.Fatalf("stats %+v %v", st, err)
		}
		e.Close()
	}
	b.ReportMetric(openTotal.Seconds()/float64(b.N), "open-s")
}

// BenchmarkBacklogRSS_1M measures the resident memory of a fresh process (this test binary,
// re-executed) that opens the 1,000,000-message backlog and claims and acks 1,000 messages. Target:
// under 150 MiB.
func BenchmarkBacklogRSS_1M(b *testing.B) {
	dir := backlogDir(b)
	for range b.N {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBacklogRSSChild$", "-test.v")
		cmd.Env = append(os.Environ(), "SPOOL_RSS_DIR="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("child: %v\n%s", err, out)
		}
		var rss, heap float64
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 4 && f[len(f)-4] == "RSS_KIB" {
				rss, _ = strconv.ParseFloat(f[len(f)-3], 64)
				heap, _ = strconv.ParseFloat(f[len(f)-1], 64)
			}
		}
		if rss == 0 {
			b.Fatalf("no RSS line in child output:\n%s", out)
		}
		b.ReportMetric(rss/1024, "RSS-MiB")
		b.ReportMetric(heap/1024, "heap-MiB")
	}
}

// BenchmarkRecovery_StateLog64MiB: Open after a crash that left 64 MiB of state records after the
// last snapshot (the most a running engine leaves with the default StateLogSnapshotBytes): one
// subscription, messages claimed 100 at a time and acked one by one, out of order.
func BenchmarkRecovery_StateLog64MiB(b *testing.B) {
	dir := b.TempDir()
	const target = 64 << 20
	e, err := Open(dir, Config{Sync: UnsafeNoSync, StateLogSnapshotBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bench"}); err != nil {
		b.Fatal(err)
	}
	q, _ := e.SubscriptionGetByGroup(ctx, "bench", storage.QueueGroup)
	msgs := make([]storage.AppendMessage, 1000)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("x")}
	}
	for e.stateBytes.Load() < target {
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bench", Messages: msgs}); err != nil {
			b.Fatal(err)
		}
		for range 10 {
			res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 100})
			if err != nil {
				b.Fatal(err)
			}
			for i := len(res.Deliveries) - 1; i >= 0; i-- {
				e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID, Refs: []storage.DeliveryRef{res.Deliveries[i].Ref()}})
			}
		}
	}
	records := e.state.NextIndex()
	e.crashForTest()
	b.ResetTimer()
	var openTotal time.Duration
	for range b.N {
		start := time.Now()
		// A high threshold: no background snapshot compacts the log for the next iteration.
		e, err := Open(dir, Config{StateLogSnapshotBytes: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		openTotal += time.Since(start)
		b.StopTimer()
		e.crashForTest()
		b.StartTimer()
	}
	b.ReportMetric(openTotal.Seconds()/float64(b.N), "open-s")
	b.ReportMetric(float64(records)/(openTotal.Seconds()/float64(b.N)), "records/s")
}

package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// Benchmarks of ordered groups (issue 17): rebalance time of a 10-member group (target 200 ms)
// and ordered throughput on 16 partitions, on the embedded engine and on PostgreSQL
// (TEST_DATABASE_URL). Run them alone: see docs/benchmarks.md.

// benchEngine opens the engine named kind ("wal" or "pg") for a benchmark.
func benchEngine(b *testing.B, kind string) storage.Engine {
	b.Helper()
	switch kind {
	case "wal":
		eng, err := wal.Open(b.TempDir(), wal.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = eng.Close() })
		return eng
	default:
		url := testutil.DatabaseURL(b)
		eng, err := pgstore.Open(context.Background(), pgstore.Config{URL: url, Schema: testutil.PGSchema(b, url, "bench_"), Migrate: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = eng.Close() })
		return eng
	}
}

// benchBroker starts a broker on eng whose rebalances report to onRebalance (may be nil).
func benchBroker(b *testing.B, eng storage.Engine, onRebalance func(RebalanceInfo)) *Broker {
	b.Helper()
	br, err := New(Config{Engine: eng, RetentionInterval: -1, RebalanceDelay: -1, OnRebalance: onRebalance})
	if err != nil {
		b.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Stop(context.Background()) })
	return br
}

// BenchmarkOrderedRebalance measures the rebalance of a 10-member ordered group on a 16-partition
// topic: one op is an eleventh member joining until the assignment that includes it is stored
// (no debounce: RebalanceDelay -1), then leaving until the one without it is. Reports
// ms/rebalance (the mean of the two) and the owner's own time from the rebalance's start to the
// assignment stored (ms/assign).
func BenchmarkOrderedRebalance(b *testing.B) {
	for _, kind := range []string{"wal", "pg"} {
		b.Run(kind, func(b *testing.B) {
			var assignNanos, assigns atomic.Int64
			gens := make(chan int64, 16)
			eng := benchEngine(b, kind)
			br := benchBroker(b, eng, func(ri RebalanceInfo) {
				assignNanos.Add(int64(ri.Took))
				assigns.Add(1)
				select {
				case gens <- ri.Generation:
				default:
				}
			})
			ctx := context.Background()
			if _, err := br.CreateTopic(ctx, "ob", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 16}); err != nil {
				b.Fatal(err)
			}
			sub := func(id string) *Member {
				m, err := br.Subscribe(ctx, SubscribeParams{Pattern: "ob", Group: "g", MemberID: id, Mode: storage.ModeOrdered})
				if err != nil {
					b.Fatal(err)
				}
				return m
			}
			for i := range 10 {
				sub(fmt.Sprintf("m%02d", i))
			}
			// Wait for the assignment of the ten.
			waitMembers := func(n int) {
				for {
					a, err := br.GroupAssignment(ctx, "ob", "g")
					if err != nil {
						b.Fatal(err)
					}
					if len(a.Members) == n {
						return
					}
					select {
					case <-gens:
					case <-time.After(10 * time.Second):
						b.Fatalf("no assignment of %d members within 10 s", n)
					}
				}
			}
			waitMembers(10)
			assignNanos.Store(0)
			assigns.Store(0)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				m := sub("m99")
				waitMembers(11)
				if err := m.Close(ctx); err != nil {
					b.Fatal(err)
				}
				waitMembers(10)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(elapsed.Milliseconds())/float64(2*b.N), "ms/rebalance")
			if n := assigns.Load(); n > 0 {
				b.ReportMetric(float64(assignNanos.Load())/float64(n)/1e6, "ms/assign")
			}
		})
	}
}

// BenchmarkOrderedThroughput16 measures ordered delivery on a 16-partition topic: 4 members of
// one ordered group (max_in_flight_per_partition 1, the default, and 16 per partition), keyed
// 1 KiB messages published in batches of 64 beforehand by one publisher, each member acking every
// delivery at once. One op is one message delivered and acked; reports msg/s.
func BenchmarkOrderedThroughput16(b *testing.B) {
	for _, kind := range []string{"wal", "pg"} {
		for _, perPart := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/per_partition=%d", kind, perPart), func(b *testing.B) { benchOrdered(b, kind, perPart) })
		}
	}
}

func benchOrdered(b *testing.B, kind string, perPart int) {
	eng := benchEngine(b, kind)
	br := benchBroker(b, eng, nil)
	ctx := context.Background()
	const parts = 16
	if _, err := br.CreateTopic(ctx, "ot", storage.TopicConfig{Semantics: storage.PubSub, Partitions: parts}); err != nil {
		b.Fatal(err)
	}
	// The group exists before the messages (FROM_BEGINNING), so they are all claimable at once.
	var ms []*Member
	for i := range 4 {
		m, err := br.Subscribe(ctx, SubscribeParams{Pattern: "ot", Group: "g", MemberID: fmt.Sprintf("m%d", i), Mode: storage.ModeOrdered,
			MaxInFlightPerPartition: perPart, MaxInFlight: 64, Start: storage.StartPosition{Kind: storage.FromBeginning}})
		if err != nil {
			b.Fatal(err)
		}
		ms = append(ms, m)
	}
	for _, m := range ms {
		if err := m.SetMaxInFlight(0); err != nil { // nothing delivered while publishing
			b.Fatal(err)
		}
	}
	payload := make([]byte, 1024)
	msgs := make([]storage.AppendMessage, 0, 64)
	for i := 0; i < b.N; {
		msgs = msgs[:0]
		for ; len(msgs) < 64 && i < b.N; i++ {
			p := int32(i % parts)
			msgs = append(msgs, storage.AppendMessage{Partition: p, Key: []byte{byte(p)}, Payload: payload})
		}
		if _, err := br.Publish(ctx, "ot", msgs); err != nil {
			b.Fatal(err)
		}
	}
	total := int64(b.N)
	var acked atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	b.SetBytes(1024)
	b.ResetTimer()
	start := time.Now()
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case d := <-m.Deliveries():
					if err := m.Ack(ctx, d.SubscriptionID, d.Ref()); err != nil {
						b.Error(err)
						return
					}
					if acked.Add(1) >= total {
						once.Do(func() { close(done) })
					}
				case <-done:
					return
				}
			}
		}()
		if err := m.SetMaxInFlight(64); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("acked %d of %d", acked.Load(), total)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msg/s")
	wg.Wait()
}

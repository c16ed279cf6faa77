package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// BenchmarkPublishConsume_1KiB measures end to end throughput through the broker on the wal engine
// (fsync on, group commit): publishers append 1 KiB messages to one QUEUE topic, 4 members receive
// and ack them (each acking what it has received in one call, as a client batching acks does).
// One op is one message published, delivered and acked. Reports msg/s.
func BenchmarkPublishConsume_1KiB(b *testing.B) {
	for _, bc := range []struct {
		name       string
		publishers int
		batch      int
	}{
		{"pub=1/batch=1", 1, 1},
		{"pub=4/batch=1", 4, 1},
		{"pub=1/batch=64", 1, 64},
	} {
		b.Run(bc.name, func(b *testing.B) { benchPublishConsume(b, bc.publishers, bc.batch) })
	}
}

func benchPublishConsume(b *testing.B, publishers, batch int) {
	eng, err := wal.Open(b.TempDir(), wal.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	br, err := New(Config{Engine: eng, RetentionInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := br.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer br.Stop(ctx)
	if _, err := br.CreateTopic(ctx, "bench", storage.TopicConfig{Semantics: storage.Queue}); err != nil {
		b.Fatal(err)
	}
	total := int64(b.N)
	var acked atomic.Int64
	done := make(chan struct{})
	var closeDone sync.Once
	var wg sync.WaitGroup
	for range 4 {
		m, err := br.Subscribe(ctx, SubscribeParams{Pattern: "bench", MaxInFlight: 64})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			refs := make([]storage.DeliveryRef, 0, 64)
			for {
				var d *storage.Delivery
				select {
				case d = <-m.Deliveries():
				case <-done:
					return
				}
				refs = append(refs[:0], d.Ref())
				sub := d.SubscriptionID
			more:
				for len(refs) < cap(refs) {
					select {
					case d = <-m.Deliveries():
						refs = append(refs, d.Ref())
					default:
						break more
					}
				}
				if err := m.Ack(ctx, sub, refs...); err != nil {
					b.Error(err)
					return
				}
				if acked.Add(int64(len(refs))) >= total {
					closeDone.Do(func() { close(done) })
				}
			}
		}()
	}
	payload := make([]byte, 1024)
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var pwg sync.WaitGroup
	for range publishers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			msgs := make([]storage.AppendMessage, 0, batch)
			for {
				n := next.Add(int64(batch))
				first := n - int64(batch)
				if first >= total {
					return
				}
				k := min(int64(batch), total-first)
				msgs = msgs[:0]
				for range k {
					msgs = append(msgs, storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload})
				}
				if _, err := br.Publish(ctx, "bench", msgs); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	pwg.Wait()
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatalf("acked %d of %d", acked.Load(), total)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msg/s")
	wg.Wait()
}

package client

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Benchmarks against the in-process broker (wal engine with fsync on every group commit, the
// broker, the TCP server on 127.0.0.1). They measure the whole path: client encoding, loopback
// TCP, server, broker, engine append and fsync, and the answer. Run them with
// `go test -run '^$' -bench . ./client/`.

const benchPayloadSize = 1 << 10

// benchClient dials the broker for a benchmark with logs discarded.
func benchClient(b *testing.B, tb *testBroker, opts ...Opt) *Client {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := Dial(ctx, tb.addr, opts...)
	if err != nil {
		b.Fatalf("Dial: %v", err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

func reportRate(b *testing.B, n int, took time.Duration) {
	b.ReportMetric(float64(n)/took.Seconds(), "msg/s")
}

// BenchmarkPublishSync_1KiB_10Publishers: ten goroutines each publish 1 KiB messages with the
// synchronous Publish (one message per request, each waiting for its durable acknowledgement).
// SharedClient: the ten share one Client (one connection); ClientPerPublisher: each has its own.
func BenchmarkPublishSync_1KiB_10Publishers(b *testing.B) {
	const publishers = 10
	for _, shared := range []bool{true, false} {
		name := "ClientPerPublisher"
		if shared {
			name = "SharedClient"
		}
		b.Run(name, func(b *testing.B) {
			tb := startBroker(b, nil)
			clients := make([]*Client, publishers)
			for i := range clients {
				if shared && i > 0 {
					clients[i] = clients[0]
					continue
				}
				clients[i] = benchClient(b, tb)
			}
			payload := make([]byte, benchPayloadSize)
			b.SetBytes(benchPayloadSize)
			b.ReportAllocs()
			var next atomic.Int64
			var failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for i := range publishers {
				wg.Go(func() {
					ctx := context.Background()
					for next.Add(1) <= int64(b.N) {
						if _, err := clients[i].Publish(ctx, "bench.sync", Message{Payload: payload}); err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d publishes failed", n)
			}
			reportRate(b, b.N, took)
		})
	}
}

// BenchmarkPublishAsync_1KiB: one goroutine publishes 1 KiB messages with PublishAsync (window
// 1024) and waits for every acknowledgement (Flush) before the timer stops.
func BenchmarkPublishAsync_1KiB(b *testing.B) {
	tb := startBroker(b, nil)
	c := benchClient(b, tb)
	payload := make([]byte, benchPayloadSize)
	var failed atomic.Int64
	cb := func(_ Position, err error) {
		if err != nil {
			failed.Add(1)
		}
	}
	b.SetBytes(benchPayloadSize)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		c.PublishAsync("bench.async", Message{Payload: payload}, cb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d publishes failed", n)
	}
	reportRate(b, b.N, took)
}

// BenchmarkConsume_1KiB: one subscription (Concurrency 4, credit 64) consumes and acks b.N
// messages published beforehand; the timer covers subscribe to last handler return.
func BenchmarkConsume_1KiB(b *testing.B) {
	tb := startBroker(b, nil)
	c := benchClient(b, tb)
	payload := make([]byte, benchPayloadSize)
	for range b.N {
		c.PublishAsync("bench.consume", Message{Payload: payload}, nil)
	}
	if err := c.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	done := make(chan struct{})
	b.SetBytes(benchPayloadSize)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "bench.consume", MaxInFlight: 64}, func(context.Context, *Delivery) error {
		if got.Add(1) == int64(b.N) {
			close(done)
		}
		return nil
	}, Concurrency(4))
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("consumed %d of %d", got.Load(), b.N)
	}
	took := time.Since(start)
	b.StopTimer()
	_ = sub.Close(context.Background())
	reportRate(b, b.N, took)
}

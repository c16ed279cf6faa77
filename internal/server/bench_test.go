package server

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Benchmarks over real TCP (loopback) against a server on the real wal engine with fsync: they
// measure the server's share (framing, one request at a time per connection, delivery batching)
// on top of the engine's group commit. Run with: go test -run '^$' -bench . ./internal/server

// BenchmarkPublish_128B_Batch1_Conns1: one connection, one 128-byte message per Publish, waiting for
// each PublishOK: one fsync per message.
func BenchmarkPublish_128B_Batch1_Conns1(b *testing.B)   { runPublish(b, 1, 1) }
func BenchmarkPublish_128B_Batch1_Conns16(b *testing.B)  { runPublish(b, 16, 1) }
func BenchmarkPublish_128B_Batch100_Conns1(b *testing.B) { runPublish(b, 1, 100) }
func BenchmarkPublish_128B_Batch100_Conns4(b *testing.B) { runPublish(b, 4, 100) }

// runPublish publishes b.N messages in batches of batch over conns connections, each waiting for
// its PublishOK before the next Publish.
func runPublish(b *testing.B, conns, batch int) {
	e := newBenchEnv(b)
	clients := make([]*bclient, conns)
	for i := range clients {
		clients[i] = e.dialB(b)
	}
	payload := bytes.Repeat([]byte("x"), 128)
	msgs := make([]protocol.PublishMessage, batch)
	for i := range msgs {
		msgs[i] = protocol.PublishMessage{Partition: protocol.PartitionAuto, Payload: payload}
	}
	var next atomic.Int64
	batches := int64((b.N + batch - 1) / batch)
	b.SetBytes(128)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	done := make(chan error, conns)
	for i := range clients {
		c := clients[i]
		go func() {
			for next.Add(1) <= batches {
				corr := c.corr + 1
				c.corr = corr
				if err := c.w.WriteMessage(corr, &protocol.Publish{Topic: "bench", Messages: msgs}); err != nil {
					done <- err
					return
				}
				if err := c.w.Flush(); err != nil {
					done <- err
					return
				}
				if _, m, err := c.r.ReadServerMessage(); err != nil {
					done <- err
					return
				} else if _, ok := m.(*protocol.PublishOK); !ok {
					done <- fmt.Errorf("got %v", m)
					return
				}
			}
			done <- nil
		}()
	}
	for range clients {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(batches*int64(batch))/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkDeliverAck_128B: messages already stored are delivered to one binary consumer with
// credit 1000, which acks each Deliver frame in one Ack.
func BenchmarkDeliverAck_128B(b *testing.B) {
	e := newBenchEnv(b)
	pub := e.dialB(b)
	payload := bytes.Repeat([]byte("x"), 128)
	for sent := 0; sent < b.N; {
		n := min(1000, b.N-sent)
		msgs := make([]protocol.PublishMessage, n)
		for i := range msgs {
			msgs[i] = protocol.PublishMessage{Partition: protocol.PartitionAuto, Payload: payload}
		}
		if _, ok := pub.request(&protocol.Publish{Topic: "bench.deliver", Messages: msgs}).(*protocol.PublishOK); !ok {
			b.Fatal("publish failed")
		}
		sent += n
	}
	c := e.dialB(b)
	b.SetBytes(128)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	c.send(&protocol.Subscribe{Topic: "bench.deliver", MaxInFlight: 1000})
	for got := 0; got < b.N; {
		_, m := c.read()
		d, ok := m.(*protocol.Deliver)
		if !ok {
			continue
		}
		got += len(d.Deliveries)
		refs := make([]protocol.Ref, len(d.Deliveries))
		for i := range d.Deliveries {
			refs[i] = d.Deliveries[i].Ref()
		}
		c.send(&protocol.Ack{Refs: refs})
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// newBenchEnv starts a server for a benchmark, logging warnings only.
func newBenchEnv(b *testing.B) *env {
	b.Helper()
	return newEnv(b, nil, nil)
}

// dialB connects a binary client.
func (e *env) dialB(b *testing.B) *bclient {
	b.Helper()
	return e.dial(nil)
}

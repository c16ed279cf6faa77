package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// testLogger sends engine logs to t.Log when SPOOL_DEBUG is set, else discards them.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("SPOOL_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// fakeClock is a storage.Clock that moves only when advanced.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// harness is one engine over a t.TempDir() with a fake clock.
type harness struct {
	t     testing.TB
	dir   string
	clock *fakeClock
	cfg   Config
	e     *Engine
	ctx   context.Context
}

func newHarness(t testing.TB, mods ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, dir: t.TempDir(), clock: newFakeClock(), ctx: context.Background()}
	h.cfg = Config{SegmentBytes: 64 << 10, Logger: testLogger(t)}
	for _, m := range mods {
		m(&h.cfg)
	}
	h.cfg.Clock = h.clock
	h.open()
	t.Cleanup(func() {
		if h.e != nil {
			h.e.Close()
		}
	})
	return h
}

func (h *harness) open() {
	h.t.Helper()
	e, err := Open(h.dir, h.cfg)
	if err != nil {
		h.t.Fatalf("open: %v", err)
	}
	h.e = e
}

// restart closes the engine cleanly (final snapshot) and opens it again.
func (h *harness) restart() {
	h.t.Helper()
	if err := h.e.Close(); err != nil {
		h.t.Fatalf("close: %v", err)
	}
	h.open()
}

// crash stops the engine the way a process crash would leave its files once the page cache is
// written: everything queued reaches the logs, but no final snapshot is taken. Then it reopens.
func (h *harness) crash() {
	h.t.Helper()
	h.e.crashForTest()
	h.open()
}

// crashForTest closes the engine without the final snapshot.
func (e *Engine) crashForTest() {
	e.mu.Lock()
	e.closed = true
	var ts []*topic
	for _, t := range e.topics {
		ts = append(ts, t)
	}
	e.mu.Unlock()
	close(e.quit)
	e.wg.Wait()
	for _, t := range ts {
		t.inflight.Wait()
	}
	e.closeFiles()
}

func (h *harness) must(err error, what string) {
	h.t.Helper()
	if err != nil {
		h.t.Fatalf("%s: %v", what, err)
	}
}

func (h *harness) createTopic(name string, cfg storage.TopicConfig) *storage.Topic {
	h.t.Helper()
	tp, err := h.e.TopicCreate(h.ctx, &storage.TopicCreateParams{Name: name, Config: cfg})
	h.must(err, "create topic "+name)
	return tp
}

func (h *harness) publish(topic string, msgs ...storage.AppendMessage) []storage.MessagePosition {
	h.t.Helper()
	res, err := h.e.MessagesAppend(h.ctx, &storage.MessagesAppendParams{Topic: topic, Messages: msgs})
	h.must(err, "publish to "+topic)
	return res.Positions
}

func (h *harness) publishN(topic string, n int) []storage.MessagePosition {
	h.t.Helper()
	msgs := make([]storage.AppendMessage, n)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "m%d", i)}
	}
	return h.publish(topic, msgs...)
}

func (h *harness) queueSub(topic string) *storage.Subscription {
	h.t.Helper()
	s, err := h.e.SubscriptionGetByGroup(h.ctx, topic, storage.QueueGroup)
	h.must(err, "queue subscription of "+topic)
	return s
}

func (h *harness) subscribe(topic, group string, start storage.StartPosition) *storage.Subscription {
	h.t.Helper()
	s, err := h.e.SubscriptionCreate(h.ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: group, Start: start})
	h.must(err, "subscribe "+group)
	return s
}

func (h *harness) claimP(p storage.DeliveriesClaimParams) *storage.DeliveriesClaimResult {
	h.t.Helper()
	res, err := h.e.DeliveriesClaim(h.ctx, &p)
	h.must(err, "claim")
	return res
}

func (h *harness) claim(sub int64, member string, max int) []*storage.Delivery {
	h.t.Helper()
	return h.claimP(storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: max}).Deliveries
}

func (h *harness) ack(sub int64, refs ...storage.DeliveryRef) *storage.DeliveriesAckResult {
	h.t.Helper()
	res, err := h.e.DeliveriesAck(h.ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Refs: refs})
	h.must(err, "ack")
	return res
}

func (h *harness) stats(sub int64) *storage.SubscriptionStats {
	h.t.Helper()
	st, err := h.e.SubscriptionStats(h.ctx, sub)
	h.must(err, "stats")
	return st
}

func refs(ds []*storage.Delivery) []storage.DeliveryRef {
	out := make([]storage.DeliveryRef, len(ds))
	for i, d := range ds {
		out[i] = d.Ref()
	}
	return out
}

func errIs(t testing.TB, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}

func equal[T comparable](t testing.TB, got, want T, what string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

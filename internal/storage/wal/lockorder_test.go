package wal

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// TestRetentionLocksSubsInIDOrder: retention locks the subscriptions of a topic in ID order, the
// CANCELLED ones whose completion records it trims included (commit 0b3fdac). The test holds the
// lock of a CANCELLED subscription and, once retention waits for it, takes the lock of a higher
// one, as any code following the rule may: retention must not hold that one meanwhile. Locking
// the CANCELLED one after the others deadlocks here; the timeout only reports it.
func TestRetentionLocksSubsInIDOrder(t *testing.T) {
	h := newHarness(t)
	h.createTopic("rc", storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount,
		MessageRetention: 3 * time.Second})
	low := h.subscribe("rc", "low", storage.StartPosition{})
	high := h.subscribe("rc", "high", storage.StartPosition{})
	h.publishN("rc", 10)
	for _, s := range []*storage.Subscription{low, high} {
		h.ack(s.ID, refs(h.claimAll(s.ID, "m"))...)
	}
	_, err := h.e.SubscriptionUpdate(h.ctx, &storage.SubscriptionUpdateParams{ID: low.ID, State: storage.Cancelled})
	h.must(err, "cancel low")
	h.clock.Advance(10 * time.Second) // the 10 messages are complete and old: retention cuts them
	h.e.mu.RLock()
	sLow, sHigh := h.e.subs[low.ID], h.e.subs[high.ID]
	h.e.mu.RUnlock()
	if sLow.rc == nil || sLow.st != nil {
		t.Fatal("the CANCELLED subscription should keep its completion records and no delivery state")
	}

	sLow.mu.Lock()
	done := make(chan error, 1)
	go func() {
		res, err := h.e.RetentionApply(h.ctx)
		if err == nil && res.MessagesDeleted != 10 {
			t.Errorf("retention deleted %d messages, want 10", res.MessagesDeleted)
		}
		done <- err
	}()
	// Wait until retention waits for a subscription lock (the only one held is low's).
	for !goroutineWaits("wal.(*Engine).retainTopic", "sync.(*Mutex).Lock") {
		runtime.Gosched()
	}
	got := make(chan struct{})
	go func() {
		sHigh.mu.Lock()
		_ = sHigh.st.Floor(0) // what a holder of the lock may read
		sHigh.mu.Unlock()
		close(got)
	}()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Error("deadlock: retention holds a higher subscription's lock while it waits for the CANCELLED one's")
	}
	sLow.mu.Unlock()
	<-got
	h.must(<-done, "retention")
}

// goroutineWaits reports whether some goroutine's stack has both fn and wait.
func goroutineWaits(fn, wait string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) && strings.Contains(g, wait) {
			return true
		}
	}
	return false
}

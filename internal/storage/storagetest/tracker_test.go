package storagetest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// The tracker is the suite's invariant checker for leases, acks and attempts: these tests feed it
// event sequences directly and check that it reports exactly the violations (and no false alarm
// for interleavings concurrent cases produce).

type trackerBundle struct {
	clock *FakeClock
	tr    *tracker

	mu  sync.Mutex
	got []string
}

func setupTracker(t *testing.T) *trackerBundle {
	t.Helper()
	b := &trackerBundle{clock: NewFakeClock(baseTime)}
	b.tr = newTracker(func(format string, args ...any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.got = append(b.got, fmt.Sprintf(format, args...))
	}, b.clock)
	return b
}

const trackedSub = 7

func delivery(p int32, o int64, attempt int, member string, deadline time.Time) *storage.Delivery {
	return &storage.Delivery{Message: storage.Message{Partition: p, Offset: o}, SubscriptionID: trackedSub,
		Attempt: attempt, Member: member, LeaseDeadline: deadline}
}

// claim records a claim that starts and ends now.
func (b *trackerBundle) claim(member string, max int, ds ...*storage.Delivery) {
	b.startClaim()(member, max, ds...)
}

// startClaim starts a claim now and returns the function that records its result.
func (b *trackerBundle) startClaim() func(member string, max int, ds ...*storage.Delivery) {
	start, clockStart := b.tr.begin()
	return func(member string, max int, ds ...*storage.Delivery) {
		b.tr.claimed(&storage.DeliveriesClaimParams{SubscriptionID: trackedSub, Member: member, Max: max}, start, clockStart,
			&storage.DeliveriesClaimResult{Deliveries: ds})
	}
}

func (b *trackerBundle) lease(d time.Duration) time.Time { return b.clock.Now().Add(d) }

// requireViolations checks the reports: one per wanted substring, in order.
func (b *trackerBundle) requireViolations(t *testing.T, want ...string) {
	t.Helper()
	b.tr.checkAttemptSequences()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.got) != len(want) {
		t.Fatalf("got %d violations, want %d:\n%s", len(b.got), len(want), strings.Join(b.got, "\n"))
	}
	for i, w := range want {
		if !strings.Contains(b.got[i], w) {
			t.Fatalf("violation %d is %q, want it to mention %q", i, b.got[i], w)
		}
	}
}

func TestTrackerCleanHistory(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 5, delivery(0, 0, 1, "m1", b.lease(30*time.Second)), delivery(0, 1, 1, "m1", b.lease(30*time.Second)),
		delivery(0, 2, 1, "m1", b.lease(30*time.Second)))
	b.tr.releaseBegin(trackedSub, "m2", []storage.DeliveryRef{ref(0, 0)}, true) // any member may ack
	b.tr.acked(trackedSub, []storage.DeliveryRef{ref(0, 0)}, nil)
	b.tr.releaseBegin(trackedSub, "m1", []storage.DeliveryRef{ref(0, 1)}, false) // nack by the holder
	b.claim("m2", 1, delivery(0, 1, 2, "m2", b.lease(30*time.Second)))
	b.clock.Advance(31 * time.Second) // m1's lease on 0:2 expired
	b.claim("m2", 1, delivery(0, 2, 2, "m2", b.lease(30*time.Second)))
	b.tr.releaseMember(trackedSub, "m2")
	b.claim("m3", 2, delivery(0, 1, 3, "m3", b.lease(30*time.Second)), delivery(0, 2, 3, "m3", b.lease(30*time.Second)))
	if live := b.tr.liveLeases(b.clock.Now()); live[trackedSub] != 2 {
		t.Fatalf("live leases %v, want 2", live)
	}
	b.requireViolations(t)
}

func TestTrackerLeasedTwice(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 1, delivery(0, 0, 1, "m1", b.lease(30*time.Second)))
	b.clock.Advance(10 * time.Second)
	b.claim("m2", 1, delivery(0, 0, 2, "m2", b.lease(30*time.Second)))
	b.claim("m1", 1, delivery(0, 1, 1, "m1", b.lease(30*time.Second)))
	b.claim("m1", 1, delivery(0, 1, 2, "m1", b.lease(30*time.Second))) // the same member counts too
	b.requireViolations(t, "0:0 leased twice", "0:1 leased twice")
}

func TestTrackerNackByOtherMemberDoesNotRelease(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 1, delivery(0, 0, 1, "m1", b.lease(30*time.Second)))
	b.tr.releaseBegin(trackedSub, "m2", []storage.DeliveryRef{ref(0, 0)}, false)
	b.tr.releaseMember(trackedSub, "m3")
	b.claim("m2", 1, delivery(0, 0, 2, "m2", b.lease(30*time.Second)))
	b.requireViolations(t, "leased twice")
}

// TestTrackerExtendShortens: an extend sets the deadline to now + Duration, also when that is
// earlier; one still running when a claim ran may already have been applied.
func TestTrackerExtendShortens(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 2, delivery(0, 0, 1, "m1", b.lease(30*time.Second)), delivery(0, 1, 1, "m1", b.lease(30*time.Second)))
	b.tr.extended(trackedSub, "m1", []storage.DeliveryRef{ref(0, 0)}, &storage.DeliveriesExtendResult{Deadline: b.lease(2 * time.Second), Extended: 1})
	finish := b.startClaim()
	b.tr.extended(trackedSub, "m1", []storage.DeliveryRef{ref(0, 1)}, &storage.DeliveriesExtendResult{Deadline: b.lease(2 * time.Second), Extended: 1})
	b.clock.Advance(5 * time.Second)
	finish("m2", 2, delivery(0, 0, 2, "m2", b.lease(30*time.Second)), delivery(0, 1, 2, "m2", b.lease(30*time.Second)))
	b.requireViolations(t)
}

func TestTrackerExtend(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 2, delivery(0, 0, 1, "m1", b.lease(30*time.Second)), delivery(0, 1, 1, "m1", b.lease(30*time.Second)))
	b.clock.Advance(20 * time.Second)
	b.tr.extended(trackedSub, "m1", []storage.DeliveryRef{ref(0, 0), ref(0, 1)},
		&storage.DeliveriesExtendResult{Deadline: b.lease(30 * time.Second), Extended: 1, NotHeld: []storage.DeliveryRef{ref(0, 1)}})
	b.clock.Advance(20 * time.Second) // past the first deadline, before the extended one
	b.claim("m2", 2, delivery(0, 0, 2, "m2", b.lease(30*time.Second)), delivery(0, 1, 2, "m2", b.lease(30*time.Second)))
	b.requireViolations(t, "0:0 leased twice")
}

func TestTrackerRedeliveredAfterAck(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 2, delivery(0, 0, 1, "m1", b.lease(30*time.Second)), delivery(0, 1, 1, "m1", b.lease(30*time.Second)))
	b.tr.releaseBegin(trackedSub, "m1", []storage.DeliveryRef{ref(0, 0), ref(0, 1)}, true)
	b.tr.acked(trackedSub, []storage.DeliveryRef{ref(0, 0), ref(0, 1)}, []storage.DeliveryRef{ref(0, 1)})
	b.clock.Advance(time.Hour)
	b.claim("m2", 2, delivery(0, 0, 2, "m2", b.lease(30*time.Second)), delivery(0, 1, 2, "m2", b.lease(30*time.Second)))
	b.requireViolations(t, "0:0: delivered to \"m2\" (attempt 2) after an ack completed it")
}

func TestTrackerReplayRestartsAttempts(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 1, delivery(0, 0, 1, "m1", b.lease(30*time.Second)))
	b.tr.releaseBegin(trackedSub, "m1", []storage.DeliveryRef{ref(0, 0)}, false) // nack to the DLQ
	b.tr.acked(trackedSub, []storage.DeliveryRef{ref(0, 0)}, nil)                // AlreadyDone
	b.tr.replayed(trackedSub, []storage.DeliveryRef{ref(0, 0)})
	b.claim("m1", 1, delivery(0, 0, 1, "m1", b.lease(30*time.Second)))
	b.requireViolations(t)
}

func TestTrackerAttempts(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 1, delivery(0, 0, 2, "m1", b.lease(time.Second))) // first delivery must be attempt 1
	b.claim("m1", 1, delivery(0, 1, 1, "m1", b.lease(time.Second)))
	b.clock.Advance(time.Minute)
	b.claim("m1", 1, delivery(0, 1, 1, "m1", b.lease(time.Second))) // not increasing
	b.clock.Advance(time.Minute)
	b.claim("m1", 1, delivery(0, 2, 1, "m1", b.lease(time.Second)))
	b.clock.Advance(time.Minute)
	b.claim("m1", 1, delivery(0, 2, 3, "m1", b.lease(time.Second))) // skips 2 without a restart
	b.requireViolations(t, "0:1: delivered to \"m1\" with attempt 1 after an earlier delivery",
		"0:0: first delivery (replay generation 0) has attempt 2", "0:1: two deliveries with attempt 1", "0:2: attempt 1 followed by attempt 3")
}

func TestTrackerRestart(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 2, delivery(0, 0, 1, "m1", b.lease(30*time.Second)), delivery(0, 1, 1, "m1", b.lease(30*time.Second)))
	b.tr.releaseBegin(trackedSub, "m1", []storage.DeliveryRef{ref(0, 1)}, true)
	b.tr.acked(trackedSub, []storage.DeliveryRef{ref(0, 1)}, nil)
	b.tr.restarted()
	// Leases may be dropped by a restart and attempts may jump, but acks are durable.
	b.claim("m2", 2, delivery(0, 0, 3, "m2", b.lease(30*time.Second)), delivery(0, 1, 2, "m2", b.lease(30*time.Second)))
	b.requireViolations(t, "0:1: delivered to \"m2\" (attempt 2) after an ack completed it")
}

// TestTrackerConcurrentOrder: results of concurrent calls are recorded in any order; the tracker
// must not report what a legal interleaving explains.
func TestTrackerConcurrentOrder(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	// Claim A gets 0:0 (attempt 1); its lease expires; claim B gets attempt 2. B is recorded first.
	finishA := b.startClaim()
	deadlineA := b.lease(time.Second)
	b.clock.Advance(5 * time.Second)
	finishB := b.startClaim()
	finishB("m2", 1, delivery(0, 0, 2, "m2", b.lease(30*time.Second)))
	finishA("m1", 1, delivery(0, 0, 1, "m1", deadlineA))

	// m1 nacks 0:1 while m2's claim runs: the claim may see the nack.
	b.claim("m1", 1, delivery(0, 1, 1, "m1", b.lease(30*time.Second)))
	finishC := b.startClaim()
	b.tr.releaseBegin(trackedSub, "m1", []storage.DeliveryRef{ref(0, 1)}, false)
	finishC("m2", 1, delivery(0, 1, 2, "m2", b.lease(30*time.Second)))

	// An ack that returns after a claim started does not make that claim's delivery a violation.
	b.claim("m1", 1, delivery(0, 2, 1, "m1", b.lease(time.Second)))
	b.clock.Advance(5 * time.Second)
	finishD := b.startClaim()
	b.tr.releaseBegin(trackedSub, "m1", []storage.DeliveryRef{ref(0, 2)}, true)
	b.tr.acked(trackedSub, []storage.DeliveryRef{ref(0, 2)}, nil)
	finishD("m2", 1, delivery(0, 2, 2, "m2", b.lease(30*time.Second)))
	b.requireViolations(t)
}

func TestTrackerClaimResultChecks(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	start, clockStart := b.tr.begin()
	b.tr.claimed(&storage.DeliveriesClaimParams{SubscriptionID: trackedSub, Member: "m1", Max: 2, Partitions: []int32{0}}, start, clockStart,
		&storage.DeliveriesClaimResult{Deliveries: []*storage.Delivery{
			delivery(0, 0, 1, "m1", b.lease(time.Second)),
			delivery(0, 0, 1, "m1", b.lease(time.Second)),
			delivery(1, 0, 1, "m1", b.lease(time.Second)),
			delivery(0, 1, 1, "other", b.lease(time.Second)),
			delivery(0, 2, 1, "m1", b.lease(0)),
		}})
	b.mu.Lock()
	got := strings.Join(b.got, "\n")
	b.mu.Unlock()
	for _, want := range []string{"Max 2 returned 5", "returned twice by one claim", "limited to partitions", "delivery names member \"other\"", "not after the claim's time"} {
		if !strings.Contains(got, want) {
			t.Errorf("no violation mentions %q in:\n%s", want, got)
		}
	}
}

func TestTrackerReportsAreBounded(t *testing.T) {
	t.Parallel()
	b := setupTracker(t)
	b.claim("m1", 1, delivery(0, 0, 1, "m1", b.lease(time.Hour)))
	for i := range 50 {
		b.claim("m2", 1, delivery(0, 0, 2+i, "m2", b.lease(time.Hour)))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.got) != maxReported+1 || !strings.Contains(b.got[maxReported], "not shown") {
		t.Fatalf("got %d reports, want %d and a last one saying the rest are not shown", len(b.got), maxReported+1)
	}
}

func TestFakeClock(t *testing.T) {
	t.Parallel()
	c := NewFakeClock(baseTime)
	if got := c.Advance(time.Second); !got.Equal(baseTime.Add(time.Second)) || !c.Now().Equal(got) {
		t.Fatalf("Advance: %v, Now %v", got, c.Now())
	}
	c.Set(baseTime)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	if got := c.Now().Sub(baseTime); got != 800*time.Millisecond {
		t.Fatalf("after concurrent advances: %v, want 800ms", got)
	}
}

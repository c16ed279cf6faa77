package broker

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// A member's queue limit bounds what waits in its channel whatever its credit: acking the
// deliveries the consumer took, or their leases expiring, frees credit but no queue room (a
// server's per-connection bound used to let an ack batch claim the whole credit at once).
func TestQueueLimitHoldsAcrossAcksAndExpiries(t *testing.T) {
	t.Parallel()
	clock, m, s := unitMember(100)
	if err := m.SetQueueLimit(5); err != nil {
		t.Fatal(err)
	}
	now := clock.Now()
	next := int64(0)
	fill := func() int {
		now := clock.Now()
		k := m.reserve(now, s)
		ds := make([]*storage.Delivery, k)
		for i := range ds {
			ds[i] = delivery(7, next, now.Add(10*time.Second))
			next++
		}
		m.deliver(s, ds, k)
		return k
	}
	if k := fill(); k != 5 {
		t.Fatalf("first claim got %d, want the queue limit 5", k)
	}
	taken, _ := m.Take(nil)
	if len(taken) != 5 {
		t.Fatalf("took %d, want 5", len(taken))
	}
	if k := fill(); k != 5 {
		t.Fatalf("claim after take got %d, want 5", k)
	}
	// The consumer acks the 5 it took: credit comes back, queue room does not.
	refs := make([]storage.DeliveryRef, len(taken))
	for i, d := range taken {
		refs[i] = d.Ref()
	}
	if n := m.forget(7, refs); n != 5 {
		t.Fatalf("forget = %d, want 5", n)
	}
	if got := m.credit(now); got != 0 {
		t.Fatalf("credit after acks with a full queue = %d, want 0", got)
	}
	// Leases expire in the channel: still no room.
	clock.Advance(time.Minute)
	if got := m.credit(clock.Now()); got != 0 {
		t.Fatalf("credit after expiries with a full queue = %d, want 0", got)
	}
	if got := m.Waiting(); got != 5 {
		t.Fatalf("waiting = %d, want 5", got)
	}
	// Taking frees the room and wakes the owner that found none.
	if picked, _, _ := s.pick(nil); picked != nil {
		t.Fatal("picked a member with a full queue")
	}
	m.Take(nil)
	if len(s.signal) != 1 {
		t.Fatal("the waiting owner not woken when the queue was taken")
	}
	if got := m.credit(clock.Now()); got != 5 {
		t.Fatalf("credit after take = %d, want 5", got)
	}
	// Removing the limit gives the whole credit.
	if err := m.SetQueueLimit(-1); err != nil {
		t.Fatal(err)
	}
	if got := m.credit(clock.Now()); got != 100 {
		t.Fatalf("credit without limit = %d, want 100", got)
	}
}

// The same through a running broker: a member with credit 1000 and queue limit 10 never has
// more than 10 deliveries queued, also right after it acked a large batch.
func TestQueueLimitBoundsQueueAfterAckBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("ql", storage.TopicConfig{Partitions: 1})
	m := e.subscribe(SubscribeParams{Pattern: "ql", MaxInFlight: 1000})
	if err := m.SetQueueLimit(10); err != nil {
		t.Fatal(err)
	}
	e.publishN("ql", "m", 200)
	var held []*storage.Delivery
	for range 5 {
		e.waitIdle()
		if got := m.Waiting(); got != 10 {
			t.Fatalf("waiting = %d, want the queue limit 10 (%s)", got, memberState(m))
		}
		ds, _ := m.Take(nil)
		held = append(held, ds...)
	}
	e.waitIdle()
	ack(t, m, held...)
	e.waitIdle()
	if got := m.Waiting(); got > 10 {
		t.Fatalf("waiting after acking %d = %d, want at most 10", len(held), got)
	}
}

// Raising the credit step by step grows the channel geometrically (at least doubling, up to
// MaxInFlightLimit), not to exactly each new credit.
func TestSetMaxInFlightGrowsChannelGeometrically(t *testing.T) {
	t.Parallel()
	m := newMember(unitBroker(newFakeClock()), "m1", SubscribeParams{Pattern: "t"}, 10, storage.StartPosition{})
	reallocs := 0
	for n := 11; n <= 1000; n++ {
		before := m.Deliveries()
		if err := m.SetMaxInFlight(n); err != nil {
			t.Fatal(err)
		}
		if m.Deliveries() != before {
			reallocs++
		}
		if c := cap(m.Deliveries()); c < n {
			t.Fatalf("capacity %d below credit %d", c, n)
		}
	}
	if reallocs > 7 { // 10 -> 20 -> 40 -> ... -> 1280
		t.Fatalf("%d channel reallocations raising the credit from 10 to 1000 by 1, want at most 7", reallocs)
	}
	if err := m.SetMaxInFlight(MaxInFlightLimit); err != nil {
		t.Fatal(err)
	}
	if err := m.SetMaxInFlight(MaxInFlightLimit); err != nil || cap(m.Deliveries()) != MaxInFlightLimit {
		t.Fatalf("capacity %d at the limit, want %d (%v)", cap(m.Deliveries()), MaxInFlightLimit, err)
	}
}

// TakeQueued counts what it takes against the queue limit in the same step: a claim that follows
// it finds no room until the consumer raises the limit again. After Take, an owner woken by it
// could fill the whole limit again before the consumer lowered it, so the consumer's queue plus
// what it held reached twice the bound (a server's per-connection window).
func TestTakeQueuedKeepsTakenInTheLimit(t *testing.T) {
	t.Parallel()
	clock, m, s := unitMember(100)
	if err := m.SetQueueLimit(5); err != nil {
		t.Fatal(err)
	}
	now := clock.Now()
	deliverN := func(offset int64) int {
		k := m.reserve(now, s)
		ds := make([]*storage.Delivery, k)
		for i := range ds {
			ds[i] = delivery(7, offset+int64(i), now.Add(time.Minute))
		}
		m.deliver(s, ds, k)
		return k
	}
	if k := deliverN(0); k != 5 {
		t.Fatalf("first claim got %d, want 5", k)
	}
	if k := deliverN(5); k != 0 { // the full queue makes s wait for room
		t.Fatalf("claim on a full queue got %d", k)
	}
	taken, open := m.TakeQueued(nil)
	if len(taken) != 5 || !open {
		t.Fatalf("TakeQueued = %d deliveries, open %v; want 5, true", len(taken), open)
	}
	if len(s.signal) != 0 {
		t.Fatal("TakeQueued woke the owner for room it does not give")
	}
	if got := m.credit(now); got != 0 {
		t.Fatalf("room right after TakeQueued = %d, want 0 (the 5 taken still count)", got)
	}
	// The consumer handed them on: it gives the room back.
	if err := m.SetQueueLimit(5); err != nil {
		t.Fatal(err)
	}
	if len(s.signal) != 1 || m.credit(now) != 5 {
		t.Fatalf("after raising the limit: woken %d, room %d; want 1, 5", len(s.signal), m.credit(now))
	}
	if err := m.SetQueueLimit(3); err != nil {
		t.Fatal(err)
	}
	// Part of the limit taken: the rest stays usable.
	if k := deliverN(5); k != 3 {
		t.Fatalf("claim got %d, want 3", k)
	}
	if err := m.SetQueueLimit(5); err != nil {
		t.Fatal(err)
	}
	if taken, _ := m.TakeQueued(nil); len(taken) != 3 || m.credit(now) != 2 {
		t.Fatalf("TakeQueued of 3 under a limit of 5: took %d, room %d; want 3, 2", len(taken), m.credit(now))
	}
}

package policy

import (
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// orderedClaim starts an ordered claim of member "a" over 2 partitions at time 10 s.
func orderedClaim(t *testing.T, max, inFlight int) *Claim {
	t.Helper()
	var c Claim
	err := c.Start(Input{Params: &storage.DeliveriesClaimParams{Member: "a", Max: max, AvoidMember: true, Partitions: []int32{0, 1}},
		Partitions: 2, AckWait: 30e9, MaxDeliveries: 5, Now: 10 * sec, MaxInFlight: inFlight})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Ordered() {
		t.Fatal("claim with MaxInFlight is not ordered")
	}
	return &c
}

func TestLaneRedeliversInOffsetOrder(t *testing.T) {
	c := orderedClaim(t, 10, 3)
	l := c.Lane(0, 0)
	// Offset order: the first waiting message is not due, so the later due one stays too.
	if l.Redeliver(20 * sec) {
		t.Fatal("leased a message not due yet")
	}
	if l.Redeliver(5 * sec) {
		t.Fatal("leased a message behind a blocked one")
	}
	if got := l.Take(&storage.Message{}); got != Stop {
		t.Fatalf("new message behind a waiting one: %v, want Stop", got)
	}
	if next, ok := c.NextDue(); !ok || next != 20*sec {
		t.Fatalf("NextDue %d %v, want the first waiting message's due time", next, ok)
	}
	// AvoidMember does not apply: the owner is the only member who may take it.
	l = c.Lane(1, 0)
	if !l.Redeliver(sec) || l.Take(&storage.Message{}) != Lease {
		t.Fatal("due redelivery then a new message refused")
	}
}

func TestLaneMaxInFlight(t *testing.T) {
	c := orderedClaim(t, 10, 2)
	l := c.Lane(0, 1)
	if l.Take(&storage.Message{}) != Lease {
		t.Fatal("one slot: first new message refused")
	}
	if l.Take(&storage.Message{}) != Stop || !l.Blocked() {
		t.Fatal("second new message leased beyond max in flight")
	}
	if l = c.Lane(1, 2); l.Redeliver(0) {
		t.Fatal("redelivery leased beyond max in flight")
	}
	// A place given back frees the slot.
	l = c.Lane(0, 1)
	if l.Take(&storage.Message{}) != Lease {
		t.Fatal("lease refused")
	}
	l.Unlease()
	if l.Take(&storage.Message{}) != Lease {
		t.Fatal("unleased slot not reusable")
	}
	if c.Remaining() != 8 {
		t.Fatalf("remaining %d, want 8", c.Remaining())
	}
}

func TestLaneDelayBlocks(t *testing.T) {
	c := orderedClaim(t, 10, 5)
	l := c.Lane(0, 0)
	if got := l.Take(&storage.Message{NotBefore: at(11 * sec)}); got != Delay {
		t.Fatalf("future NotBefore: %v, want Delay", got)
	}
	if l.Take(&storage.Message{}) != Stop {
		t.Fatal("a later offset passed a delayed one")
	}
}

func TestLaneClaimFull(t *testing.T) {
	c := orderedClaim(t, 1, 5)
	l := c.Lane(0, 0)
	if !l.Redeliver(0) {
		t.Fatal("due redelivery refused")
	}
	if l.Redeliver(0) {
		t.Fatal("leased beyond Max")
	}
	if next, ok := c.NextDue(); !ok || next != 10*sec {
		t.Fatalf("NextDue %d %v: want now (more is due)", next, ok)
	}
}

package substate

import (
	"cmp"
	"slices"

	"github.com/spoolmq/spool/internal/storage/policy"
)

// Ordered subscriptions (policy/ordered.go): the per-partition views a claim's Lane needs, and
// the release of a partition whose owner changed. A partition of an ordered subscription has at
// most max_in_flight_per_partition leases and the few messages waiting behind them, so these
// walk its entries.

// entriesOf returns the entries of partition p (pending offsets and replayed copies) in offset
// order, a replayed copy before the pending offset of the same number.
func (pt *part) entriesOf() []*Entry {
	out := make([]*Entry, 0, len(pt.pending)+len(pt.replayed))
	for _, e := range pt.replayed {
		out = append(out, e)
	}
	for _, e := range pt.pending {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *Entry) int {
		if c := cmp.Compare(a.Offset, b.Offset); c != 0 {
			return c
		}
		return cmp.Compare(b.DLQ, a.DLQ) // replayed (DLQ != 0) first
	})
	return out
}

// InFlight returns how many messages of partition p are leased.
func (s *Sub) InFlight(p int32) int {
	pt := s.part(p)
	if pt == nil {
		return 0
	}
	n := 0
	for _, e := range pt.pending {
		if e.Leased {
			n++
		}
	}
	for _, e := range pt.replayed {
		if e.Leased {
			n++
		}
	}
	return n
}

// TakeDueOrdered presents the waiting entries of partition p to the lane in offset order and
// leases those it takes to member until deadline, with the next attempt number.
func (s *Sub) TakeDueOrdered(p int32, l *policy.Lane, member string, deadline int64) (got []*Entry) {
	pt := s.part(p)
	if pt == nil {
		return nil
	}
	for _, e := range pt.entriesOf() {
		if e.Leased {
			continue
		}
		if !l.Redeliver(e.Time) {
			break // the lane is blocked: every later entry stays
		}
		e.Attempt++
		s.setLeased(e, member, deadline)
		got = append(got, e)
	}
	return got
}

// ReleasePartition gives back every lease of partition p (its owner changed): due at now,
// attempts kept. Entries that reached maxDeliveries are returned out of both heaps for
// DeadLetter.
func (s *Sub) ReleasePartition(p int32, now int64, maxDeliveries int) (released int, dead []*Entry) {
	pt := s.part(p)
	if pt == nil {
		return 0, nil
	}
	for _, e := range pt.entriesOf() {
		if !e.Leased {
			continue
		}
		if e.Attempt >= maxDeliveries {
			s.unheap(e)
			e.Leased = false
			dead = append(dead, e)
			continue
		}
		s.setWaiting(e, now)
		released++
	}
	return released, dead
}

// HeldBy returns the offsets of partition p that member holds leased at now (batch acks and
// nacks check that they name all of them: storage.CheckBatchRefs).
func (s *Sub) HeldBy(p int32, member string, now int64) []int64 {
	pt := s.part(p)
	if pt == nil {
		return nil
	}
	var out []int64
	for _, e := range pt.entriesOf() {
		if e.Leased && e.Member == member && e.Time > now {
			out = append(out, e.Offset)
		}
	}
	return out
}

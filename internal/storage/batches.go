package storage

import (
	"fmt"
	"slices"
)

// Per-key transactional batches (issue 17 item 4, seed 003). A member of an ORDERED subscription
// may claim batches (DeliveriesClaimParams.BatchSize): per partition it owns, one batch of
// consecutive messages (in offset order, nothing undone between them), up to BatchSize, extended
// past it while the last message is Linked, so that the messages of one key that one publish
// wrote to the partition are never split between batches. The engines mark a message Linked at
// append time (LinkRuns): a publish is one MessagesAppend call, whose messages of one partition
// get consecutive offsets in both engines. A partition has at most one batch in flight: a batch
// claim leases nothing from a partition where the member holds a lease, so
// max_in_flight_per_partition does not apply (the batch is the partition's one unit in flight).
// A batch is acked or nacked as a unit: DeliveriesAckParams.Batch and DeliveriesNackParams.Batch
// refuse refs that leave out a message the member holds in their partition (ErrBatchSplit).
// The rules are policy/ordered.go's (Lane).

// Bounds of batches.
const (
	// MaxBatchSize bounds DeliveriesClaimParams.BatchSize.
	MaxBatchSize = 1000
	// MaxBatchMessages bounds the messages of one batch, its extension included: a publish's
	// run of one key longer than that is split there (so one claim holds bounded memory).
	MaxBatchMessages = 10000
)

// BatchID names the batch of a delivery: its partition's first offset in the batch and the
// number of messages in the batch (0: not a batch delivery).
type BatchID struct {
	Offset int64 `json:"offset"`
	Len    int   `json:"len"`
}

// IsZero reports whether b names no batch.
func (b BatchID) IsZero() bool { return b.Len == 0 }

// ErrBatchSplit is returned by a batch ack or nack (Batch set) whose refs leave out a message
// of the same partition that the member holds: a batch is settled as a unit. Nothing was
// changed. It wraps ErrInvalidArgument.
var ErrBatchSplit = fmt.Errorf("%w: batch split", ErrInvalidArgument)

// LinkRuns computes the Linked bits of the n messages of one publish: partOf(i) is the
// partition message i was stored in (negative: not stored, a duplicate), keyOf(i) its key.
// Message i is linked when, among the stored messages of its partition in publish order, a
// non-empty key of a message at or before it comes again after it: a batch ending at i would
// split that key's run. The last stored message of each partition is never linked. Keyless
// messages link nothing of their own (they are linked only inside another key's run).
func LinkRuns(n int, partOf func(i int) int32, keyOf func(i int) []byte) []bool {
	linked := make([]bool, n)
	byPart := map[int32][]int{}
	var order []int32
	for i := range n {
		p := partOf(i)
		if p < 0 {
			continue
		}
		if _, ok := byPart[p]; !ok {
			order = append(order, p)
		}
		byPart[p] = append(byPart[p], i)
	}
	for _, p := range order {
		idx := byPart[p]
		last := map[string]int{}
		for j, i := range idx {
			if k := keyOf(i); len(k) > 0 {
				last[string(k)] = j
			}
		}
		reach := -1
		for j, i := range idx {
			if k := keyOf(i); len(k) > 0 {
				reach = max(reach, last[string(k)])
			}
			linked[i] = reach > j
		}
	}
	return linked
}

// CheckBatchRefs checks the refs of a batch ack or nack: in every partition of refs, held (the
// offsets the member holds leased in that partition) must all be among refs. The error wraps
// ErrBatchSplit and names the first message left out.
func CheckBatchRefs(refs []DeliveryRef, held func(p int32) []int64) error {
	named := map[DeliveryRef]bool{}
	var parts []int32
	for _, r := range refs {
		named[r] = true
		if !slices.Contains(parts, r.Partition) {
			parts = append(parts, r.Partition)
		}
	}
	slices.Sort(parts)
	for _, p := range parts {
		offs := held(p)
		slices.Sort(offs)
		for _, o := range offs {
			if !named[DeliveryRef{Partition: p, Offset: o}] {
				return fmt.Errorf("%w: message %d:%d of the member's batch is not among the refs: ack or nack the whole batch", ErrBatchSplit, p, o)
			}
		}
	}
	return nil
}

// MarkBatches orders the deliveries of a batch claim by partition (in the order the partitions
// first appear) and offset, and sets each one's Batch: in a batch claim the deliveries of one
// partition are one batch.
func MarkBatches(ds []*Delivery) {
	rank := map[int32]int{}
	for _, d := range ds {
		if _, ok := rank[d.Partition]; !ok {
			rank[d.Partition] = len(rank)
		}
	}
	slices.SortStableFunc(ds, func(a, b *Delivery) int {
		if ra, rb := rank[a.Partition], rank[b.Partition]; ra != rb {
			return ra - rb
		}
		switch {
		case a.Offset < b.Offset:
			return -1
		case a.Offset > b.Offset:
			return 1
		}
		return 0
	})
	for i := 0; i < len(ds); {
		j := i
		for j < len(ds) && ds[j].Partition == ds[i].Partition {
			j++
		}
		id := BatchID{Offset: ds[i].Offset, Len: j - i}
		for k := i; k < j; k++ {
			ds[k].Batch = id
		}
		i = j
	}
}

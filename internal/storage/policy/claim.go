// Package policy holds the delivery rules of DeliveriesClaim (storage.Engine) once, for both
// engines and the conformance model: which expired leases wait for a backoff and which go to the
// DLQ, which redeliveries a claim takes and in what order, which new messages it leases, completes
// or delays, which partition it reads first, the lease deadline, and NextDue.
//
// It is pure, in the style of wal/substate: no I/O, no clock, no locks, no allocation for a claim
// without a partition filter. The engines load, persist and fence; they keep their own stores
// (the embedded engine's heaps, PostgreSQL's loaded rows) and drive a Claim through them:
//
//  1. Start with the claim's parameters, the topic's settings and the time.
//  2. Expire for every lease whose deadline is not after now (earliest first, or any order): it
//     says whether the message waits (and until when) or goes to the DLQ.
//  3. Redeliver for the waiting messages in order (due time, partition, offset), until it says
//     stop: it says how many of them to lease. Engines report the waiting messages they do not
//     present (not due yet) with Waiting.
//  4. Partition(k) gives the order in which to read new messages; Take decides each message read
//     at a partition's cursor (lease, complete, delay, or stop: the claim is full or has scanned
//     enough).
//  5. Leased with the earliest lease left (the claim's own included), then NextDue.
//
// Times are unix nanoseconds.
package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// ScanLimit bounds the new messages a claim looks at without delivering them (expired, delayed,
// acked before delivery), so one claim cannot hold its subscription for long; NextDue then says
// "now".
const ScanLimit = 4096

// Input is what a claim is planned from.
type Input struct {
	Params *storage.DeliveriesClaimParams
	// Topic names the topic in errors.
	Topic string
	// Partitions is the topic's partition count; Params.Partitions must lie below it.
	Partitions int
	// AckWait is the topic's lease duration (Params.LeaseDuration overrides it when positive).
	AckWait time.Duration
	// MaxDeliveries is the topic's max_deliveries.
	MaxDeliveries int
	// Now is the engine's time.
	Now int64
	// Rotor picks the partition read first; engines change it from one claim to the next so
	// that every partition gets read first in turn.
	Rotor uint64
	// Resolution truncates the lease deadline (PostgreSQL keeps microseconds); 0 keeps it exact.
	Resolution time.Duration
	// MaxInFlight, when positive, makes the claim ORDERED (ordered.go): each partition is
	// planned through a Lane, at most MaxInFlight unsettled per partition, in offset order.
	MaxInFlight int
	// BatchSize, with MaxInFlight, makes the ordered claim a batch claim (Params.BatchSize:
	// ordered.go).
	BatchSize int
}

// Claim is the plan of one DeliveriesClaim, decided step by step as the engine presents its
// state (see the package doc). The zero value is not usable: call Start.
type Claim struct {
	member        string
	avoid         bool
	skip, take    string // Params.Skip and Take
	skipFor       int64  // Params.SkipFor
	now, deadline int64
	maxDeliveries int
	parts         int     // the topic's partition count
	allowed       []int32 // sorted, no duplicates (Params.Partitions when it is); nil: every partition
	first         int     // index (in the allowed order) of the partition read first

	remaining int
	scanned   int
	moreNow   bool

	minWait, minLease int64
	hasWait, hasLease bool

	maxInFlight int // ordered claims only (ordered.go)
	batchSize   int // batch claims only (ordered.go)
}

// Start begins the plan of a claim. It fails, with an error matching storage.ErrInvalidArgument,
// for a partition out of range; the engine must then change nothing. The claim's other
// parameters are checked before (DeliveriesClaimParams validation).
func (c *Claim) Start(in Input) error {
	p := in.Params
	*c = Claim{
		member:        p.Member,
		avoid:         p.AvoidMember,
		skip:          p.Skip,
		take:          p.Take,
		skipFor:       int64(p.SkipFor),
		now:           in.Now,
		maxDeliveries: in.MaxDeliveries,
		parts:         in.Partitions,
		remaining:     p.Max,
		maxInFlight:   in.MaxInFlight,
	}
	if c.maxInFlight > 0 {
		c.batchSize = in.BatchSize
	}
	if c.maxInFlight > 0 {
		c.avoid, c.skip = false, "" // one owner per partition: nobody else could take a redelivery
	}
	lease := in.AckWait
	if p.LeaseDuration > 0 {
		lease = p.LeaseDuration
	}
	c.deadline = in.Now + int64(lease)
	if r := int64(in.Resolution); r > 1 {
		c.deadline -= c.deadline % r
	}
	n := in.Partitions
	if p.Partitions != nil {
		for _, q := range p.Partitions {
			if q < 0 || int(q) >= in.Partitions {
				return storage.Invalid("partition %d out of range, topic %q has %d", q, in.Topic, in.Partitions)
			}
		}
		c.allowed = p.Partitions // read only
		if !increasing(c.allowed) {
			c.allowed = slices.Clone(p.Partitions)
			slices.Sort(c.allowed)
			c.allowed = slices.Compact(c.allowed)
		}
		n = len(c.allowed)
	}
	if n > 0 {
		c.first = int(in.Rotor % uint64(n))
	}
	return nil
}

// Member returns the claiming member.
func (c *Claim) Member() string { return c.member }

// increasing reports whether ps is sorted without duplicates.
func increasing(ps []int32) bool {
	for i := 1; i < len(ps); i++ {
		if ps[i] <= ps[i-1] {
			return false
		}
	}
	return true
}

// Now returns the claim's time.
func (c *Claim) Now() int64 { return c.now }

// Deadline returns the lease deadline of every delivery of the claim.
func (c *Claim) Deadline() int64 { return c.deadline }

// Allowed reports whether the claim may deliver messages of partition p.
func (c *Claim) Allowed(p int32) bool {
	if c.allowed == nil {
		return p >= 0 && int(p) < c.parts
	}
	_, ok := slices.BinarySearch(c.allowed, p)
	return ok
}

// Expiry is what happens to a lease at a claim.
type Expiry uint8

const (
	// Held: the lease has not expired.
	Held Expiry = iota
	// Wait: the lease expired; the message waits until the returned due time (its deadline plus
	// storage.RedeliveryBackoff of its attempt), keeping its attempt count.
	Wait
	// DeadLetter: the lease expired on the max_deliveries-th delivery; the message goes to the
	// DLQ (reason max_deliveries, attempts = attempt, last error ExpiredError).
	DeadLetter
)

// ExpiredError is the last error of a DLQ entry whose last lease expired.
const ExpiredError = "lease expired"

// Expire decides about a lease with the given deadline on the attempt-th delivery.
func (c *Claim) Expire(deadline int64, attempt int) (Expiry, int64) {
	return ExpireAt(c.now, deadline, attempt, c.maxDeliveries)
}

// ExpireAt is Claim.Expire without a claim (the model predicts with it).
func ExpireAt(now, deadline int64, attempt, maxDeliveries int) (Expiry, int64) {
	switch {
	case deadline > now:
		return Held, 0
	case attempt >= maxDeliveries:
		return DeadLetter, 0
	}
	return Wait, ExpiredDue(deadline, attempt)
}

// ExpiredDue is when a message whose attempt-th lease expired at deadline (below max_deliveries)
// becomes due again: after the backoff of its attempt (storage.RedeliveryBackoff).
func ExpiredDue(deadline int64, attempt int) int64 {
	return deadline + int64(storage.RedeliveryBackoff(attempt))
}

// Claimable reports whether a waiting message due at due, in partition p, whose last delivery
// went to last, may be redelivered by this claim: it is due, its partition is allowed, and with
// AvoidMember its last delivery did not go to the claiming member.
func (c *Claim) Claimable(due int64, p int32, last string) bool {
	return due <= c.now && c.Allowed(p) && !(c.avoid && last == c.member) && !c.skipped(due, last)
}

// skipped reports whether a waiting message due at due whose last member is last is a give-back
// this claim passes over for now (Params.Skip, Take and SkipFor): any give-back not addressed to
// this claim's instance, so a give-back goes to the instance that wants it, not on from one
// instance that does not to the next.
func (c *Claim) skipped(due int64, last string) bool {
	return c.skip != "" && strings.HasPrefix(last, c.skip) && last != c.take && due+c.skipFor > c.now
}

// Redeliver decides about the next waiting messages (in order: due time, then partition, then
// offset): n of them with the same due time, partition and last member (one, or a row of
// PostgreSQL). It returns how many of them to lease to the member (attempt + 1, until
// Deadline), the first ones; and stop when the engine must present no more (the claim is full,
// or these are not due yet). A message it neither leases nor stops at (another partition, or
// avoided) stays as it is and does not count for NextDue (it is not claimable by this member).
func (c *Claim) Redeliver(due int64, p int32, last string, n int) (take int, stop bool) {
	if c.remaining == 0 || due > c.now {
		c.Waiting(due)
		return 0, true
	}
	if !c.Claimable(due, p, last) {
		if c.skipped(due, last) && c.Allowed(p) {
			c.Waiting(due + c.skipFor) // claimable by this claimer from then on
		}
		return 0, false
	}
	take = min(n, c.remaining)
	c.remaining -= take
	if take < n {
		c.Waiting(due) // the rest is due now: the next claim takes it
	}
	return take, false
}

// TooMany reports whether a delivery with this attempt number exceeds max_deliveries (the
// embedded engine after a crash: a message that may have been delivered without a record). The
// engine dead-letters it instead and calls Unlease.
func (c *Claim) TooMany(attempt int) bool { return attempt > c.maxDeliveries }

// Unlease gives back the place of a message Redeliver or Take leased but that the engine did not
// deliver (gone, or dead-lettered by TooMany). It counts as scanned.
func (c *Claim) Unlease() {
	c.remaining++
	c.scanned++
	if c.scanned >= ScanLimit {
		c.moreNow = true
	}
}

// Partition returns the k-th partition (k from 0) from which to read new messages, and false
// past the last one. The order rotates with Input.Rotor.
func (c *Claim) Partition(k int) (int32, bool) {
	if c.allowed != nil {
		if k >= len(c.allowed) {
			return 0, false
		}
		return c.allowed[(c.first+k)%len(c.allowed)], true
	}
	if k >= c.parts {
		return 0, false
	}
	return int32((c.first + k) % c.parts), true
}

// Remaining is how many more messages the claim can lease.
func (c *Claim) Remaining() int { return c.remaining }

// Full reports whether the claim takes no more new messages: it leased Max, or it looked at
// ScanLimit messages without delivering them.
func (c *Claim) Full() bool { return c.remaining == 0 || c.moreNow }

// Outcome is what a claim does with a new message.
type Outcome uint8

const (
	// Stop: the claim is full (see Full); the message is left for a later claim, the cursor
	// stays at it.
	Stop Outcome = iota
	// Lease: the message's first delivery (attempt 1), until Deadline.
	Lease
	// Complete: the message expired (ExpiresAt not after now); it is done without a delivery.
	Complete
	// Delay: the message's NotBefore is in the future; it waits until then without a delivery
	// (attempt 0).
	Delay
)

// Take decides about the new message m at its partition's cursor. Except for Stop, the cursor
// moves past it.
func (c *Claim) Take(m *storage.Message) Outcome {
	if c.Full() {
		return Stop
	}
	switch {
	case !m.ExpiresAt.IsZero() && m.ExpiresAt.UnixNano() <= c.now:
		c.Skipped()
		return Complete
	case !m.NotBefore.IsZero() && m.NotBefore.UnixNano() > c.now:
		c.Skipped()
		c.Waiting(m.NotBefore.UnixNano())
		return Delay
	}
	c.remaining--
	return Lease
}

// Skipped counts a new message the claim passed without a delivery (one acked before it was
// delivered) towards ScanLimit.
func (c *Claim) Skipped() {
	c.scanned++
	if c.scanned >= ScanLimit {
		c.moreNow = true
	}
}

// Waiting reports a message that waits until due after the claim and that the engine did not
// present to Redeliver (not due yet): it counts for NextDue.
func (c *Claim) Waiting(due int64) {
	if !c.hasWait || due < c.minWait {
		c.minWait, c.hasWait = due, true
	}
}

// Leased reports a lease left after the claim, the claim's own included (the earliest one is
// enough): its deadline counts for NextDue.
func (c *Claim) Leased(deadline int64) {
	if !c.hasLease || deadline < c.minLease {
		c.minLease, c.hasLease = deadline, true
	}
}

// NextDue returns the earliest time something not claimable by this claim now becomes claimable
// without a new publish: the earliest due time of what waits (now if that passed), or the
// earliest lease deadline; now when the claim stopped at ScanLimit; false when nothing waits.
func (c *Claim) NextDue() (int64, bool) {
	if c.moreNow {
		return c.now, true
	}
	next, has := int64(0), false
	if c.hasWait {
		next, has = max(c.minWait, c.now), true
	}
	if c.hasLease && (!has || c.minLease < next) {
		next, has = c.minLease, true
	}
	return next, has
}

// NextDueTime is NextDue as a time (zero when nothing waits), as DeliveriesClaimResult has it.
func (c *Claim) NextDueTime() time.Time {
	if ns, ok := c.NextDue(); ok {
		return time.Unix(0, ns).UTC()
	}
	return time.Time{}
}

// String describes the plan's progress (test failures).
func (c *Claim) String() string {
	return fmt.Sprintf("claim by %q at %d: remaining %d, scanned %d, more now %v", c.member, c.now, c.remaining, c.scanned, c.moreNow)
}

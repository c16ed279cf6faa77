package policy

import "github.com/spoolmq/spool/internal/storage"

// Ordered claims (storage.ModeOrdered). A claim of an ordered subscription reads only the
// partitions the member owns (the engine fences the generation and passes them as
// Params.Partitions). Each partition is planned by a Lane, in this order:
//
//  1. Lane(k, inFlight) with the number of the partition's messages leased now: the lane has
//     MaxInFlight - inFlight slots.
//  2. Redeliver for each waiting message of the partition (nacked, expired, released, delayed,
//     replayed from the DLQ) in OFFSET order, whatever their due times: it leases the first ones
//     while they are due and slots and the claim have room; the first one it does not lease
//     blocks the lane, and every later one stays too.
//  3. Take for the new messages at the partition's cursor: only when no waiting message blocks
//     the lane and it has a slot. A message whose NotBefore is in the future blocks it too (it
//     waits in offset order).
//
// So a nacked or expired message is redelivered before any later offset of its partition, at
// most MaxInFlight messages of a partition are unsettled, and a message that goes to the DLQ
// (at max_deliveries) unblocks its partition: the engine dead-letters it on expiry or nack and
// the next claim moves on. Expire, TooMany, Unlease, Leased and NextDue work as for shared claims.

// Ordered reports whether the claim is ordered.
func (c *Claim) Ordered() bool { return c.maxInFlight > 0 }

// Lane is the plan of one partition of an ordered claim.
type Lane struct {
	c       *Claim
	slots   int
	blocked bool
}

// Lane begins the plan of partition p with inFlight of its messages leased now.
func (c *Claim) Lane(p int32, inFlight int) Lane {
	l := Lane{c: c, slots: max(c.maxInFlight-inFlight, 0)}
	if !c.Allowed(p) {
		l.blocked = true
	}
	return l
}

// Redeliver decides about the partition's next waiting message (offset order), due at due: true
// to lease it to the member (attempt + 1, until Deadline).
func (l *Lane) Redeliver(due int64) bool {
	c := l.c
	if l.blocked || l.slots == 0 {
		// Behind the lane's first unleased message, or no slot: claimable only once a
		// lease of the partition settles (NextDue counts the leases).
		l.blocked = true
		return false
	}
	if c.remaining == 0 || due > c.now {
		c.Waiting(due) // the claim is full (due now: more now), or it is not due yet
		l.blocked = true
		return false
	}
	l.slots--
	c.remaining--
	return true
}

// Take decides about the new message m at the partition's cursor, like Claim.Take, after every
// waiting message was presented to Redeliver. Stop when the lane is blocked or has no slot;
// Delay blocks the lane (m waits, in offset order).
func (l *Lane) Take(m *storage.Message) Outcome {
	if l.blocked || l.slots == 0 {
		return Stop
	}
	o := l.c.Take(m)
	switch o {
	case Lease:
		l.slots--
	case Delay:
		l.blocked = true
	}
	return o
}

// Unlease gives back the place and the slot of a message Redeliver or Take leased but that the
// engine did not deliver (gone, or dead-lettered by TooMany).
func (l *Lane) Unlease() {
	l.slots++
	l.c.Unlease()
}

// Slots returns how many more messages the lane may lease (new messages: 0 when blocked).
func (l *Lane) Slots() int {
	if l.blocked {
		return 0
	}
	return min(l.slots, l.c.remaining)
}

// Blocked reports whether the lane takes no new message any more.
func (l *Lane) Blocked() bool { return l.blocked || l.slots == 0 }

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
//
// Batch claims (Input.BatchSize, storage/batches.go) plan each partition's lane as one batch:
//
//  1. A lane whose partition has a message leased takes nothing (one batch in flight per
//     partition; MaxInFlight does not apply).
//  2. Redeliver leases every due waiting message in offset order (they are a batch given back
//     whole, or messages that waited for their NotBefore), up to storage.MaxBatchMessages; the
//     first one not due blocks the lane. The engine reports the Linked bit of each one it
//     delivers, in offset order, with Redelivered.
//  3. Take continues with the new messages at the cursor while the batch has fewer than
//     BatchSize messages or its last message is Linked (the extension), up to
//     storage.MaxBatchMessages. A delayed message (NotBefore) ends the batch.
//
// The claim's Max bounds where batches start: a lane starts a batch only while the claim has
// room, and a started batch is never cut by Max (the claim may return more than Max messages,
// at most one batch's worth per partition).

// Ordered reports whether the claim is ordered.
func (c *Claim) Ordered() bool { return c.maxInFlight > 0 }

// Lane is the plan of one partition of an ordered claim.
type Lane struct {
	c       *Claim
	slots   int
	blocked bool
	// Batch claims only.
	batch  bool
	count  int  // messages leased in the lane's batch
	over   int  // of which leased while the claim had no room left
	linked bool // the batch's last message (so far) is Linked
}

// Lane begins the plan of partition p with inFlight of its messages leased now.
func (c *Claim) Lane(p int32, inFlight int) Lane {
	l := Lane{c: c, slots: max(c.maxInFlight-inFlight, 0), batch: c.batchSize > 0}
	if !c.Allowed(p) || (l.batch && inFlight > 0) {
		l.blocked = true
	}
	return l
}

// Batch reports whether the claim is a batch claim.
func (c *Claim) Batch() bool { return c.batchSize > 0 }

// leaseBatch counts a message leased in the lane's batch, against the claim's room while it
// has some.
func (l *Lane) leaseBatch() {
	l.count++
	if l.c.remaining > 0 {
		l.c.remaining--
	} else {
		l.over++
	}
}

// batchDone reports whether the lane's batch takes no more message.
func (l *Lane) batchDone() bool {
	c := l.c
	switch {
	case l.blocked || l.count >= storage.MaxBatchMessages:
		return true
	case l.count == 0:
		return c.Full()
	}
	return l.count >= c.batchSize && !l.linked
}

// Redelivered reports the Linked bit of a waiting message the lane leased and the engine
// delivered (batch claims; offset order): it decides whether new messages extend the batch.
func (l *Lane) Redelivered(linked bool) { l.linked = linked }

// Redeliver decides about the partition's next waiting message (offset order), due at due: true
// to lease it to the member (attempt + 1, until Deadline).
func (l *Lane) Redeliver(due int64) bool {
	c := l.c
	if l.batch {
		switch {
		case l.blocked || l.count >= storage.MaxBatchMessages:
		case due > c.now || (l.count == 0 && c.remaining == 0):
			c.Waiting(due)
		default:
			l.leaseBatch()
			return true
		}
		l.blocked = true
		return false
	}
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
	if l.batch {
		return l.takeBatch(m)
	}
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

// takeBatch is Take for a batch claim.
func (l *Lane) takeBatch(m *storage.Message) Outcome {
	c := l.c
	if l.batchDone() {
		l.blocked = true
		return Stop
	}
	switch {
	case !m.ExpiresAt.IsZero() && m.ExpiresAt.UnixNano() <= c.now:
		c.Skipped()
		l.linked = m.Linked // its place in the run counts
		return Complete
	case !m.NotBefore.IsZero() && m.NotBefore.UnixNano() > c.now:
		c.Skipped()
		c.Waiting(m.NotBefore.UnixNano())
		l.blocked = true
		return Delay
	}
	l.leaseBatch()
	l.linked = m.Linked
	return Lease
}

// Unlease gives back the place and the slot of a message Redeliver or Take leased but that the
// engine did not deliver (gone, or dead-lettered by TooMany).
func (l *Lane) Unlease() {
	if l.batch {
		l.count--
		if l.over > 0 {
			l.over--
			l.c.Skipped()
			return
		}
		l.c.Unlease()
		return
	}
	l.slots++
	l.c.Unlease()
}

// batchReadAhead is how many messages an engine reads at a time for a batch extended past
// BatchSize (Slots).
const batchReadAhead = 256

// Slots returns how many more messages the lane may lease (new messages: 0 when blocked). For a
// batch claim it may exceed the claim's Remaining: a started batch is not cut by Max; past
// BatchSize, while the batch is linked, it is a read-ahead (the extension's length is unknown).
func (l *Lane) Slots() int {
	if l.batch {
		switch {
		case l.batchDone():
			return 0
		case l.count < l.c.batchSize:
			return l.c.batchSize - l.count
		}
		return min(batchReadAhead, storage.MaxBatchMessages-l.count)
	}
	if l.blocked {
		return 0
	}
	return min(l.slots, l.c.remaining)
}

// Blocked reports whether the lane takes no new message any more.
func (l *Lane) Blocked() bool {
	if l.batch {
		return l.batchDone()
	}
	return l.blocked || l.slots == 0
}

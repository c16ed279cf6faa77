package substate

import (
	"cmp"
	"math"
	"slices"

	"github.com/spoolmq/spool/internal/storage/policy"
)

// Entry is one message of a subscription that is leased or waiting: a pending offset above the
// partition's floor, or a replayed DLQ message (DLQ != 0).
type Entry struct {
	Partition int32
	Offset    int64
	// Attempt counts the deliveries so far (0: never delivered, for a NotBefore wait or a replayed
	// DLQ message).
	Attempt int
	// Leased: Member holds the message until Time. Otherwise it is waiting until Time.
	Leased bool
	// Member holds the lease, or received the last delivery.
	Member string
	// Time is the lease deadline or the due time, unix ns; 0 means due at once.
	Time int64
	// DLQ is the DLQ ID whose record (in the subscription's DLQ log) holds the copy of a replayed
	// DLQ message; 0 for a message read from the partition log.
	DLQ int64
	// Claim is the engine's sequence number of the claim that made the last delivery, 0 when that
	// delivery is known to be recorded durably (restored entries). The engine sets and reads it;
	// this package only keeps it.
	Claim int64
	// Failures are the message's last failures (policy.AddFailure), kept while its topic has a
	// poison rule on (poison.go).
	Failures []policy.Failure

	idx int // position in the heap it is in, -1 if none
}

// Replayed reports whether the entry is a replayed DLQ message.
func (e *Entry) Replayed() bool { return e.DLQ != 0 }

// part is the state of one partition.
type part struct {
	floor, cursor int64
	// horizon is the claim horizon: the engine delivers offsets at or above it only once a horizon
	// record further ahead is durable. suspect: offsets in [cursor, suspect) may have been delivered
	// once before an unclean shutdown (their claim record was lost); 0 or <= cursor means none.
	horizon, suspect int64
	pending          map[int64]*Entry
	replayed         map[int64]*Entry
	done             bitset
	doneN            int // members of done, all >= floor
}

// Sub is the delivery state of one subscription.
type Sub struct {
	parts   []*part
	leases  entryHeap
	waiting entryHeap
	// The DLQ is an index of IDs (dlq.go): the entries themselves are in the engine's DLQ log.
	dlqLive bitset // IDs in the DLQ, all in [dlqLow, nextDLQ)
	dlqLow  int64  // no ID below it is in the DLQ
	dlqN    int    // members of dlqLive
	nextDLQ int64
}

// New returns the state of a subscription whose partition i starts at starts[i] (floor and cursor).
func New(starts []int64) *Sub {
	s := &Sub{nextDLQ: 1, dlqLow: 1}
	for _, o := range starts {
		s.AddPartition(o)
	}
	return s
}

// AddPartition adds a partition starting at start (the topic grew).
func (s *Sub) AddPartition(start int64) {
	s.parts = append(s.parts, &part{floor: start, cursor: start, horizon: start})
}

// Partitions is the number of partitions.
func (s *Sub) Partitions() int { return len(s.parts) }

func (s *Sub) part(p int32) *part {
	if p < 0 || int(p) >= len(s.parts) {
		return nil
	}
	return s.parts[p]
}

// Floor returns the ack floor of partition p.
func (s *Sub) Floor(p int32) int64 { return s.parts[p].floor }

// Cursor returns the next never-delivered offset of partition p. Offsets at the cursor that were
// already completed (acked before delivery) are skipped first.
func (s *Sub) Cursor(p int32) int64 {
	pt := s.parts[p]
	pt.cursor = pt.done.runFrom(pt.cursor)
	return pt.cursor
}

// advance moves the floor over the contiguous done prefix, and the cursor over done offsets.
func (pt *part) advance() {
	if nf := pt.done.runFrom(pt.floor); nf != pt.floor {
		pt.doneN -= pt.done.trim(nf)
		pt.floor = nf
	}
	pt.cursor = pt.done.runFrom(max(pt.cursor, pt.floor))
}

func (s *Sub) unheap(e *Entry) {
	if e.idx < 0 {
		return
	}
	if e.Leased {
		s.leases.remove(e)
	} else {
		s.waiting.remove(e)
	}
}

func (s *Sub) setWaiting(e *Entry, due int64) {
	s.unheap(e)
	e.Leased = false
	e.Time = due
	s.waiting.push(e)
}

func (s *Sub) setLeased(e *Entry, member string, deadline int64) {
	s.unheap(e)
	e.Leased = true
	e.Member = member
	e.Time = deadline
	s.leases.push(e)
}

// entryAt returns the entry of offset o of partition p, creating a waiting one when o is at or
// beyond the cursor (the cursor moves past it; never-delivered offsets skipped on the way get
// waiting entries too, so nothing is lost). It returns nil when o is done.
func (s *Sub) entryAt(p int32, o int64) *Entry {
	pt := s.part(p)
	if pt == nil || o < pt.floor || pt.done.test(o) {
		return nil
	}
	if e := pt.pending[o]; e != nil {
		return e
	}
	if o > pt.cursor+maxGap {
		return nil // only corrupt input skips this far ahead
	}
	if pt.pending == nil {
		pt.pending = make(map[int64]*Entry)
	}
	for c := pt.cursor; c < o; c++ {
		if !pt.done.test(c) && pt.pending[c] == nil {
			e := &Entry{Partition: p, Offset: c, idx: -1}
			pt.pending[c] = e
			s.waiting.push(e)
		}
	}
	e := &Entry{Partition: p, Offset: o, idx: -1}
	pt.pending[o] = e
	s.waiting.push(e)
	if o >= pt.cursor {
		pt.cursor = pt.done.runFrom(o + 1)
	}
	return e
}

// MaxDoneSpan bounds how far above the ack floor an offset can be completed out of order. The
// done set is a bitset starting at the floor, one bit per offset, so it holds at most
// MaxDoneSpan/8 bytes (32 MiB). An offset further above the floor is refused (Ack reports it
// Unknown, so the message is delivered again later; replay skips it the same way): a damaged
// record, or 268 million acks behind one stuck message, never makes the state allocate without
// bound.
const MaxDoneSpan = 1 << 28

// markDone completes offset o of partition p (not a replayed copy). It reports whether o was not
// done before.
func (s *Sub) markDone(p int32, o int64) bool {
	pt := s.part(p)
	if pt == nil || o < pt.floor || o-pt.floor >= MaxDoneSpan || pt.done.test(o) {
		return false
	}
	if e := pt.pending[o]; e != nil {
		s.unheap(e)
		delete(pt.pending, o)
	}
	pt.done.set(o)
	pt.doneN++
	pt.advance()
	return true
}

// Deliver leases the never-delivered offset o of partition p (o is Cursor(p)) to member as its
// first delivery: attempt 1, or 2 when o is suspect (it may have been delivered once before an
// unclean shutdown, see UncleanRestart).
func (s *Sub) Deliver(p int32, o int64, member string, deadline int64) *Entry {
	e := s.entryAt(p, o)
	if e == nil {
		return nil
	}
	s.markSuspect(e)
	e.Attempt++
	s.setLeased(e, member, deadline)
	return e
}

// Delay makes the never-delivered offset o of partition p (o is Cursor(p)) wait until due without
// a delivery (a NotBefore time in the future). A suspect offset counts one possible delivery.
func (s *Sub) Delay(p int32, o int64, due int64) *Entry {
	e := s.entryAt(p, o)
	if e == nil {
		return nil
	}
	s.markSuspect(e)
	s.setWaiting(e, due)
	return e
}

// markSuspect counts one possible delivery for a never-delivered entry below its partition's
// suspect offset.
func (s *Sub) markSuspect(e *Entry) {
	if pt := s.part(e.Partition); pt != nil && e.Attempt == 0 && e.Offset < pt.suspect {
		e.Attempt = 1
	}
}

// Horizon returns the claim horizon of partition p (see package wal: the engine hands out an
// offset at or above the durable horizon only after recording a horizon further ahead).
func (s *Sub) Horizon(p int32) int64 { return s.parts[p].horizon }

// SetHorizon raises the claim horizon of partition p to h (live, and on replay of a horizon
// record). A lower h changes nothing.
func (s *Sub) SetHorizon(p int32, h int64) {
	if pt := s.part(p); pt != nil && h > pt.horizon {
		pt.horizon = h
	}
}

// Suspect returns the suspect offset of partition p: offsets in [Cursor(p), Suspect(p)) may have
// been delivered once before an unclean shutdown.
func (s *Sub) Suspect(p int32) int64 { return s.parts[p].suspect }

// UncleanRestart applies what a restart after an unclean shutdown (a crash: claim records that
// were not yet durable may be lost) must assume: every waiting or delivered message may have had
// one more delivery than recorded, so its attempt count goes up by one; and every offset between
// the cursor and the claim horizon may have been delivered once, so it becomes suspect. The engine
// guarantees there is at most one unrecorded delivery per message, so attempt numbers handed out
// afterwards never repeat one handed out before the shutdown (they may skip one).
func (s *Sub) UncleanRestart() {
	for _, pt := range s.parts {
		pt.suspect = max(pt.suspect, pt.horizon)
		for _, e := range pt.pending {
			e.Attempt++
		}
		for _, e := range pt.replayed {
			e.Attempt++
		}
	}
}

// Complete marks offset o of partition p done without a delivery (the message expired, or it no
// longer exists in the log).
func (s *Sub) Complete(p int32, o int64) { s.markDone(p, o) }

// ExpireLeases processes every lease that expired at the claim c (policy.Claim.Expire), earliest
// deadline first: a message waits until the due time c gives it; the others are returned, out of
// both heaps, and the caller must pass each to DeadLetter or Drop.
func (s *Sub) ExpireLeases(c *policy.Claim) []*Entry {
	var dead []*Entry
	for {
		e := s.leases.top()
		if e == nil {
			return dead
		}
		x, due := c.Expire(e.Time, e.Attempt)
		if x == policy.Held {
			return dead
		}
		s.leases.pop()
		e.Leased = false
		if x == policy.DeadLetter {
			dead = append(dead, e)
			continue
		}
		e.Time = due
		s.waiting.push(e)
	}
}

// TakeDue presents the waiting entries to the claim c in its order (due time, partition, offset:
// the heap's) and leases those it takes to its member until its deadline, with the next attempt
// number. The entries it passes over stay waiting.
func (s *Sub) TakeDue(c *policy.Claim) (got []*Entry) {
	var aside []*Entry
	for {
		e := s.waiting.top()
		if e == nil {
			break
		}
		take, stop := c.Redeliver(e.Time, e.Partition, e.Member, 1)
		if stop {
			break
		}
		s.waiting.pop()
		if take == 0 {
			aside = append(aside, e)
			continue
		}
		e.Attempt++
		e.Leased = true
		e.Member = c.Member()
		e.Time = c.Deadline()
		s.leases.push(e)
		got = append(got, e)
	}
	for _, e := range aside {
		s.waiting.push(e)
	}
	return got
}

// NextDeadline returns the earliest lease deadline.
func (s *Sub) NextDeadline() (int64, bool) {
	if e := s.leases.top(); e != nil {
		return e.Time, true
	}
	return 0, false
}

// AckOutcome is the result of Ack.
type AckOutcome uint8

const (
	// Acked: the message was not done and now is.
	Acked AckOutcome = iota + 1
	// AlreadyDone: the message was acked, dead-lettered or below the floor already.
	AlreadyDone
	// Unknown: no such partition, or the offset is at or above the high-water mark.
	Unknown
)

// Ack completes offset o of partition p; hw is the partition's high-water mark. A replayed DLQ
// copy of the offset is completed first.
func (s *Sub) Ack(p int32, o int64, hw int64) AckOutcome {
	pt := s.part(p)
	if pt == nil || o < 0 {
		return Unknown
	}
	if e := pt.replayed[o]; e != nil {
		s.unheap(e)
		delete(pt.replayed, o)
		return Acked
	}
	if o < pt.floor || pt.done.test(o) {
		return AlreadyDone
	}
	if o >= hw || o-pt.floor >= MaxDoneSpan {
		return Unknown
	}
	s.markDone(p, o)
	return Acked
}

// held returns the entry of (p, o) if member holds its lease at now.
func (s *Sub) held(p int32, o int64, member string, now int64) *Entry {
	pt := s.part(p)
	if pt == nil {
		return nil
	}
	e := pt.replayed[o]
	if e == nil {
		e = pt.pending[o]
	}
	if e == nil || !e.Leased || e.Member != member || e.Time <= now {
		return nil
	}
	return e
}

// NackOutcome is the result of Nack.
type NackOutcome uint8

const (
	// NotHeld: member does not hold the lease.
	NotHeld NackOutcome = iota + 1
	// Nacked: the message waits until the due time.
	Nacked
	// DeadLetter: the caller must dead-letter the returned entry (ToDLQ, or the max_deliveries-th
	// delivery) with DeadLetter.
	DeadLetter
)

// Nack gives back a message member holds: it waits until due, or must be dead-lettered when
// toDLQ is set or its attempt reached maxDeliveries.
func (s *Sub) Nack(p int32, o int64, member string, now, due int64, toDLQ bool, maxDeliveries int) (NackOutcome, *Entry) {
	e := s.held(p, o, member, now)
	if e == nil {
		return NotHeld, nil
	}
	if toDLQ || e.Attempt >= maxDeliveries {
		s.unheap(e)
		e.Leased = false
		return DeadLetter, e
	}
	s.setWaiting(e, due)
	return Nacked, e
}

// GiveBack gives back a message member holds as if this delivery had not been made: waiting
// until due, its attempt count one lower, tag recorded as its last member (a claim's Skip). It
// reports whether member held it.
func (s *Sub) GiveBack(p int32, o int64, member, tag string, now, due int64) (*Entry, bool) {
	e := s.held(p, o, member, now)
	if e == nil {
		return nil, false
	}
	e.Attempt = max(0, e.Attempt-1)
	e.Member = tag
	s.setWaiting(e, due)
	return e, true
}

// Extend moves the lease deadline of a message member holds. It reports whether member held it.
func (s *Sub) Extend(p int32, o int64, member string, now, deadline int64) bool {
	e := s.held(p, o, member, now)
	if e == nil {
		return false
	}
	e.Time = deadline
	s.leases.fix(e)
	return true
}

// Transfer moves the lease of a message member holds to member to, with a new deadline. It
// reports whether member held it.
func (s *Sub) Transfer(p int32, o int64, member, to string, now, deadline int64) bool {
	e := s.held(p, o, member, now)
	if e == nil {
		return false
	}
	e.Member = to
	e.Time = deadline
	s.leases.fix(e)
	return true
}

// Release gives back every lease member holds: due at once (now), attempts kept. Entries that
// reached maxDeliveries are returned out of both heaps for DeadLetter.
func (s *Sub) Release(member string, now int64, maxDeliveries int) (released int, dead []*Entry) {
	var mine []*Entry
	for _, e := range s.leases {
		if e.Member == member {
			mine = append(mine, e)
		}
	}
	for _, e := range mine {
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

// DeadLetter removes the entry (a pending offset becomes done, a replayed copy goes away) and adds
// a DLQ entry for it: it returns the entry's ID.
func (s *Sub) DeadLetter(e *Entry) int64 {
	s.Drop(e.Partition, e.Offset)
	return s.addDLQ(0)
}

// DeadLetterAt is DeadLetter by position, with the ID the entry got (state log replay). A
// replayed copy of the offset is taken first.
func (s *Sub) DeadLetterAt(p int32, o int64, id int64) {
	s.Drop(p, o)
	s.addDLQ(id)
}

// Drop forgets offset o of partition p: its replayed copy if there is one, else the offset
// becomes done (the message no longer exists).
func (s *Sub) Drop(p int32, o int64) {
	pt := s.part(p)
	if pt == nil {
		return
	}
	if e := pt.replayed[o]; e != nil {
		s.unheap(e)
		delete(pt.replayed, o)
		return
	}
	s.markDone(p, o)
}

// Keep puts back, waiting, an entry the caller cannot deliver or dead-letter because its message
// is in a damaged partition (one TakeDue leased, with the attempt it counted taken back; one
// ExpireLeases, Release or Nack handed out to be dead-lettered): it stays pending, for a claim
// after the repair.
func (s *Sub) Keep(e *Entry) { s.setWaiting(e, e.Time) }

// ForceFloor moves the floor of partition p up to floor (retention removed the messages below it):
// pending entries below it are dropped. It returns how many messages below floor were not done.
func (s *Sub) ForceFloor(p int32, floor int64) int64 {
	pt := s.part(p)
	if pt == nil || floor <= pt.floor {
		return 0
	}
	notDone := floor - pt.floor - int64(pt.done.countRange(pt.floor, floor))
	for o, e := range pt.pending {
		if o < floor {
			s.unheap(e)
			delete(pt.pending, o)
		}
	}
	pt.doneN -= pt.done.trim(floor)
	pt.floor = floor
	if pt.cursor < floor {
		pt.cursor = floor
	}
	pt.advance()
	return notDone
}

// Clamp cuts partition p back to the high-water mark hw: state about offsets at or above it is
// dropped. Only needed when the log lost durable-acknowledged records (UnsafeNoSync after a crash).
func (s *Sub) Clamp(p int32, hw int64) {
	pt := s.part(p)
	if pt == nil {
		return
	}
	for o, e := range pt.pending {
		if o >= hw {
			s.unheap(e)
			delete(pt.pending, o)
		}
	}
	var drop []int64
	pt.done.each(func(o int64) {
		if o >= hw {
			drop = append(drop, o)
		}
	})
	for _, o := range drop {
		pt.done.clear(o)
		pt.doneN--
	}
	if pt.cursor > hw {
		pt.cursor = hw
	}
	if pt.floor > hw {
		pt.floor = hw
	}
	pt.horizon = min(pt.horizon, hw)
	pt.suspect = min(pt.suspect, hw)
}

// RestoreClaim replays a claim record item: offset o of partition p (or its replayed copy) was
// delivered for the attempt-th time. Leases are not persisted, so it waits, due at once.
func (s *Sub) RestoreClaim(p int32, o int64, attempt int, replayed bool) {
	var e *Entry
	if replayed {
		if pt := s.part(p); pt != nil {
			e = pt.replayed[o]
		}
	} else {
		e = s.entryAt(p, o)
	}
	if e == nil {
		return
	}
	e.Attempt = attempt
	s.setWaiting(e, 0)
}

// RestoreNack replays a nack record item: the message waits until due.
func (s *Sub) RestoreNack(p int32, o int64, due int64, replayed, givenBack bool) {
	pt := s.part(p)
	if pt == nil {
		return
	}
	e := pt.pending[o]
	if replayed {
		e = pt.replayed[o]
	}
	if e == nil {
		return
	}
	if givenBack {
		e.Attempt = max(0, e.Attempt-1) // Sub.GiveBack
	}
	s.setWaiting(e, due)
}

// RestoreCursor replays the cursor a claim record left partition p at.
func (s *Sub) RestoreCursor(p int32, cursor int64) {
	pt := s.part(p)
	if pt == nil || cursor <= pt.cursor || cursor > pt.cursor+maxGap {
		return
	}
	for c := pt.cursor; c < cursor; c++ {
		if !pt.done.test(c) && pt.pending[c] == nil {
			s.entryAt(p, c)
		}
	}
	pt.cursor = pt.done.runFrom(max(pt.cursor, cursor))
}

// Exhausted removes and returns the waiting entries whose attempt reached maxDeliveries. After a
// restart they are the leases that were lost on their last allowed delivery; the caller
// dead-letters them. Entries of partitions for which take returns false stay (a damaged
// partition's: their messages cannot be read to dead-letter them).
func (s *Sub) Exhausted(maxDeliveries int, take func(p int32) bool) []*Entry {
	var out []*Entry
	for _, e := range s.waiting {
		if e.Attempt >= maxDeliveries && take(e.Partition) {
			out = append(out, e)
		}
	}
	for _, e := range out {
		s.unheap(e)
	}
	return out
}

// PartStats returns the floor and cursor of partition p and its pending count given its
// high-water mark.
func (s *Sub) PartStats(p int32, hw int64) (floor, cursor, pending int64) {
	pt := s.parts[p]
	pending = hw - pt.floor - int64(pt.done.countRange(pt.floor, hw)) + int64(len(pt.replayed))
	return pt.floor, s.Cursor(p), max(pending, 0)
}

// Counts returns the number of leased messages and of waiting ones (for a redelivery backoff, a
// nack delay, a NotBefore time, or a replayed DLQ message not yet delivered again).
func (s *Sub) Counts() (inFlight, waiting int64) {
	return int64(len(s.leases)), int64(len(s.waiting))
}

// EntryState is the persisted form of an entry: leases are not persisted, a leased entry is saved
// as due at once.
type EntryState struct {
	Offset  int64
	Attempt int
	Due     int64
	// DLQ is the DLQ ID holding a replayed copy (0 for a pending offset).
	DLQ int64
	// Failures is the entry's failure history (poison rules).
	Failures []policy.Failure
}

// PartState is the persisted form of a partition's state.
type PartState struct {
	Floor, Cursor int64
	// Horizon is the claim horizon; Suspect the end of the offsets above the cursor that may have
	// been delivered once before an unclean shutdown (0 when none).
	Horizon, Suspect int64
	// Done lists the done offsets above the floor as increasing, disjoint [start, end) runs.
	Done     [][2]int64
	Pending  []EntryState // offset order
	Replayed []EntryState // offset order
}

// Export returns the persisted form of the state: partitions and the DLQ index.
func (s *Sub) Export() (parts []PartState, dlq DLQState) {
	parts = make([]PartState, len(s.parts))
	for i, pt := range s.parts {
		ps := PartState{Floor: pt.floor, Cursor: pt.cursor, Horizon: pt.horizon}
		if pt.suspect > pt.cursor {
			ps.Suspect = pt.suspect
		}
		pt.done.each(func(o int64) {
			if n := len(ps.Done); n > 0 && ps.Done[n-1][1] == o {
				ps.Done[n-1][1] = o + 1
				return
			}
			ps.Done = append(ps.Done, [2]int64{o, o + 1})
		})
		ps.Pending = exportEntries(pt.pending)
		ps.Replayed = exportEntries(pt.replayed)
		parts[i] = ps
	}
	return parts, s.exportDLQ()
}

func exportEntries(m map[int64]*Entry) []EntryState {
	if len(m) == 0 {
		return nil
	}
	out := make([]EntryState, 0, len(m))
	for _, e := range m {
		es := EntryState{Offset: e.Offset, Attempt: e.Attempt, DLQ: e.DLQ, Failures: e.Failures}
		if !e.Leased {
			es.Due = e.Time
		}
		out = append(out, es)
	}
	slices.SortFunc(out, func(a, b EntryState) int { return cmp.Compare(a.Offset, b.Offset) })
	return out
}

// Import rebuilds a state from its persisted form.
func Import(parts []PartState, dlq DLQState) *Sub {
	s := &Sub{nextDLQ: 1, dlqLow: 1}
	for i, ps := range parts {
		pt := &part{floor: ps.Floor, cursor: max(ps.Cursor, ps.Floor), horizon: ps.Horizon, suspect: ps.Suspect}
		s.parts = append(s.parts, pt)
		for _, r := range ps.Done {
			if lo, hi := max(r[0], pt.floor), min(r[1], pt.floor+MaxDoneSpan); lo < hi {
				pt.doneN += pt.done.setRange(lo, hi)
			}
		}
		for _, es := range ps.Pending {
			if es.Offset < pt.floor || pt.done.test(es.Offset) {
				continue
			}
			if pt.pending == nil {
				pt.pending = make(map[int64]*Entry, len(ps.Pending))
			}
			e := &Entry{Partition: int32(i), Offset: es.Offset, Attempt: es.Attempt, Time: es.Due, Failures: es.Failures, idx: -1}
			pt.pending[e.Offset] = e
			s.waiting.push(e)
		}
		for _, es := range ps.Replayed {
			if pt.replayed == nil {
				pt.replayed = make(map[int64]*Entry, len(ps.Replayed))
			}
			e := &Entry{Partition: int32(i), Offset: es.Offset, Attempt: es.Attempt, Time: es.Due, DLQ: es.DLQ, Failures: es.Failures, idx: -1}
			pt.replayed[e.Offset] = e
			s.waiting.push(e)
		}
		pt.advance()
	}
	s.importDLQ(dlq)
	return s
}

// maxGap bounds how far past the cursor a replayed claim may name an offset. The engine never
// skips offsets (claims read them in order), so a gap only comes from damaged input; filling it
// with waiting entries (redelivering rather than losing) is bounded so such input cannot exhaust
// memory.
const maxGap = 1 << 16

// Forever is a high-water mark above every offset (state log replay).
const Forever = math.MaxInt64

// DoneRuns returns the offsets of partition p in [from, to) done above the ack floor (acked or
// dead-lettered out of order) as sorted runs [lo, hi), in time linear in the bitset's words.
func (s *Sub) DoneRuns(p int32, from, to int64) [][2]int64 {
	pt := s.part(p)
	if pt == nil {
		return nil
	}
	var runs [][2]int64
	for o := pt.done.nextSet(max(from, pt.floor), to); o < to; {
		hi := min(pt.done.runFrom(o), to)
		runs = append(runs, [2]int64{o, hi})
		o = pt.done.nextSet(hi, to)
	}
	return runs
}

// Done reports whether offset o of partition p is done: below the ack floor, or completed above
// it (acked or dead-lettered out of order).
func (s *Sub) Done(p int32, o int64) bool {
	pt := s.part(p)
	return pt != nil && (o < pt.floor || pt.done.test(o))
}

package substate

import "slices"

// The DLQ of a subscription is kept here as an index of IDs only: which IDs are in the DLQ, one
// bit each between the lowest of them and the next ID. The entries (reason, attempts, the copy of
// the message) are records of the engine's DLQ log, found by ID, so the memory and the snapshot of
// a DLQ do not grow with its entries' size (and a contiguous DLQ exports as one run).

// DLQState is the persisted form of the DLQ index.
type DLQState struct {
	// Next is the ID the next entry gets.
	Next int64
	// Live lists the IDs in the DLQ as increasing, disjoint [start, end) runs.
	Live [][2]int64
}

// addDLQ adds ID id to the DLQ (the next ID when 0) and returns it.
func (s *Sub) addDLQ(id int64) int64 {
	if id == 0 {
		id = s.nextDLQ
	}
	if id >= s.nextDLQ {
		s.nextDLQ = id + 1
	}
	if s.dlqN == 0 {
		s.dlqLow = id
	}
	if id < s.dlqLow || id-s.dlqLow >= MaxDoneSpan {
		return id // below every live ID, or far above: only damaged input adds one
	}
	if s.dlqLive.set(id) {
		s.dlqN++
	}
	return id
}

// removeDLQ takes id out of the DLQ and reports whether it was in it.
func (s *Sub) removeDLQ(id int64) bool {
	if !s.dlqLive.clear(id) {
		return false
	}
	s.dlqN--
	if id == s.dlqLow {
		s.dlqLow = s.dlqLive.nextSet(id, s.nextDLQ)
		s.dlqLive.trim(s.dlqLow)
	}
	return true
}

// NextDLQID is the ID the next DLQ entry gets.
func (s *Sub) NextDLQID() int64 { return s.nextDLQ }

// RaiseNextDLQID makes the next DLQ entry get an ID of at least next (the engine's DLQ log already
// holds records up to next-1 that the state does not know: a crash lost their state records).
func (s *Sub) RaiseNextDLQID(next int64) {
	if next > s.nextDLQ {
		s.nextDLQ = next
	}
}

// DLQLen is the number of DLQ entries.
func (s *Sub) DLQLen() int { return s.dlqN }

// DLQFirst is the lowest ID in the DLQ, NextDLQID when it is empty.
func (s *Sub) DLQFirst() int64 {
	if s.dlqN == 0 {
		return s.nextDLQ
	}
	return s.dlqLow
}

// DLQIDs returns up to limit IDs in the DLQ above afterID, in order.
func (s *Sub) DLQIDs(afterID int64, limit int) []int64 {
	var out []int64
	for id := max(afterID+1, s.dlqLow); len(out) < limit; id++ {
		id = s.dlqLive.nextSet(id, s.nextDLQ)
		if id >= s.nextDLQ {
			break
		}
		out = append(out, id)
	}
	return out
}

// DLQSelect returns the IDs among ids that are in the DLQ (every ID when ids is empty), in ID
// order, without duplicates. It costs O(len(ids) log len(ids)) unless ids is empty.
func (s *Sub) DLQSelect(ids []int64) []int64 {
	if len(ids) == 0 {
		return s.DLQIDs(0, s.dlqN)
	}
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	out := sorted[:0]
	for _, id := range sorted {
		if s.dlqLive.test(id) {
			out = append(out, id)
		}
	}
	return out
}

// DLQPurge removes the entries with the given IDs (all when empty) and returns how many.
func (s *Sub) DLQPurge(ids []int64) int {
	if len(ids) == 0 {
		n := s.dlqN
		s.dlqLive = bitset{}
		s.dlqN = 0
		s.dlqLow = s.nextDLQ
		return n
	}
	n := 0
	for _, id := range ids {
		if s.removeDLQ(id) {
			n++
		}
	}
	return n
}

// DLQExpireBelow removes the entries with an ID below id and returns their IDs.
func (s *Sub) DLQExpireBelow(id int64) []int64 {
	id = min(id, s.nextDLQ)
	if s.dlqN == 0 || id <= s.dlqLow {
		return nil
	}
	var ids []int64
	for x := s.dlqLive.nextSet(s.dlqLow, id); x < id; x = s.dlqLive.nextSet(x+1, id) {
		ids = append(ids, x)
	}
	s.dlqN -= len(ids)
	s.dlqLow = s.dlqLive.nextSet(id, s.nextDLQ)
	s.dlqLive.trim(s.dlqLow)
	return ids
}

// Replay puts back DLQ entry id (already removed from the DLQ) as a replayed copy of offset o of
// partition p, due at due with a fresh attempt count; the engine delivers it from the entry's
// record. A replayed copy of the same offset is replaced.
func (s *Sub) Replay(p int32, o int64, id int64, due int64) {
	pt := s.part(p)
	if pt == nil {
		return
	}
	if old := pt.replayed[o]; old != nil {
		s.unheap(old)
	}
	if pt.replayed == nil {
		pt.replayed = make(map[int64]*Entry)
	}
	e := &Entry{Partition: p, Offset: o, DLQ: id, idx: -1}
	pt.replayed[o] = e
	s.setWaiting(e, due)
}

// MinReplayedDLQ returns the lowest DLQ ID that a replayed copy reads its message from, NextDLQID
// when there is none: DLQ records below it and below DLQFirst are no longer needed.
func (s *Sub) MinReplayedDLQ() int64 {
	low := s.nextDLQ
	for _, pt := range s.parts {
		for _, e := range pt.replayed {
			low = min(low, e.DLQ)
		}
	}
	return low
}

// ReplayedEntries returns the replayed copies (the engine's recovery checks their records).
func (s *Sub) ReplayedEntries() []*Entry {
	var out []*Entry
	for _, pt := range s.parts {
		for _, e := range pt.replayed {
			out = append(out, e)
		}
	}
	return out
}

// DLQLost drops every DLQ entry with an ID outside [first, end) and returns how many: their
// records are gone from the DLQ log (UnsafeNoSync and a machine crash). Replayed copies of such
// IDs are dropped by the engine (Drop).
func (s *Sub) DLQLost(first, end int64) int {
	n := 0
	for id := s.dlqLive.nextSet(s.dlqLow, s.nextDLQ); id < s.nextDLQ; id = s.dlqLive.nextSet(id+1, s.nextDLQ) {
		if id < first || id >= end {
			s.removeDLQ(id)
			n++
		}
	}
	return n
}

func (s *Sub) exportDLQ() DLQState {
	st := DLQState{Next: s.nextDLQ}
	for id := s.dlqLive.nextSet(s.dlqLow, s.nextDLQ); id < s.nextDLQ; {
		end := s.dlqLive.runFrom(id)
		st.Live = append(st.Live, [2]int64{id, end})
		id = s.dlqLive.nextSet(end, s.nextDLQ)
	}
	return st
}

func (s *Sub) importDLQ(st DLQState) {
	s.nextDLQ = max(st.Next, 1)
	s.dlqLow = s.nextDLQ
	if len(st.Live) > 0 {
		s.dlqLow = max(st.Live[0][0], 1)
	}
	for _, r := range st.Live {
		if lo, hi := max(r[0], s.dlqLow), min(r[1], s.nextDLQ, s.dlqLow+MaxDoneSpan); lo < hi {
			s.dlqN += s.dlqLive.setRange(lo, hi)
		}
	}
	if s.dlqN == 0 {
		s.dlqLow = s.nextDLQ
	}
}

// ReplayedAt returns the replayed copy of offset o of partition p, or nil.
func (s *Sub) ReplayedAt(p int32, o int64) *Entry {
	if pt := s.part(p); pt != nil {
		return pt.replayed[o]
	}
	return nil
}

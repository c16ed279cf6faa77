package wal

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Completion records of refcount topics (docs/storage.md "Completion tracking"). Each
// subscription of a refcount topic keeps, per partition, the offsets it acked or dead-lettered as
// sorted, disjoint runs with a time; contiguous completions of one state within one second share
// a run (the time of its last one), so an in-order consumer costs one run per second per
// partition, whatever its rate, and out-of-order acks at most one run each until the gaps fill.
// They are rebuilt from the ack (frame timestamp) and dead-letter records on replay, kept in the
// snapshot metadata ("completions"), and trimmed by retention with the log.

// runCoalesce is how far apart in time two completions of one run may be.
const runCoalesce = int64(time.Second)

// Completion run states.
const (
	runAcked    uint8 = 1
	runDLQ      uint8 = 2
	runRemoved  uint8 = 3 // skipped when it came back from DEAD: left the set at at
	runExcluded uint8 = 4 // skipped when it joined (completed out of order before): not in its set
)

// crun is a run of completed offsets [lo, hi) of one state, the last completed at at (unix ns).
type crun struct {
	lo, hi, at int64
	state      uint8
}

// completions are a subscription's runs by partition.
type completions map[int32][]crun

// add records offset o of partition p completed at at with state, unless it is already recorded
// (the first completion stays: a replayed DLQ copy acked later keeps its dead-lettering).
func (c completions) add(p int32, o, at int64, state uint8) {
	runs := c[p]
	i, _ := slices.BinarySearchFunc(runs, o, func(r crun, o int64) int {
		switch {
		case r.hi <= o:
			return -1
		case r.lo > o:
			return 1
		}
		return 0
	})
	if i < len(runs) && runs[i].lo <= o {
		return // recorded
	}
	near := func(r crun) bool { return r.state == state && at-r.at < runCoalesce && r.at-at < runCoalesce }
	switch {
	case i > 0 && runs[i-1].hi == o && near(runs[i-1]):
		runs[i-1].hi = o + 1
		runs[i-1].at = max(runs[i-1].at, at)
		if i < len(runs) && runs[i].lo == o+1 && near(runs[i]) {
			runs[i-1].hi = runs[i].hi
			runs[i-1].at = max(runs[i-1].at, runs[i].at)
			runs = slices.Delete(runs, i, i+1)
		}
	case i < len(runs) && runs[i].lo == o+1 && near(runs[i]):
		runs[i].lo = o
		runs[i].at = max(runs[i].at, at)
	default:
		runs = slices.Insert(runs, i, crun{lo: o, hi: o + 1, at: at, state: state})
	}
	c[p] = runs
}

// addRange records the offsets of [lo, hi) of partition p that are not recorded yet, as runs of
// one state and time (the recorded ones keep their record).
func (c completions) addRange(p int32, lo, hi, at int64, state uint8) {
	runs := c[p]
	i, _ := slices.BinarySearchFunc(runs, lo, func(r crun, o int64) int { return cmp.Compare(r.hi, o+1) })
	var gaps []crun
	for o := lo; o < hi; {
		for i < len(runs) && runs[i].hi <= o {
			i++
		}
		if i < len(runs) && runs[i].lo <= o {
			o = runs[i].hi
			continue
		}
		end := hi
		if i < len(runs) && runs[i].lo < end {
			end = runs[i].lo
		}
		gaps = append(gaps, crun{lo: o, hi: end, at: at, state: state})
		o = end
	}
	if len(gaps) == 0 {
		return
	}
	runs = append(runs, gaps...)
	slices.SortFunc(runs, func(a, b crun) int { return cmp.Compare(a.lo, b.lo) })
	c[p] = runs
}

// get returns the run holding offset o of partition p.
func (c completions) get(p int32, o int64) (crun, bool) {
	runs := c[p]
	i, found := slices.BinarySearchFunc(runs, o, func(r crun, o int64) int {
		switch {
		case r.hi <= o:
			return -1
		case r.lo > o:
			return 1
		}
		return 0
	})
	if !found {
		return crun{}, false
	}
	return runs[i], true
}

// trim drops what lies below offset low of partition p (removed by retention).
func (c completions) trim(p int32, low int64) {
	runs := c[p]
	i := 0
	for i < len(runs) && runs[i].hi <= low {
		i++
	}
	runs = runs[i:]
	if len(runs) > 0 && runs[0].lo < low {
		runs[0].lo = low
	}
	if len(runs) == 0 {
		delete(c, p)
		return
	}
	c[p] = slices.Clip(runs)
}

// refcount reports whether t tracks completion by refcount.
func refcount(t *topic) bool {
	return t != nil && t.meta.Config.CompletionTracking == storage.Refcount
}

// recordCompletionLocked records that s completed offset o of partition p at at (unix ns), when
// its topic is a refcount topic. s.mu must be held.
func recordCompletionLocked(s *sub, p int32, o, at int64, state uint8) {
	if !refcount(s.topic) {
		return
	}
	if s.rc == nil {
		s.rc = completions{}
	}
	s.rc.add(p, o, at, state)
}

// startOf returns where s started in partition p (its resolved start position; 0 for a partition
// added later).
func startOf(s *sub, p int32) int64 {
	if int(p) < len(s.meta.StartOffsets) {
		return s.meta.StartOffsets[p]
	}
	return 0
}

// refcountStartsLocked raises want, the per-partition start of subscription self joining refcount
// topic t (created, or back from DEAD), past the messages the other subscriptions have completed
// (storage.RefcountStart), and returns, per partition, the runs of offsets above it completed out
// of order (storage.RefcountSkips), which the joiner marks done. e.mu must be held exclusively.
func (e *Engine) refcountStartsLocked(t *topic, self int64, want []int64) ([]int64, [][][2]int64) {
	out := slices.Clone(want)
	skips := make([][][2]int64, len(out))
	others := make([]*sub, 0, len(t.subs))
	for id, o := range t.subs {
		if id != self {
			others = append(others, o)
		}
	}
	// Sub locks are taken in ID order, as everywhere else (map order is random).
	slices.SortFunc(others, func(a, b *sub) int { return cmp.Compare(a.meta.ID, b.meta.ID) })
	for _, o := range others {
		o.mu.Lock()
	}
	defer func() {
		for _, o := range others {
			o.mu.Unlock()
		}
	}()
	for p := range out {
		var starts, floors []int64
		var live []bool
		var views []storage.RefcountOther
		for _, o := range others {
			if o.st == nil || p >= o.st.Partitions() {
				continue
			}
			st, pp := o.st, int32(p)
			starts = append(starts, startOf(o, pp))
			floors = append(floors, st.Floor(pp))
			live = append(live, o.meta.State.HoldsRetention())
		}
		out[p] = storage.RefcountStart(out[p], starts, floors, live)
		if p < len(t.parts) && t.parts[p].log != nil {
			// Runs, not offsets: the cost is in the others' out-of-order completions, not in the
			// pending window above out[p] (which can be the whole retained log).
			end := t.parts[p].log.NextIndex()
			for _, o := range others {
				if o.st == nil || p >= o.st.Partitions() {
					continue
				}
				st, pp := o.st, int32(p)
				views = append(views, storage.RefcountOther{Start: startOf(o, pp), Floor: st.Floor(pp),
					Live: o.meta.State.HoldsRetention(), Above: st.DoneRuns(pp, out[p], end)})
			}
			skips[p] = storage.RefcountSkips(out[p], end, views)
		}
	}
	return out, skips
}

// rejoinLocked raises the ack floors of s, back from DEAD on a refcount topic (it left the set
// at leftAt), past the messages completed while it was away, marks those completed out of order
// above them done, and returns the record that persists it (nil when nothing moved or s is
// ephemeral). e.mu must be held exclusively.
func (e *Engine) rejoinLocked(s *sub, leftAt time.Time) []byte {
	if !refcount(s.topic) {
		return nil
	}
	s.mu.Lock()
	if s.st == nil {
		s.mu.Unlock()
		return nil
	}
	floors := make([]int64, s.st.Partitions())
	for p := range floors {
		floors[p] = s.st.Floor(int32(p))
	}
	s.mu.Unlock()
	raised, skips := e.refcountStartsLocked(s.topic, s.meta.ID, floors)
	var items []rejoinItem
	for p, f := range raised {
		if f > floors[p] || len(skips[p]) > 0 {
			items = append(items, rejoinItem{partition: int32(p), floor: f, skips: skips[p]})
		}
	}
	if len(items) == 0 {
		return nil
	}
	s.mu.Lock()
	applyRejoin(s, leftAt.UnixNano(), items)
	s.mu.Unlock()
	if s.meta.Ephemeral {
		return nil
	}
	return encodeRejoin(s.meta.ID, leftAt.UnixNano(), items)
}

// rejoinItem is what a rejoin changes in one partition: the new ack floor, and the runs of
// offsets above it to mark done.
type rejoinItem struct {
	partition int32
	floor     int64
	skips     [][2]int64
}

// applyRejoin moves the floors of s up and marks the skipped runs done, recording the offsets it
// had not completed as removed at leftAt. Items of partitions s does not have are ignored (a
// damaged record). s.mu must be held (or Open be replaying).
func applyRejoin(s *sub, leftAt int64, items []rejoinItem) {
	if s.rc == nil {
		s.rc = completions{}
	}
	for _, it := range items {
		p := it.partition
		if p < 0 || int(p) >= s.st.Partitions() {
			continue
		}
		// removed records the offsets of [lo, hi) not done as removed: the gaps between the done
		// runs (done ones keep their own records), found run by run, not offset by offset.
		removed := func(lo, hi int64) {
			for _, r := range s.st.DoneRuns(p, lo, hi) {
				if lo < r[0] {
					s.rc.addRange(p, lo, r[0], leftAt, runRemoved)
				}
				lo = r[1]
			}
			if lo < hi {
				s.rc.addRange(p, lo, hi, leftAt, runRemoved)
			}
		}
		removed(s.st.Floor(p), it.floor)
		s.st.ForceFloor(p, it.floor)
		for _, r := range it.skips {
			removed(max(r[0], s.st.Floor(p)), r[1])
			for o := r[0]; o < r[1]; o++ {
				s.st.Complete(p, o)
			}
		}
	}
}

// markSkipped marks the skipped runs of a new subscription of a refcount topic done and records
// them excluded: it is not in their sets, like the messages below its start.
func markSkipped(s *sub, skips [][][2]int64) {
	for p, runs := range skips {
		for _, r := range runs {
			if s.rc == nil {
				s.rc = completions{}
			}
			s.rc.addRange(int32(p), r[0], r[1], 0, runExcluded)
			for o := r[0]; o < r[1]; o++ {
				s.st.Complete(int32(p), o)
			}
		}
	}
}

// MessageCompletion returns the completion record of a retained message of a refcount topic
// (storage.CompletionAuditor): per subscription whose set holds the message, its completion run
// (acked, dead-lettered, with the run's time), else pending (live) or removed (it left: the time
// it became DEAD or CANCELLED; or it came back and skipped the message: no time).
func (e *Engine) MessageCompletion(ctx context.Context, params *storage.MessageCompletionParams) (*storage.MessageCompletion, error) {
	if params == nil {
		return nil, invalid("nil params")
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if err := e.checkLocked(); err != nil {
		return nil, err
	}
	t := e.topics[params.Topic]
	if t == nil {
		return nil, topicNotFound(params.Topic)
	}
	if !refcount(t) {
		return nil, invalid("topic %q tracks completion by watermark: its messages have no completion record (completion_tracking refcount keeps one)", params.Topic)
	}
	p, o := params.Partition, params.Offset
	if p < 0 || int(p) >= len(t.parts) {
		return nil, invalid("topic %q has no partition %d", params.Topic, p)
	}
	part := t.parts[p]
	if part.log != nil && (o < part.log.FirstIndex() || o >= part.log.NextIndex()) {
		return nil, fmt.Errorf("%w: topic %q partition %d offset %d is not retained (retained: %d to %d)",
			storage.ErrOffsetOutOfRange, params.Topic, p, o, part.log.FirstIndex(), part.log.NextIndex()-1)
	}
	m, err := e.readMessage(t, p, o)
	if err != nil {
		return nil, err
	}
	out := &storage.MessageCompletion{Topic: t.meta.Name, Partition: p, Offset: o, PublishedAt: m.PublishedAt, Groups: []storage.GroupCompletion{}}
	ids := make([]int64, 0, len(t.subs))
	for id := range t.subs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	pending, done := false, false
	for _, id := range ids {
		s := t.subs[id]
		s.mu.Lock()
		g, in := auditSub(s, p, o, m.PublishedAt)
		s.mu.Unlock()
		if !in {
			continue
		}
		pending = pending || g.State == storage.CompletionPending
		done = done || g.State == storage.CompletionAcked || g.State == storage.CompletionDeadLettered
		out.Groups = append(out.Groups, g)
	}
	out.Complete = done && !pending
	return out, nil
}

// auditSub is s's entry in the completion record of offset o of partition p, published at
// published, and whether the message is (or was) in s's set. s.mu must be held.
func auditSub(s *sub, p int32, o int64, published time.Time) (storage.GroupCompletion, bool) {
	g := storage.GroupCompletion{SubscriptionID: s.meta.ID, Group: s.meta.Group}
	if o < startOf(s, p) {
		return g, false // joined after it, or skipped it as completed when it joined
	}
	if r, ok := s.rc.get(p, o); ok {
		g.State, g.At = storage.CompletionAcked, time.Unix(0, r.at).UTC()
		switch r.state {
		case runDLQ:
			g.State = storage.CompletionDeadLettered
		case runExcluded:
			return g, false // completed out of order before it joined
		case runRemoved:
			if published.After(g.At) {
				return g, false // published while it was DEAD, completed before it came back
			}
			g.State = storage.CompletionRemoved
		}
		return g, true
	}
	if s.st != nil && s.st.Done(p, o) {
		// Done without a record: completed without a delivery (expired by its TTL, or gone
		// from the log).
		g.State = storage.CompletionAcked
		return g, true
	}
	if s.meta.State.HoldsRetention() {
		g.State = storage.CompletionPending
		return g, true
	}
	if published.After(s.meta.UpdatedAt) {
		return g, false // published after it left
	}
	g.State, g.At = storage.CompletionRemoved, s.meta.UpdatedAt
	return g, true
}

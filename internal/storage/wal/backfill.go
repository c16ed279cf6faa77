package wal

import (
	"context"
	"slices"

	"github.com/spoolmq/spool/internal/storage"
)

// recSubBackfill replaces a subscription's backfill and raises its floors (JSON subBackfillRec).
// Part of the on-disk format.
const recSubBackfill byte = 27

// subBackfillRec sets a subscription's backfill (nil: none) and raises the floor and cursor of
// partition i to Floors[i] when that is above it (a cut or a skip; delivery state below it is
// dropped, as retention does).
type subBackfillRec struct {
	ID       int64             `json:"id"`
	Backfill *storage.Backfill `json:"backfill"`
	Floors   []int64           `json:"floors,omitempty"`
}

// applySubBackfill applies a subBackfillRec, live (e.mu held exclusively) and on replay. It
// returns how many messages below the raised floors were not done.
func (e *Engine) applySubBackfill(r *subBackfillRec) int64 {
	s := e.subs[r.ID]
	if s == nil || s.meta.State == storage.Deleted {
		return 0
	}
	s.meta.Backfill = r.Backfill.Clone()
	if s.st == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var skipped int64
	for i, f := range r.Floors {
		if i < s.st.Partitions() && f > s.st.Floor(int32(i)) {
			skipped += s.st.ForceFloor(int32(i), f)
		}
	}
	return skipped
}

// logEndsLocked returns, per partition of t, the first retained offset and the log end. A
// partition without a log (damaged at Open) reports both as endAfterRepair: nothing of it is
// in a range. e.mu must be held.
func logEndsLocked(t *topic) (firsts, ends []int64) {
	firsts, ends = make([]int64, len(t.parts)), make([]int64, len(t.parts))
	for i, p := range t.parts {
		firsts[i], ends[i] = endAfterRepair, endAfterRepair
		if p.log != nil {
			firsts[i], ends[i] = p.log.FirstIndex(), p.log.NextIndex()
		}
	}
	return firsts, ends
}

// newBackfillLocked makes the backfill of a subscription of a PUB_SUB topic t (none on a QUEUE
// topic) starting at starts (resolved start
// offsets, or floors), cut to maxMessages. It returns the backfill (nil: nothing to catch up) and
// the starts to use: raised where the cut dropped messages, else unchanged. e.mu must be held.
func (e *Engine) newBackfillLocked(t *topic, starts []int64, maxMessages int64) (*storage.Backfill, []int64) {
	if t.meta.Config.Semantics == storage.Queue {
		return nil, starts // a queue is never cut nor paced (see storage.Backfill)
	}
	firsts, ends := logEndsLocked(t)
	from := make([]int64, len(starts))
	for i := range starts {
		from[i] = starts[i]
		if i < len(firsts) {
			from[i] = max(starts[i], firsts[i])
		}
	}
	if len(ends) > len(from) {
		ends = ends[:len(from)]
	}
	bf, cut := storage.NewBackfill(from, ends, maxMessages, e.now())
	out := slices.Clone(starts)
	for i := range out {
		if i < len(cut) && cut[i] > from[i] {
			out[i] = cut[i]
		}
	}
	return bf, out
}

// SubscriptionBackfill acts on a subscription's backfill (storage.Engine). Begin and skip raise
// floors like retention does: leases below them are dropped (their holders' acks find the
// messages done).
func (e *Engine) SubscriptionBackfill(ctx context.Context, params *storage.SubscriptionBackfillParams) (*storage.SubscriptionBackfillResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	s, err := e.lockSub(params.ID, e.subWithState)
	if err != nil {
		return nil, err
	}
	now := e.now()
	rec := subBackfillRec{ID: s.meta.ID}
	var skipped int64
	switch params.Action {
	case storage.BackfillBegin:
		floors := make([]int64, len(s.topic.parts))
		s.mu.Lock()
		for i := range floors {
			floors[i] = s.st.Floor(int32(i))
		}
		s.mu.Unlock()
		bf, cut := e.newBackfillLocked(s.topic, floors, cmpOr(params.MaxMessages, s.meta.MaxBackfillMessages))
		if bf == nil {
			bf = s.meta.Backfill // nothing missed: the last range stays
		} else {
			rec.Floors, skipped = cut, bf.Skipped
		}
		rec.Backfill = bf
		e.applySubBackfill(&rec)
	case storage.BackfillSkip:
		bf := s.meta.Backfill.Clone()
		if err := storage.BackfillTransition(bf, params.Action, "", now); err != nil {
			e.mu.Unlock()
			return nil, err
		}
		rec.Backfill, rec.Floors = bf, slices.Clone(bf.End)
		// The record carries the final count: apply, count what the raised floors dropped, and
		// log the backfill with it (replay sets it and raises the same floors).
		skipped = e.applySubBackfill(&rec)
		bf = bf.Clone()
		bf.Skipped += skipped
		rec.Backfill = bf
		s.meta.Backfill = bf.Clone()
	default:
		bf := s.meta.Backfill.Clone()
		if err := storage.BackfillTransition(bf, params.Action, params.Error, now); err != nil {
			e.mu.Unlock()
			return nil, err
		}
		rec.Backfill = bf
		e.applySubBackfill(&rec)
	}
	out := &storage.SubscriptionBackfillResult{Subscription: cloneSub(s), Skipped: skipped}
	var ch <-chan error
	if !s.meta.Ephemeral {
		ch = e.queueStateWait(encodeJSON(recSubBackfill, &rec))
	}
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	return out, nil
}

func cmpOr(a, b int64) int64 {
	if a != 0 {
		return a
	}
	return b
}

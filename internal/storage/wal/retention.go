package wal

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// partPlan is what retention removes from one partition.
type partPlan struct {
	p       *partition
	pi      int
	first   int64 // the first retained index before the run
	cut     int64 // delete whole segments below this index
	cutHead bool  // seal the active segment first
	// expired counts, by reason (the index in expiryReasons), the messages below cut that a
	// subscription with state had not completed.
	expired [len(expiryReasons)]int64
	// rule and rest (the segments from cut on, after the age rules) are for the size bound,
	// which removes sized records of sizedBytes bytes.
	rule              retentionRule
	rest              []wlog.SegmentInfo
	sized, sizedBytes int64
}

// expiryReasons are the reasons of RetentionResult.Expired, in the order they take precedence,
// indexed by the constants below.
var expiryReasons = [...]storage.ExpiryReason{
	byMaxRetention:     storage.ExpiredMaxRetention,
	byZeroSubscription: storage.ExpiredZeroSubscription,
	byDeadSubscription: storage.ExpiredDeadSubscription,
	bySize:             storage.ExpiredSize,
}

const (
	byMaxRetention = iota
	byZeroSubscription
	byDeadSubscription
	bySize
)

// retentionRule decides, for one partition at one time, what retention may remove.
type retentionRule struct {
	now int64 // unix ns
	cfg storage.TopicConfig
	// minHold and minAll are the lowest floors of the subscriptions that hold retention and of all
	// those with state (-1: none).
	minHold, minAll int64
}

// removable reports whether the records below end, the newest of which was published at newest,
// may be removed, and the index in expiryReasons of the rule that allows it: the reason of those
// of them a subscription with state had not completed (offset >= minAll).
func (r retentionRule) removable(end, newest int64) (reason int, ok bool) {
	age := r.now - newest
	switch {
	case age > int64(r.cfg.MaxRetention):
		return byMaxRetention, true
	case r.minHold >= 0:
		// Only DEAD subscriptions can be behind minHold.
		return byDeadSubscription, end <= r.minHold && age > int64(r.cfg.MessageRetention)
	default:
		// Below minAll every subscription completed them: nothing there is expired.
		return byZeroSubscription, age > int64(r.cfg.ZeroSubscriptionRetention) ||
			(r.minAll >= 0 && end <= r.minAll && age > int64(r.cfg.MessageRetention))
	}
}

// RetentionApply deletes what retention allows at the engine's current time, topic by topic and
// partition by partition, in whole segments (oldest first, stopping at the first one that must
// stay):
//
//   - a segment entirely below the retention floor (the lowest ack floor of the subscriptions that
//     hold retention: ACTIVE and PAUSED ones, ephemeral ones included) whose newest message is
//     older than message_retention;
//   - with no subscription holding retention, a segment whose newest message is older than
//     zero_subscription_retention (also on QUEUE topics whose queue subscription is DEAD or
//     CANCELLED), or one that every subscription with state (DEAD ones) completed and is older
//     than message_retention;
//   - any segment whose newest message is older than max_retention.
//
// The active segment is sealed (wlog.Log.Cut) when those rules allow its oldest message to go,
// however short the durations: deleted at once when they allow all of it, else at a later run,
// once they allow its newest message too. An empty active segment is never sealed, and one is
// sealed only when retention will delete at least part of it, so a partition rolls at most once
// per run and keeps at most one such sealed segment waiting. Removed messages that some
// subscription with state had not completed are counted in MessagesExpired and Expired, with the
// reason of the rule that removed them (the precedence of storage.ExpiryReason), and the floors
// of those subscriptions are force-advanced (recorded in the state log before any file is
// deleted); the others in MessagesDeleted. DLQ entries dead for longer than max_retention are
// removed and counted. Backlog is what the run found removable and left in the logs (a seal or
// a deletion that failed); damaged partitions, left for the repair, are not counted. Calls are
// serialized.
func (e *Engine) RetentionApply(ctx context.Context) (*storage.RetentionResult, error) {
	e.retentionMu.Lock()
	defer e.retentionMu.Unlock()
	e.mu.RLock()
	if err := e.checkLocked(); err != nil {
		e.mu.RUnlock()
		return nil, err
	}
	topics := make([]*topic, 0, len(e.topics))
	for _, t := range e.topics {
		topics = append(topics, t)
	}
	e.mu.RUnlock()
	slices.SortFunc(topics, func(a, b *topic) int { return strings.Compare(a.meta.Name, b.meta.Name) })
	res := &storage.RetentionResult{}
	for _, t := range topics {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := e.retainTopic(ctx, t, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func (e *Engine) retainTopic(ctx context.Context, t *topic, res *storage.RetentionResult) error {
	e.mu.RLock()
	if err := e.checkLocked(); err != nil {
		e.mu.RUnlock()
		return err
	}
	if e.topics[t.meta.Name] != t {
		e.mu.RUnlock()
		return nil // deleted meanwhile
	}
	now := e.now()
	nowNs := now.UnixNano()
	cfg := t.meta.Config
	t.dedup.prune(nowNs, &e.dedupIDs) // producer ids of an idle topic expire too
	// Locked in ID order: the subscriptions with state and the CANCELLED ones whose completion
	// records are trimmed (one sorted set, so a CANCELLED one is never locked after a higher ID).
	var withState, cancelled, locked []*sub
	for _, s := range t.subs {
		switch {
		case s.st != nil:
			withState = append(withState, s)
			locked = append(locked, s)
		case s.rc != nil:
			cancelled = append(cancelled, s)
			locked = append(locked, s)
		}
	}
	byID := func(a, b *sub) int { return cmp.Compare(a.meta.ID, b.meta.ID) }
	slices.SortFunc(withState, byID)
	slices.SortFunc(locked, byID)
	for _, s := range locked {
		s.mu.Lock()
	}
	unlockSubs := func() {
		for _, s := range locked {
			s.mu.Unlock()
		}
	}

	var floors []floorItem
	e.advanceZombies(t, withState, nowNs, &floors, res)
	var plans []partPlan
	for pi, p := range t.parts {
		if p.damaged() != nil {
			continue // left as it is for the repair
		}
		minHold, minAll := int64(-1), int64(-1)
		for _, s := range withState {
			f := s.st.Floor(int32(pi))
			if minAll < 0 || f < minAll {
				minAll = f
			}
			if s.meta.State.HoldsRetention() && (minHold < 0 || f < minHold) {
				minHold = f
			}
		}
		rule := retentionRule{now: nowNs, cfg: cfg, minHold: minHold, minAll: minAll}
		first := p.log.FirstIndex()
		plan := partPlan{p: p, pi: pi, first: first, cut: first, rule: rule}
		segs := p.log.Segments()
		k := 0
		for ; k < len(segs); k++ {
			seg := segs[k]
			if seg.Count == 0 {
				break
			}
			end := seg.BaseIndex + seg.Count
			reason, ok := rule.removable(end, seg.MaxTime)
			if !ok {
				// Seal the active segment once its oldest message may go: a later run deletes
				// it when its newest may too.
				if _, old := rule.removable(seg.BaseIndex+1, seg.MinTime); old && !seg.Sealed {
					plan.cutHead = true
				}
				break
			}
			if !seg.Sealed {
				plan.cutHead = true
			}
			if minAll >= 0 && end > minAll {
				e.countExpired(&plan, rule, reason, seg.MinTime, max(seg.BaseIndex, minAll), end)
			}
			plan.cut = end
		}
		plan.rest = segs[k:]
		plans = append(plans, plan)
	}
	if cfg.HasSizeBound() {
		planSize(cfg, plans)
	}
	kept := plans[:0]
	for _, plan := range plans {
		if plan.cut <= plan.first {
			if plan.cutHead {
				kept = append(kept, plan)
			}
			continue
		}
		pi := plan.pi
		for _, s := range cancelled { // CANCELLED: its records stay until the messages go (locked)
			s.rc.trim(int32(pi), plan.cut)
		}
		for _, s := range withState {
			s.rc.trim(int32(pi), plan.cut)
			if s.st.Floor(int32(pi)) < plan.cut {
				s.st.ForceFloor(int32(pi), plan.cut)
				if pi < len(s.watch) {
					s.watch[pi].floor = s.st.Floor(int32(pi)) // forced, not its own progress: still stuck
				}
				if !s.meta.Ephemeral {
					floors = append(floors, floorItem{sub: s.meta.ID, partition: int32(pi), floor: plan.cut})
				}
			}
		}
		kept = append(kept, plan)
	}
	plans = kept
	var expired []dlqExpiry
	var compact []dlqCompaction
	before := nowNs - int64(cfg.MaxRetention)
	for _, s := range withState {
		if s.dlq == nil {
			continue
		}
		if e.dropIdleDLQLocked(s) {
			continue
		}
		// Entries are in DeadAt order in their log (frame timestamps never decrease, so an entry
		// dead-lettered while the clock was behind expires with the next ones: late, never early).
		if s.st.DLQLen() > 0 {
			if end, err := s.dlq.log.SearchTime(before); err != nil {
				e.logger.Warn("wal: DLQ expiry", slog.Int64("subscription", s.meta.ID), slog.Any("error", err))
			} else if ids := s.st.DLQExpireBelow(end + 1); len(ids) > 0 {
				res.DLQEntriesExpired += int64(len(ids))
				if !s.meta.Ephemeral {
					expired = append(expired, dlqExpiry{sub: s.meta.ID, ids: ids})
				}
			}
		}
		if keep := dlqKeepFrom(s.st); keep > s.dlq.log.FirstIndex() {
			compact = append(compact, dlqCompaction{s.dlq.log, keep})
		}
	}
	// Queued before the subscriptions are unlocked, so no later change of theirs precedes it in
	// the state log.
	var ch <-chan error
	if len(floors) > 0 || len(expired) > 0 {
		// Records of at most Config.dlqIDsPerRecord expired IDs; waiting for the last one waits
		// for all.
		for first := true; first || len(expired) > 0; first = false {
			var part []dlqExpiry
			for n := 0; len(expired) > 0 && n < e.cfg.dlqIDsPerRecord; {
				x := &expired[0]
				k := min(len(x.ids), e.cfg.dlqIDsPerRecord-n)
				part = append(part, dlqExpiry{sub: x.sub, ids: x.ids[:k]})
				n += k
				if x.ids = x.ids[k:]; len(x.ids) == 0 {
					expired = expired[1:]
				}
			}
			ch = e.queueStateWait(encodeRetention(floors, part))
			floors = nil
		}
	}
	unlockSubs()
	if len(plans) > 0 || len(compact) > 0 {
		t.inflight.Add(1) // TopicDelete waits for the file work below
		defer t.inflight.Done()
	}
	e.mu.RUnlock()
	if ch != nil {
		// The new floors are durable before the messages below them disappear.
		if err := wait(context.WithoutCancel(ctx), ch); err != nil {
			return err
		}
	}
	for _, c := range compact {
		// Whole segments of records no longer needed (the expiry above is durable: the records
		// of expired entries are not read again after a crash either).
		if _, _, err := c.log.DeleteBefore(c.before); err != nil && !errors.Is(err, storage.ErrClosed) {
			e.logger.Warn("wal: DLQ log compaction", slog.String("dir", c.log.Dir()), slog.Any("error", err))
		}
	}
	for _, plan := range plans {
		if plan.cutHead {
			if err := plan.p.log.Cut(); err != nil {
				e.logger.Warn("wal: retention cut", slog.String("dir", plan.p.dir), slog.Any("error", err))
				continue
			}
		}
		recs, bytes, err := plan.p.log.DeleteBefore(plan.cut)
		if err != nil {
			// The segments left the log before their files were removed (a removal that failed
			// leaves a file Open cleans up): recs were removed all the same and are counted.
			e.logger.Warn("wal: retention delete", slog.String("dir", plan.p.dir), slog.Any("error", err))
		}
		// recs is what was planned: the segments below cut are sealed, and only this
		// (serialized) call deletes. min guards the counts all the same.
		var exp int64
		for i, n := range plan.expired {
			n = min(n, recs-exp)
			res.AddExpired(t.meta.Name, expiryReasons[i], n)
			exp += n
		}
		res.MessagesDeleted += recs - exp
		// The size bound's segments are the last planned: what was not deleted is theirs.
		if sized := min(plan.sized, recs-(plan.cut-plan.first-plan.sized)); sized > 0 {
			res.AddSizeRemoved(t.meta.Name, sized, min(plan.sizedBytes, bytes))
		}
		res.BytesDeleted += bytes
		if recs > 0 {
			e.logger.Debug("wal retention", slog.String("topic", t.meta.Name), slog.Int("partition", int(plan.p.index)),
				slog.Int64("deleted", recs-exp), slog.Int64("expired", exp), slog.Int64("bytes", bytes))
		}
	}
	// The backlog: what this run found removable and is still in the log (a seal or a deletion
	// that failed, records not yet durable). Only this (serialized) call deletes, so the log's
	// first index tells.
	for _, plan := range plans {
		res.Backlog += max(plan.cut-plan.p.log.FirstIndex(), 0)
	}
	return nil
}

// planSize extends the plans of a topic above max_messages or max_bytes (after the age rules):
// it removes whole segments, the oldest first across partitions (by their newest message), while
// the topic is above a bound. A partition gives segments up to the first one that must stay:
// one that a subscription holding retention has not completed (size_policy keep_needed), or the
// empty active segment. The active segment is sealed and removed when it may go entirely. So a
// run leaves the topic at or below its bounds, by up to one segment, unless what is left is
// needed. Messages a subscription with state had not completed are expired with reason size.
func planSize(cfg storage.TopicConfig, plans []partPlan) {
	var msgs, bytes int64
	for i := range plans {
		for _, seg := range plans[i].rest {
			msgs += seg.Count
			bytes += seg.Bytes
		}
	}
	for cfg.OverSize(msgs, bytes) {
		best := -1
		for i := range plans {
			pl := &plans[i]
			if len(pl.rest) == 0 {
				continue
			}
			seg := pl.rest[0]
			end := seg.BaseIndex + seg.Count
			if seg.Count == 0 || (cfg.SizePolicy != storage.SizeDropOldest && pl.rule.minHold >= 0 && end > pl.rule.minHold) {
				continue // needed (or nothing to remove): the partition gives nothing more
			}
			if best < 0 || seg.MaxTime < plans[best].rest[0].MaxTime {
				best = i
			}
		}
		if best < 0 {
			return
		}
		pl := &plans[best]
		seg := pl.rest[0]
		pl.rest = pl.rest[1:]
		end := seg.BaseIndex + seg.Count
		if !seg.Sealed {
			pl.cutHead = true
		}
		if minAll := pl.rule.minAll; minAll >= 0 && end > minAll {
			pl.expired[bySize] += end - max(seg.BaseIndex, minAll)
		}
		pl.cut = end
		pl.sized += seg.Count
		pl.sizedBytes += seg.Bytes
		msgs -= seg.Count
		bytes -= seg.Bytes
	}
}

// floorWatch is what retention last saw of a subscription's ack floor in one partition: the floor
// and since when (unix ns) it has not moved by the subscription's own doing.
type floorWatch struct {
	floor, since int64
	set          bool
}

// advanceZombies force-advances the stuck floors of t's subscriptions that hold retention
// (zombie_ttl; see storage.Engine.RetentionApply): a floor retention saw at the same offset for
// longer than zombie_ttl moves to the first message published at or after now minus zombie_ttl.
// The new floors are added to floors (to be recorded before any file is deleted) and what was
// given up to res. The subscriptions are locked.
func (e *Engine) advanceZombies(t *topic, subs []*sub, now int64, floors *[]floorItem, res *storage.RetentionResult) {
	// With defaults: a config written before zombie_ttl existed (or by hand) holds 0, which must
	// mean the default, not "advance every floor at once". A negative one turns it off.
	ttl := int64(t.meta.Config.WithDefaults().ZombieTTL)
	if ttl <= 0 {
		return
	}
	for _, s := range subs {
		if !s.meta.State.HoldsRetention() {
			s.watch = nil // DEAD: nothing to hold; watched afresh once it holds again
			continue
		}
		for len(s.watch) < len(t.parts) {
			s.watch = append(s.watch, floorWatch{})
		}
		for pi, p := range t.parts {
			w := &s.watch[pi]
			f := s.st.Floor(int32(pi))
			if !w.set || w.floor != f {
				*w = floorWatch{floor: f, since: now, set: true}
				continue
			}
			if now-w.since <= ttl || p.damaged() != nil {
				continue
			}
			to, err := p.log.SearchTime(now - ttl)
			if err != nil {
				e.logger.Warn("wal: zombie_ttl search", slog.String("dir", p.dir), slog.Any("error", err))
				continue
			}
			if to <= f {
				continue
			}
			res.AddZombie(t.meta.Name, s.meta.Group, s.meta.ID, s.st.ForceFloor(int32(pi), to))
			w.floor = s.st.Floor(int32(pi)) // since is kept: the subscription itself did not move
			if !s.meta.Ephemeral {
				*floors = append(*floors, floorItem{sub: s.meta.ID, partition: int32(pi), floor: to})
			}
		}
	}
}

// dlqCompaction deletes the segments of a DLQ log below index before (retainTopic).
type dlqCompaction struct {
	log    *wlog.Log
	before int64
}

// countExpired adds to plan the messages [from, end) of one removable segment, whose oldest
// message was published at oldest, that a subscription had not completed, for reason (an index in
// expiryReasons). Those older than max_retention count as max_retention, as on PostgreSQL, which
// removes message by message: the segment is removable by another rule, but its oldest messages
// may be past the cap (found with the log's time search, which reads a few timestamps).
func (e *Engine) countExpired(plan *partPlan, rule retentionRule, reason int, oldest, from, end int64) {
	if reason != byMaxRetention && rule.now-oldest > int64(rule.cfg.MaxRetention) {
		bound, err := plan.p.log.SearchTime(rule.now - int64(rule.cfg.MaxRetention))
		if err == nil && bound > from {
			n := min(bound, end) - from
			plan.expired[byMaxRetention] += n
			from += n
		}
	}
	plan.expired[reason] += end - from
}

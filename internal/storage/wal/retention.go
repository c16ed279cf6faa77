package wal

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"

	"github.com/spoolmq/spool/internal/storage"
)

// partPlan is what retention removes from one partition.
type partPlan struct {
	p       *partition
	cut     int64 // delete whole segments below this index
	cutHead bool  // seal the active segment first
	expired int64 // messages below cut that a subscription had not completed
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
// The active segment is sealed first when it alone blocks that and its oldest message is older
// than Config.RetentionCutAge. Removed messages that some subscription had not completed are
// counted in MessagesExpired and the floors of those subscriptions are force-advanced (recorded
// in the state log before any file is deleted); the others in MessagesDeleted. DLQ entries dead
// for longer than max_retention are removed and counted. Calls are serialized.
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
		if err := ctxErr(ctx); err != nil {
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
	var withState []*sub
	for _, s := range t.subs {
		if s.st != nil {
			withState = append(withState, s)
		}
	}
	slices.SortFunc(withState, func(a, b *sub) int { return cmp.Compare(a.meta.ID, b.meta.ID) })
	for _, s := range withState {
		s.mu.Lock()
	}
	unlockSubs := func() {
		for _, s := range withState {
			s.mu.Unlock()
		}
	}

	var plans []partPlan
	var floors []floorItem
	for pi, p := range t.parts {
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
		first := p.log.FirstIndex()
		plan := partPlan{p: p, cut: first}
		for _, seg := range p.log.Segments() {
			if seg.Count == 0 {
				break
			}
			end := seg.BaseIndex + seg.Count
			age := nowNs - seg.MaxTime
			ok := age > int64(cfg.MaxRetention)
			if !ok && minHold >= 0 {
				ok = end <= minHold && age > int64(cfg.MessageRetention)
			}
			if !ok && minHold < 0 {
				ok = age > int64(cfg.ZeroSubscriptionRetention) ||
					(minAll >= 0 && end <= minAll && age > int64(cfg.MessageRetention))
			}
			if !ok {
				break
			}
			if !seg.Sealed {
				if nowNs-seg.MinTime < int64(e.cfg.RetentionCutAge) {
					break
				}
				plan.cutHead = true
			}
			plan.cut = end
		}
		if plan.cut <= first {
			continue
		}
		if minAll >= 0 && plan.cut > minAll {
			plan.expired = plan.cut - max(first, minAll)
		}
		for _, s := range withState {
			if s.st.Floor(int32(pi)) < plan.cut {
				s.st.ForceFloor(int32(pi), plan.cut)
				if !s.meta.Ephemeral {
					floors = append(floors, floorItem{sub: s.meta.ID, partition: int32(pi), floor: plan.cut})
				}
			}
		}
		plans = append(plans, plan)
	}
	var expired []dlqExpiry
	before := nowNs - int64(cfg.MaxRetention)
	for _, s := range withState {
		ids := s.st.DLQExpire(before)
		res.DLQEntriesExpired += int64(len(ids))
		if len(ids) > 0 && !s.meta.Ephemeral {
			expired = append(expired, dlqExpiry{sub: s.meta.ID, ids: ids})
		}
	}
	// Queued before the subscriptions are unlocked, so no later change of theirs precedes it in
	// the state log.
	var ch <-chan error
	if len(floors) > 0 || len(expired) > 0 {
		ch = e.queueStateWait(encodeRetention(floors, expired))
	}
	unlockSubs()
	if len(plans) > 0 {
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
	for _, plan := range plans {
		if plan.cutHead {
			if err := plan.p.log.Cut(); err != nil {
				e.logger.Warn("wal: retention cut", slog.String("dir", plan.p.dir), slog.Any("error", err))
				continue
			}
		}
		recs, bytes, err := plan.p.log.DeleteBefore(plan.cut)
		if err != nil {
			e.logger.Warn("wal: retention delete", slog.String("dir", plan.p.dir), slog.Any("error", err))
			continue
		}
		exp := min(recs, plan.expired)
		res.MessagesExpired += exp
		res.MessagesDeleted += recs - exp
		res.BytesDeleted += bytes
		if recs > 0 {
			e.logger.Debug("wal retention", slog.String("topic", t.meta.Name), slog.Int("partition", int(plan.p.index)),
				slog.Int64("deleted", recs-exp), slog.Int64("expired", exp), slog.Int64("bytes", bytes))
		}
	}
	return nil
}

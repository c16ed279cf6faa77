package wal

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Subscription lifecycle (seed 000): heartbeats and the jobs that make ACTIVE subscriptions DEAD
// and CANCELLED ones DELETED. A heartbeat is not logged: the last one lives in memory (sub.lastBeat)
// and Open gives every subscription a fresh timeout, so a restart never makes a subscription DEAD
// by itself. The transitions are logged as ordinary subscription updates (recSubUpdate).

// heartbeatTimeoutField is what a subscription record stores for a heartbeat timeout: zero for the
// default, so records of subscriptions with the default keep the bytes they had before heartbeat
// timeouts existed (golden_test.go). cloneSub reads zero as the default.
func heartbeatTimeoutField(d time.Duration) time.Duration {
	if d == storage.DefaultHeartbeatTimeout {
		return 0
	}
	return d
}

// startHeartbeats gives every subscription a heartbeat at Open.
func (e *Engine) startHeartbeats() {
	now := e.now()
	for _, s := range e.subs {
		s.lastBeat = now
	}
}

// SubscriptionsHeartbeat records a heartbeat for each subscription of params.IDs that is ACTIVE,
// PAUSED or DEAD, and makes the DEAD ones ACTIVE.
func (e *Engine) SubscriptionsHeartbeat(ctx context.Context, params *storage.SubscriptionsHeartbeatParams) (*storage.SubscriptionsHeartbeatResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	now := e.now()
	res := &storage.SubscriptionsHeartbeatResult{}
	var chs []<-chan error
	ids := slices.Clone(params.IDs)
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		s, err := e.subLocked(id)
		if err != nil || s.meta.State == storage.Cancelled {
			continue
		}
		res.Beats++
		s.lastBeat = now
		if s.meta.State != storage.Dead {
			continue
		}
		rec := subUpdateRec{ID: id, State: storage.Active, At: now}
		leftAt := s.meta.UpdatedAt
		e.applySubUpdate(&rec)
		res.Resurrected = append(res.Resurrected, cloneSub(s))
		if !s.meta.Ephemeral {
			chs = append(chs, e.queueStateWait(encodeJSON(recSubUpdate, &rec)))
		}
		if r := e.rejoinLocked(s, leftAt); r != nil {
			chs = append(chs, e.queueStateWait(r))
		}
	}
	e.mu.Unlock()
	for _, ch := range chs {
		if err := wait(ctx, ch); err != nil {
			return nil, err
		}
	}
	sortSubs(res.Resurrected)
	for _, s := range res.Resurrected {
		e.subscriptionChanged(s.Topic, s.ID)
	}
	return res, nil
}

// SubscriptionsMaintain makes ACTIVE subscriptions past their heartbeat timeout DEAD and CANCELLED
// ones past the retention DELETED, under e.mu: each transition happens once.
func (e *Engine) SubscriptionsMaintain(ctx context.Context, params *storage.SubscriptionsMaintainParams) (*storage.SubscriptionsMaintainResult, error) {
	retention, err := params.Check()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	now := e.now()
	res := &storage.SubscriptionsMaintainResult{}
	var chs []<-chan error
	var changed []storage.Notification // ephemeral ones deleted included
	for id, s := range e.subs {
		if s.topic == nil {
			continue // DELETED
		}
		var to storage.SubscriptionState
		switch {
		case s.meta.State == storage.Active && now.Sub(s.lastBeat) > cmp.Or(s.meta.HeartbeatTimeout, storage.DefaultHeartbeatTimeout):
			to = storage.Dead
		case s.meta.State == storage.Cancelled && now.Sub(s.meta.UpdatedAt) > retention:
			to = storage.Deleted
		default:
			continue
		}
		rec := subUpdateRec{ID: id, State: to, At: now}
		ephemeral := s.meta.Ephemeral
		changed = append(changed, storage.Notification{Kind: storage.NotifySubscription, Topic: s.meta.Topic, SubscriptionID: id})
		e.applySubUpdate(&rec)
		if to == storage.Dead {
			res.Dead = append(res.Dead, cloneSub(s))
		} else if !ephemeral {
			res.Deleted = append(res.Deleted, cloneSub(s))
		}
		if !ephemeral {
			chs = append(chs, e.queueStateWait(encodeJSON(recSubUpdate, &rec)))
		}
	}
	e.mu.Unlock()
	for _, ch := range chs {
		if err := wait(ctx, ch); err != nil {
			return nil, err
		}
	}
	sortSubs(res.Dead)
	sortSubs(res.Deleted)
	for _, n := range changed {
		e.notify(n)
	}
	return res, nil
}

func sortSubs(ss []*storage.Subscription) {
	slices.SortFunc(ss, func(a, b *storage.Subscription) int { return cmp.Compare(a.ID, b.ID) })
}

// hasProgressLocked reports whether a subscription delivered, acked or dead-lettered anything
// since its start was set: a partition's floor or cursor left its start offset (0 for one added
// later, or when the metadata keeps none: startOffsets), a message is done ahead of the floor, or
// something is leased, waiting or in the DLQ.
// e.mu and s.mu must be held.
func (e *Engine) hasProgressLocked(s *sub) bool {
	if s.st == nil {
		return true
	}
	if in, waiting := s.st.Counts(); in+waiting > 0 || s.st.DLQLen() > 0 {
		return true
	}
	for i, p := range s.topic.parts {
		start := int64(0)
		if i < len(s.meta.StartOffsets) {
			start = s.meta.StartOffsets[i]
		}
		hw := s.st.Cursor(int32(i))
		if p.log != nil {
			hw = p.log.NextIndex()
		}
		floor, cursor, pending := s.st.PartStats(int32(i), hw)
		if floor != start || cursor != start || pending != max(hw-floor, 0) {
			return true
		}
	}
	return false
}

// SubscriptionConfigure changes a durable subscription's heartbeat timeout and, without progress,
// its start position. A new start is logged as a subscription create record with the same ID
// (applySubCreate starts the subscription again); a timeout alone as the same, keeping the state.
func (e *Engine) SubscriptionConfigure(ctx context.Context, params *storage.SubscriptionConfigureParams) (*storage.Subscription, error) {
	start, err := params.Check()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	s, err := e.subLocked(params.ID)
	if err == nil {
		err = checkConfigurable(&s.meta)
	}
	if err != nil {
		e.mu.Unlock()
		return nil, err
	}
	s.mu.Lock()
	progress := e.hasProgressLocked(s)
	s.mu.Unlock()
	meta := s.meta
	meta.StartOffsets = nil
	var starts []int64 // nil: the delivery state stays, the record must not start it again
	if start != nil {
		if progress {
			e.mu.Unlock()
			return nil, fmt.Errorf("%w: subscription %d of group %q on topic %q", storage.ErrSubscriptionHasProgress, s.meta.ID, s.meta.Group, s.meta.Topic)
		}
		if starts, err = e.resolveStartLocked(s.topic, *start); err != nil {
			e.mu.Unlock()
			return nil, err
		}
		meta.Start = *start
		meta.Backfill, starts = e.newBackfillLocked(s.topic, starts, meta.MaxBackfillMessages)
	}
	if params.HeartbeatTimeout != 0 {
		meta.HeartbeatTimeout = heartbeatTimeoutField(params.HeartbeatTimeout)
	}
	meta.UpdatedAt = e.now()
	var rec []byte
	if starts != nil {
		r := subRec{Sub: meta, Starts: starts}
		if refcount(s.topic) {
			r.Starts, r.Skips = e.refcountStartsLocked(s.topic, s.meta.ID, starts)
		}
		e.applySubCreate(s.topic, &r)
		rec = encodeJSON(recSubCreate, &r)
	} else {
		r := subUpdateRec{ID: meta.ID, State: meta.State, At: meta.UpdatedAt, HeartbeatTimeout: params.HeartbeatTimeout}
		e.applySubUpdate(&r)
		rec = encodeJSON(recSubUpdate, &r)
	}
	out := cloneSub(s)
	ch := e.queueStateWait(rec)
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	return out, nil
}

// checkConfigurable refuses SubscriptionConfigure of an ephemeral or CANCELLED subscription.
func checkConfigurable(s *storage.Subscription) error {
	switch {
	case s.Ephemeral:
		return invalid("subscription %d is ephemeral: only a durable subscription can be configured", s.ID)
	case s.State == storage.Cancelled:
		return fmt.Errorf("%w: subscription %d is CANCELLED and cannot be configured", storage.ErrInvalidTransition, s.ID)
	}
	return nil
}

package broker

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// The subscription lifecycle job (seed 000's dead-consumer detection and subscription cleanup).
// Every run, the broker
//  1. heartbeats the subscriptions its members are attached to (Engine.SubscriptionsHeartbeat),
//     which also resurrects a DEAD one that has a member here again;
//  2. unless Config.LifecycleInterval is negative, runs Engine.SubscriptionsMaintain: ACTIVE
//     subscriptions without a heartbeat for their heartbeat timeout become DEAD, CANCELLED ones
//     older than Config.SubscriptionRetention become DELETED (each transition made once, also
//     with several broker instances on one database).
//
// Debounce: a subscription goes DEAD only after a whole heartbeat timeout without any heartbeat
// from any instance, and comes back only with a member attached (attach or heartbeat), so a
// member that crashes and reconnects within the timeout never flips the state. The run interval
// is at most a fifth of the shortest heartbeat timeout of the subscriptions (seed 000: detection
// interval <= 20% of the timeout), at least MinLifecycleInterval, from the start and at once
// when a group with a shorter timeout appears here (lifecycleSooner): DEAD comes between the
// timeout and the timeout plus one interval after the last heartbeat.

// DefaultLifecycleInterval is Config.LifecycleInterval's default (seed 000: detection every
// minute for the 5-minute default timeout).
const DefaultLifecycleInterval = time.Minute

// MinLifecycleInterval is the shortest interval between two runs.
const MinLifecycleInterval = time.Second

// LifecycleResult is what one run of the lifecycle job changed, for Config.OnLifecycle. The
// transitions made outside the job are reported the same way, each once, with Job false and only
// Resurrected or Deleted set: a member attaching resurrects a DEAD subscription
// (heartbeatAttached, resolveSubscription), an admin resumes or resurrects a DEAD group, or
// removes a group (RemoveGroup: CANCELLED then DELETED at once).
type LifecycleResult struct {
	// Job is true for a run of the lifecycle job.
	Job bool
	// Heartbeats counts the subscriptions heartbeated.
	Heartbeats int
	// Resurrected are the subscriptions that were DEAD and are ACTIVE again.
	Resurrected []*storage.Subscription
	// Dead are the subscriptions that became DEAD.
	Dead []*storage.Subscription
	// Deleted are the CANCELLED subscriptions that became DELETED.
	Deleted []*storage.Subscription
	// Took is how long the run took; Err is its failure, nil if none.
	Took time.Duration
	Err  error
}

// lifecycleLoop runs the lifecycle job until Stop, at the interval nextLifecycle chooses (Start
// computed the first, wait). The interval is measured on the broker's clock from the start of the
// previous run (or Start): a subscription with a shorter heartbeat timeout appearing
// (lifecycleSooner) shortens the wait at once, and a run that is already due starts at once.
func (b *Broker) lifecycleLoop(start time.Time, wait time.Duration) {
	last := start
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		timer := false
		select {
		case <-b.quit:
			return
		case <-b.lifecycleResched:
			wait = b.nextLifecycle(b.rootCtx)
		case <-b.lifecycleCheck:
		case <-t.C:
			timer = true
		}
		if left := wait - b.clock.Now().Sub(last); left > 0 {
			// Not due yet: rescheduled, or the timer fired before a clock that is not the
			// system's (a test's fake clock) reached the time; wait a whole interval then, so a
			// clock that stands still costs no spinning.
			if timer {
				left = wait
			}
			t.Reset(left)
			continue
		}
		last = b.clock.Now()
		b.runLifecycle(b.rootCtx)
		wait = b.nextLifecycle(b.rootCtx)
		t.Reset(wait)
	}
}

// nextLifecycle is the wait before the next run: the configured interval, or a fifth of the
// shortest heartbeat timeout of a live subscription if that is shorter, at least
// MinLifecycleInterval. It records the wait for lifecycleSooner.
func (b *Broker) nextLifecycle(ctx context.Context) time.Duration {
	// While the list is read a new subscription must reschedule: it may not be in the list.
	b.lifecycleWait.Store(math.MaxInt64)
	wait := b.lifecycleInterval
	subs, err := b.engine.SubscriptionList(ctx, nil)
	if err == nil {
		for _, s := range subs {
			if s.State == storage.Active && s.HeartbeatTimeout > 0 {
				wait = min(wait, s.HeartbeatTimeout/5)
			}
		}
	}
	wait = max(wait, MinLifecycleInterval)
	b.lifecycleWait.Store(int64(wait))
	return wait
}

// lifecycleSooner reschedules the lifecycle loop when an ACTIVE subscription with this heartbeat
// timeout needs a shorter interval than the loop's (a group created, updated, resumed or
// attached here), so DEAD is detected within the timeout plus a fifth of it from the start.
func (b *Broker) lifecycleSooner(timeout time.Duration) {
	if timeout <= 0 || int64(max(timeout/5, MinLifecycleInterval)) >= b.lifecycleWait.Load() {
		return
	}
	select {
	case b.lifecycleResched <- struct{}{}:
	default: // one is pending
	}
}

// checkLifecycle makes the loop check whether a run is due now (tests call it after moving a
// fake clock).
func (b *Broker) checkLifecycle() {
	select {
	case b.lifecycleCheck <- struct{}{}:
	default:
	}
}

// attachedSubscriptions lists the IDs of the subscriptions that have a member on this broker.
func (b *Broker) attachedSubscriptions() []int64 {
	var ids []int64
	for _, m := range b.Members() {
		ids = append(ids, m.Subscriptions...)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// runLifecycle runs the lifecycle job once, logs every transition (the audit trail: a DELETED
// subscription disappears from listings, its log line stays) and reports to Config.OnLifecycle.
func (b *Broker) runLifecycle(ctx context.Context) *LifecycleResult {
	start, clockStart := time.Now(), b.clock.Now()
	res := &LifecycleResult{Job: true}
	ids := b.attachedSubscriptions()
	for len(ids) > 0 && res.Err == nil {
		n := min(len(ids), storage.MaxHeartbeatIDs)
		hb, err := b.engine.SubscriptionsHeartbeat(ctx, &storage.SubscriptionsHeartbeatParams{IDs: ids[:n]})
		ids = ids[n:]
		if err != nil {
			res.Err = err
			break
		}
		res.Heartbeats += hb.Beats
		res.Resurrected = append(res.Resurrected, hb.Resurrected...)
	}
	if res.Err == nil && b.maintainSubs {
		m, err := b.engine.SubscriptionsMaintain(ctx, &storage.SubscriptionsMaintainParams{CancelledRetention: b.subscriptionRetention})
		if err != nil {
			res.Err = err
		} else {
			res.Dead, res.Deleted = m.Dead, m.Deleted
		}
	}
	res.Took = time.Since(start)
	if b.maintainSubs {
		b.recordCleanup(JobSubscriptionLifecycle, clockStart, b.clock.Now().Sub(clockStart), int64(len(res.Dead)+len(res.Deleted)), res.Err)
	}
	lctx := context.WithoutCancel(ctx)
	for _, s := range res.Resurrected {
		b.logger.InfoContext(lctx, "dead subscription resurrected by a heartbeat", subAttrs(s)...)
		b.wakeSubscription(s.ID)
	}
	b.resurrected(lctx, res.Resurrected)
	for _, s := range res.Dead {
		b.logger.WarnContext(lctx, "subscription dead: no live member for its heartbeat timeout",
			append(subAttrs(s), slog.Duration("heartbeat_timeout", s.HeartbeatTimeout), slog.Time("last_heartbeat", s.LastHeartbeatAt))...)
	}
	for _, s := range res.Deleted {
		b.logger.InfoContext(lctx, "cancelled subscription deleted after subscription_retention",
			append(subAttrs(s), slog.Duration("subscription_retention", b.subscriptionRetention))...)
	}
	if res.Err != nil && !errors.Is(res.Err, storage.ErrClosed) && ctx.Err() == nil {
		b.logger.WarnContext(lctx, "subscription lifecycle job failed", slog.Any("error", res.Err))
	}
	if b.onLifecycle != nil {
		b.onLifecycle(res)
	}
	return res
}

func subAttrs(s *storage.Subscription) []any {
	return []any{slog.Int64("subscription", s.ID), slog.String("topic", s.Topic), slog.String("group", s.Group)}
}

// heartbeatAttached records at once that subscription id has a member on this broker (and makes
// it ACTIVE if it was DEAD); attach calls it for a durable subscription, so a member that attaches
// and leaves between two lifecycle runs still counts as live. A failure is logged, not returned:
// the next run heartbeats again.
func (b *Broker) heartbeatAttached(ctx context.Context, id int64) {
	res, err := b.engine.SubscriptionsHeartbeat(ctx, &storage.SubscriptionsHeartbeatParams{IDs: []int64{id}})
	if err != nil {
		if !errors.Is(err, storage.ErrClosed) && ctx.Err() == nil {
			b.logger.WarnContext(ctx, "subscription heartbeat failed", slog.Int64("subscription", id), slog.Any("error", err))
		}
		return
	}
	for _, s := range res.Resurrected {
		b.logger.InfoContext(ctx, "dead subscription resurrected by a heartbeat", subAttrs(s)...)
		b.wakeSubscription(s.ID)
	}
	b.resurrected(ctx, res.Resurrected)
	b.reportTransition(&LifecycleResult{Resurrected: res.Resurrected})
}

// reportTransition reports to Config.OnLifecycle a transition made outside a run of the
// lifecycle job, so that the metrics count every one once; an empty one is not reported.
func (b *Broker) reportTransition(r *LifecycleResult) {
	if b.onLifecycle != nil && len(r.Resurrected)+len(r.Deleted) > 0 {
		b.onLifecycle(r)
	}
}

package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Backfill delivery (issue 18 item 3). The engine keeps each subscription's backfill range and
// its progress (the ack floors); the broker paces the claims of range messages. Each owner
// (owner.go) claims the partitions whose range is done, or that have none, at full speed, and
// the partitions still inside their range at an adaptive rate: AIMD on the p95 of the latency of
// its own range claims (on PostgreSQL that latency is the database's: round trip, locks, I/O,
// so a loaded database slows the backfill down), halved when the p95 is above the target,
// raised by a twentieth of the cap otherwise, between MinRate and MaxRate; shared and ORDERED
// groups alike. A CANCELLED or FAILED backfill claims nothing of its range (those partitions
// wait; skip gives the rest up); range claims that keep failing make it FAILED (rangeFailed).

// BackfillConfig paces backfill ranges. Zero fields take the defaults.
type BackfillConfig struct {
	// Batch is the most range messages one claim takes (backfill_batch, default 10,000).
	Batch int
	// TargetP95 is the claim latency p95 above which the rate is halved (default 10 ms).
	TargetP95 time.Duration
	// MaxRate caps the range messages claimed per second per subscription and broker instance
	// (default 50,000).
	MaxRate float64
	// MinRate is the lowest rate the pacer goes down to (default 100 messages a second).
	MinRate float64
	// Refresh is how often an owner rereads the range and its progress (default 1 s).
	Refresh time.Duration
}

// Backfill defaults (seed 000's BackfillConfiguration).
const (
	DefaultBackfillBatch     = 10_000
	DefaultBackfillTargetP95 = 10 * time.Millisecond
	DefaultBackfillMaxRate   = 50_000
	defaultBackfillMinRate   = 100
	backfillWindow           = 100 // latency samples kept for the p95
	backfillAdjustEvery      = 10  // samples between two rate changes
)

func (c BackfillConfig) withDefaults() BackfillConfig {
	if c.Batch <= 0 {
		c.Batch = DefaultBackfillBatch
	}
	if c.TargetP95 <= 0 {
		c.TargetP95 = DefaultBackfillTargetP95
	}
	if c.MaxRate <= 0 {
		c.MaxRate = DefaultBackfillMaxRate
	}
	if c.MinRate <= 0 {
		c.MinRate = min(defaultBackfillMinRate, c.MaxRate)
	}
	if c.Refresh <= 0 {
		c.Refresh = time.Second
	}
	return c
}

// pacer is the AIMD token bucket of one subscription's range claims. Only its owner's goroutine
// uses it; time is passed in.
type pacer struct {
	cfg    BackfillConfig
	rate   float64 // tokens per second
	tokens float64
	last   time.Time
	lat    []time.Duration
	next   int // ring position in lat
	since  int // samples since the last rate change
}

func newPacer(cfg BackfillConfig, now time.Time) *pacer {
	rate := max(cfg.MinRate, cfg.MaxRate/10)
	// A tenth of a second's worth to start with, so that the first pass claims at once.
	return &pacer{cfg: cfg, rate: rate, tokens: min(float64(cfg.Batch), rate/10), last: now}
}

// allow returns how many range messages may be claimed now (at most Batch).
func (p *pacer) allow(now time.Time) int {
	if d := now.Sub(p.last); d > 0 {
		p.tokens = min(p.tokens+p.rate*d.Seconds(), max(float64(p.cfg.Batch), 1))
		p.last = now
	}
	return int(p.tokens)
}

// wait is how long until a whole token is there.
func (p *pacer) wait() time.Duration {
	need := 1 - p.tokens
	if need <= 0 {
		return 0
	}
	return max(time.Millisecond, time.Duration(need/p.rate*float64(time.Second)))
}

// took records a range claim of n messages that took d.
func (p *pacer) took(n int, d time.Duration) {
	p.tokens -= float64(n)
	if len(p.lat) < backfillWindow {
		p.lat = append(p.lat, d)
	} else {
		p.lat[p.next] = d
		p.next = (p.next + 1) % backfillWindow
	}
	if p.since++; p.since < backfillAdjustEvery {
		return
	}
	p.since = 0
	if p.p95() > p.cfg.TargetP95 {
		p.rate = max(p.cfg.MinRate, p.rate/2)
	} else {
		p.rate = min(p.cfg.MaxRate, p.rate+p.cfg.MaxRate/20)
	}
}

// p95 is seed 000's sorted[(int)(n*0.95)] over the kept samples.
func (p *pacer) p95() time.Duration {
	if len(p.lat) == 0 {
		return 0
	}
	s := slices.Clone(p.lat)
	slices.Sort(s)
	return s[len(s)*95/100]
}

// BackfillInfo is a subscription's backfill as the broker reports it: the engine's range and
// progress, with the rate this instance measured.
type BackfillInfo struct {
	State     storage.BackfillState `json:"state"`
	Processed int64                 `json:"processed"`
	Total     int64                 `json:"total"`
	Remaining int64                 `json:"remaining"`
	// Skipped counts messages the group will not get (cut by the bound, or skipped).
	Skipped     int64 `json:"skipped"`
	MaxMessages int64 `json:"max_messages,omitempty"`
	// Rate is the processed messages per second this instance measured over its last refreshes
	// (0 when it has no member of the group); RateLimit is its current claim rate limit.
	Rate      float64 `json:"rate"`
	RateLimit float64 `json:"rate_limit,omitempty"`
	// ETASeconds is Remaining / Rate (0 when unknown).
	ETASeconds float64   `json:"eta_seconds,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
	Error      string    `json:"error,omitempty"`
}

// backfillStats is the broker's backfill bookkeeping: missed-message counters and the progress
// owners measured, for the admin API and metrics.
type backfillStats struct {
	cfg                     BackfillConfig
	missedBound, missedSkip atomic.Int64
	claimed, failed         atomic.Int64
	mu                      sync.Mutex
	progress                map[int64]*BackfillInfo // by subscription, while an owner paces it
}

// BackfillCounters are process totals for metrics.
type BackfillCounters struct {
	// MissedBound counts messages groups will not get because a backfill range was cut to
	// max_backfill_messages; MissedSkipped those given up by a skip (cancel --skip, resurrect
	// without backfill).
	MissedBound, MissedSkipped int64
	// Claimed counts range messages claimed by this process.
	Claimed int64
	// Failed counts backfills this process made FAILED (their range claims kept failing).
	Failed int64
}

// ActiveBackfill is one paced backfill for metrics.
type ActiveBackfill struct {
	Topic, Group string
	Info         BackfillInfo
}

// BackfillCounters returns the process totals.
func (b *Broker) BackfillCounters() BackfillCounters {
	return BackfillCounters{MissedBound: b.backfill.missedBound.Load(), MissedSkipped: b.backfill.missedSkip.Load(), Claimed: b.backfill.claimed.Load(),
		Failed: b.backfill.failed.Load()}
}

// ActiveBackfills lists the backfills this instance paces now.
func (b *Broker) ActiveBackfills() []ActiveBackfill {
	b.backfill.mu.Lock()
	ids := make([]int64, 0, len(b.backfill.progress))
	for id := range b.backfill.progress {
		ids = append(ids, id)
	}
	b.backfill.mu.Unlock()
	slices.Sort(ids)
	var out []ActiveBackfill
	b.mu.RLock()
	for _, id := range ids {
		o := b.subs[id]
		if o == nil {
			continue
		}
		b.backfill.mu.Lock()
		if p := b.backfill.progress[id]; p != nil {
			out = append(out, ActiveBackfill{Topic: o.topic, Group: o.groupName(), Info: *p})
		}
		b.backfill.mu.Unlock()
	}
	b.mu.RUnlock()
	return out
}

// countMissed counts and logs messages a subscription will not get.
func (b *Broker) countMissed(ctx context.Context, sub *storage.Subscription, n int64, skipped bool, why string) {
	if n <= 0 {
		return
	}
	if skipped {
		b.backfill.missedSkip.Add(n)
	} else {
		b.backfill.missedBound.Add(n)
	}
	b.logger.WarnContext(ctx, "backfill: messages the group will not get", append(subAttrs(sub), slog.Int64("messages", n), slog.String("why", why))...)
}

// beginBackfill starts the backfill of a resurrected subscription: from its ack floors to the
// log end, cut to its bound (counted and logged); with skip, everything missed is given up.
func (b *Broker) beginBackfill(ctx context.Context, sub *storage.Subscription, skip bool) (*storage.Subscription, error) {
	res, err := b.engine.SubscriptionBackfill(ctx, &storage.SubscriptionBackfillParams{ID: sub.ID, Action: storage.BackfillBegin})
	if err != nil {
		return nil, fmt.Errorf("broker: begin backfill of subscription %d: %w", sub.ID, err)
	}
	b.countMissed(ctx, sub, res.Skipped, false, fmt.Sprintf("resurrection range cut to max_backfill_messages %d", storage.MaxBackfillOrDefault(sub.MaxBackfillMessages)))
	out := res.Subscription
	if skip && out.Backfill != nil && out.Backfill.State != storage.BackfillCancelled {
		sk, err := b.engine.SubscriptionBackfill(ctx, &storage.SubscriptionBackfillParams{ID: sub.ID, Action: storage.BackfillSkip})
		if err != nil && !errors.Is(err, storage.ErrInvalidTransition) {
			return nil, fmt.Errorf("broker: skip backfill of subscription %d: %w", sub.ID, err)
		}
		if err == nil {
			b.countMissed(ctx, sub, sk.Skipped, true, "resurrected without backfill")
			out = sk.Subscription
		}
	}
	if out.Backfill != nil && out.Backfill.State == storage.BackfillInProgress {
		b.logger.InfoContext(ctx, "backfill started", append(subAttrs(out), slog.Int64("total", out.Backfill.Total))...)
	}
	b.backfillChanged(sub.ID)
	return out, nil
}

// resurrected begins the backfill of subscriptions a heartbeat made ACTIVE; failures are logged
// (the group then continues from its floors, unbounded).
func (b *Broker) resurrected(ctx context.Context, subs []*storage.Subscription) {
	for _, s := range subs {
		if _, err := b.beginBackfill(ctx, s, false); err != nil && !errors.Is(err, storage.ErrClosed) {
			b.logger.WarnContext(ctx, "backfill of a resurrected subscription failed", append(subAttrs(s), slog.Any("error", err))...)
		}
	}
}

// GroupBackfill returns a group's backfill: the engine's range and progress, with this
// instance's measured rate and ETA.
func (b *Broker) GroupBackfill(ctx context.Context, topic, group string) (*BackfillInfo, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	var parts []storage.SubscriptionPartitionStats
	if sub.State != storage.Deleted && sub.State != storage.Cancelled {
		st, err := b.engine.SubscriptionStats(ctx, sub.ID)
		if err != nil {
			return nil, fmt.Errorf("broker: stats of subscription %d: %w", sub.ID, err)
		}
		parts = st.Partitions
	}
	return b.backfillInfo(sub, parts), nil
}

// backfillInfo combines a subscription's stored range, its floors and the measured rate.
func (b *Broker) backfillInfo(sub *storage.Subscription, parts []storage.SubscriptionPartitionStats) *BackfillInfo {
	p := sub.Backfill.Progress(parts)
	info := &BackfillInfo{State: p.State, Processed: p.Processed, Total: p.Total, Remaining: p.Remaining, Skipped: p.Skipped}
	if bf := sub.Backfill; bf != nil {
		info.MaxMessages, info.StartedAt, info.UpdatedAt, info.Error = bf.MaxMessages, bf.StartedAt, bf.UpdatedAt, bf.Error
	}
	b.backfill.mu.Lock()
	if m := b.backfill.progress[sub.ID]; m != nil && p.State == storage.BackfillInProgress {
		info.Rate, info.RateLimit = m.Rate, m.RateLimit
	}
	b.backfill.mu.Unlock()
	if info.Rate > 0 {
		info.ETASeconds = float64(info.Remaining) / info.Rate
	}
	return info
}

// BackfillAction cancels (skip: gives up the rest), resumes a group's backfill.
func (b *Broker) BackfillAction(ctx context.Context, topic, group string, action storage.BackfillAction) (*BackfillInfo, error) {
	switch action {
	case storage.BackfillCancel, storage.BackfillResume, storage.BackfillSkip:
	default:
		return nil, invalid("backfill action must be cancel, resume or skip, got %q", action)
	}
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	// COMPLETED is derived from the floors, not stored: the engine cannot refuse it by itself.
	if cur, err := b.GroupBackfill(ctx, topic, sub.Group); err != nil {
		return nil, err
	} else if cur.State == storage.BackfillCompleted {
		return nil, fmt.Errorf("%w: the backfill of group %q on topic %q is COMPLETED", storage.ErrInvalidTransition, sub.Group, topic)
	}
	res, err := b.engine.SubscriptionBackfill(ctx, &storage.SubscriptionBackfillParams{ID: sub.ID, Action: action})
	if err != nil {
		return nil, fmt.Errorf("broker: backfill %s of group %q on topic %q: %w", action, sub.Group, topic, err)
	}
	if action == storage.BackfillSkip {
		b.countMissed(ctx, sub, res.Skipped, true, "backfill skipped by an operator")
	}
	b.logger.InfoContext(ctx, "backfill "+string(action), subAttrs(sub)...)
	b.backfillChanged(sub.ID)
	return b.GroupBackfill(ctx, topic, sub.Group)
}

// forget drops the measured progress of subscription id (its owner ended or paces nothing).
func (s *backfillStats) forget(id int64) {
	s.mu.Lock()
	delete(s.progress, id)
	s.mu.Unlock()
}

// ownerBackfill is an owner's view of its subscription's backfill (owner goroutine only).
type ownerBackfill struct {
	state       storage.BackfillState // as stored; "" before the first refresh
	end         []int64
	pending     []bool // per partition: range messages not yet delivered
	pacer       *pacer
	nextRefresh time.Time
	lastAt      time.Time
	lastDone    int64
	rate        float64
	// fails counts range claims failed in a row; retryAt is when the range is tried again
	// (broker clock).
	fails   int
	retryAt time.Time
}

// limiting reports whether range partitions need pacing or holding back.
func (w *ownerBackfill) limiting() bool {
	return w != nil && slices.Contains(w.pending, true) &&
		(w.state == storage.BackfillInProgress || w.state == storage.BackfillCancelled || w.state == storage.BackfillFailed)
}

// split returns the partitions among owned (nil: all) outside their range (free) and inside it
// (ranged).
func (w *ownerBackfill) split(owned []int32) (free, ranged []int32) {
	for i, p := range w.pending {
		if owned != nil && !slices.Contains(owned, int32(i)) {
			continue
		}
		if p {
			ranged = append(ranged, int32(i))
		} else {
			free = append(free, int32(i))
		}
	}
	return free, ranged
}

// refreshBackfill rereads the subscription, and the range and progress, when due: every Refresh
// while the range is paced or held back (a cancel or resume on another instance is seen within
// it), once a minute otherwise; at once after this instance changed it (bfDirty) or with force.
// It returns the subscription's read (Engine.SubscriptionGet) when it made one (read).
func (o *owner) refreshBackfill(now time.Time, force bool) (sub *storage.Subscription, read bool, readErr error) {
	b := o.b
	w := o.bf
	if w == nil {
		w = &ownerBackfill{pacer: newPacer(b.backfill.cfg, now)}
		o.bf = w
	}
	if now.Before(w.nextRefresh) && !o.bfDirty.Swap(false) && !force {
		return nil, false, nil
	}
	every := b.backfill.cfg.Refresh
	sub, readErr = b.engine.SubscriptionGet(b.rootCtx, o.id)
	read, err := true, readErr
	var st *storage.SubscriptionStats
	if err == nil && sub.Backfill != nil && sub.State != storage.Cancelled {
		st, err = b.engine.SubscriptionStats(b.rootCtx, o.id)
	}
	if err != nil || sub.Backfill == nil {
		// None: reread once a minute (a change this instance makes sets bfDirty at once).
		w.state, w.pending = "", nil
		w.nextRefresh = now.Add(b.refreshInterval)
		b.backfill.forget(o.id)
		return sub, read, readErr
	}
	p := sub.Backfill.Progress(st.Partitions)
	if w.state != sub.Backfill.State {
		w.fails, w.retryAt = 0, time.Time{} // resumed, cancelled or failed: a new run
	}
	w.state, w.end, w.pending = sub.Backfill.State, sub.Backfill.End, p.Pending
	if !w.lastAt.IsZero() && now.After(w.lastAt) {
		w.rate = float64(p.Processed-w.lastDone) / now.Sub(w.lastAt).Seconds()
	}
	w.lastAt, w.lastDone = now, p.Processed
	if p.State == storage.BackfillInProgress || w.limiting() {
		w.nextRefresh = now.Add(every)
		info := b.backfillInfoFrom(sub, p, w)
		b.backfill.mu.Lock()
		b.backfill.progress[o.id] = info
		b.backfill.mu.Unlock()
		return sub, read, readErr
	}
	w.nextRefresh = now.Add(b.refreshInterval)
	b.backfill.mu.Lock()
	_, had := b.backfill.progress[o.id]
	delete(b.backfill.progress, o.id)
	b.backfill.mu.Unlock()
	if had && p.State == storage.BackfillCompleted {
		b.logger.Info("backfill completed", append(subAttrs(sub), slog.Int64("processed", p.Processed), slog.Int64("skipped", p.Skipped))...)
	}
	return sub, read, readErr
}

func (b *Broker) backfillInfoFrom(sub *storage.Subscription, p storage.BackfillProgress, w *ownerBackfill) *BackfillInfo {
	info := &BackfillInfo{State: p.State, Processed: p.Processed, Total: p.Total, Remaining: p.Remaining, Skipped: p.Skipped,
		MaxMessages: sub.Backfill.MaxMessages, Rate: max(w.rate, 0), RateLimit: w.pacer.rate,
		StartedAt: sub.Backfill.StartedAt, UpdatedAt: sub.Backfill.UpdatedAt, Error: sub.Backfill.Error}
	if info.Rate > 0 {
		info.ETASeconds = float64(info.Remaining) / info.Rate
	}
	return info
}

// passWait is the wait after a dispatch pass: until the next due time (waitFor), shortened to
// the pacer's wait (paced > 0) and, while a paced range is IN_PROGRESS, to the refresh interval.
func (o *owner) passWait(nextDue time.Time, poll, paced time.Duration, limiting bool) time.Duration {
	wait := o.waitFor(nextDue, poll)
	if paced > 0 {
		wait = min(wait, paced)
	}
	if limiting && o.bf.state == storage.BackfillInProgress {
		wait = min(wait, o.b.backfill.cfg.Refresh)
	}
	return wait
}

// planClaim plans the next claim of a subscription whose range is limiting, among the partitions
// owned (nil: all; an ORDERED member's otherwise) for a member with credit k: the partitions
// outside their range at full speed until freeDone, then the range within the pacer's tokens.
// parts nil means no claim now: the range is CANCELLED or FAILED (hold 0: it waits for a
// change), waits out a retry backoff, or the pacer's tokens ran out (hold: until either is over).
func (o *owner) planClaim(owned []int32, k int, freeDone bool) (parts []int32, limit int, ranged bool, hold time.Duration) {
	w := o.bf
	free, rng := w.split(owned)
	switch {
	case !freeDone && len(free) > 0:
		return free, k, false, 0
	case len(rng) == 0 || w.state != storage.BackfillInProgress:
		return nil, 0, false, 0
	}
	if now := o.b.clock.Now(); now.Before(w.retryAt) {
		return nil, 0, false, w.retryAt.Sub(now)
	}
	if n := w.pacer.allow(time.Now()); n > 0 {
		return rng, min(k, n), true, 0
	}
	return nil, 0, false, w.pacer.wait()
}

// Failed range claims (FAILED). A range claim that fails because of the subscription's life
// (gone, not active, a stale generation) or the broker's stop is handled as any claim's failure.
// Any other error holds the range back for a backoff on the broker's clock (100 ms, doubling, at
// most 30 s; the other partitions go on) and is retried; the backfill becomes FAILED, logged and
// counted, after backfillMaxFailures failures in a row of errors that will not pass by
// themselves (a damaged partition, a read error, corruption), or backfillMaxRetries of transient
// ones (storage unavailable or full, rate limited: about a minute and a half of them). A range
// claim that succeeds resets the count; resume makes a FAILED backfill IN_PROGRESS again.
const (
	backfillMaxFailures = 3
	backfillMaxRetries  = 10
	backfillRetryBase   = 100 * time.Millisecond
	backfillRetryMax    = 30 * time.Second
)

// transientClaimError reports whether err may pass by itself: the storage is unavailable (not a
// damaged partition, which stays so until repaired) or full, or the engine rate limited.
func transientClaimError(err error) bool {
	if errors.Is(err, storage.ErrPartitionDamaged) {
		return false
	}
	return errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrFull) || errors.Is(err, storage.ErrRateLimited)
}

// rangeFailed handles the failure of a range claim. ok false: the error is not the range's (the
// caller handles it as any claim's); else wait is how long until the next look.
func (o *owner) rangeFailed(err error) (wait time.Duration, ok bool) {
	b := o.b
	switch {
	case errors.Is(err, storage.ErrSubscriptionNotFound), errors.Is(err, storage.ErrSubscriptionNotActive),
		errors.Is(err, storage.ErrStaleGeneration), errors.Is(err, storage.ErrClosed), b.rootCtx.Err() != nil:
		return 0, false
	}
	w := o.bf
	w.fails++
	limit := backfillMaxFailures
	if transientClaimError(err) {
		limit = backfillMaxRetries
	}
	attrs := []any{slog.Int64("subscription", o.id), slog.String("topic", o.topic), slog.String("group", o.groupName()),
		slog.Int("failures", w.fails), slog.Any("error", err)}
	if w.fails < limit {
		backoff := min(backfillRetryMax, backfillRetryBase<<(w.fails-1))
		w.retryAt = b.clock.Now().Add(backoff)
		b.logger.Warn("backfill: range claim failed, retrying", append(attrs, slog.Duration("backoff", backoff))...)
		return backoff, true
	}
	// The reason is stored and shown by the admin API: no path (IOError.Public) when it has one.
	reason := err.Error()
	if ioe := (*storage.IOError)(nil); errors.As(err, &ioe) {
		reason = ioe.Public()
	}
	reason = fmt.Sprintf("%d range claims failed in a row, the last with: %s", w.fails, reason)
	if _, ferr := b.engine.SubscriptionBackfill(b.rootCtx, &storage.SubscriptionBackfillParams{ID: o.id, Action: storage.BackfillFail, Error: reason}); ferr != nil {
		// Not recorded (the storage may be down too): try again after the longest backoff.
		w.retryAt = b.clock.Now().Add(backfillRetryMax)
		b.logger.Warn("backfill: recording FAILED failed", append(attrs, slog.Any("record_error", ferr))...)
		return backfillRetryMax, true
	}
	b.backfill.failed.Add(1)
	b.logger.Error("backfill FAILED: its range is held back until resumed (spool group backfill resume)", attrs...)
	w.fails, w.retryAt = 0, time.Time{}
	o.bfDirty.Store(true)
	return time.Millisecond, true
}

// rangeSucceeded records a range claim of n messages that took d: the pacer's sample, and the
// end of a run of failures.
func (o *owner) rangeSucceeded(n int, d time.Duration) {
	o.bf.pacer.took(n, d)
	o.bf.fails, o.bf.retryAt = 0, time.Time{}
}

// rangeClaimed updates the pending partitions after a range claim and counts its messages.
func (o *owner) rangeClaimed(ds []*storage.Delivery) {
	w := o.bf
	var n int64
	for _, d := range ds {
		i := int(d.Partition)
		if i < len(w.end) && d.Offset < w.end[i] {
			n++
		}
		if i < len(w.pending) && i < len(w.end) && d.Offset >= w.end[i]-1 {
			w.pending[i] = false
		}
	}
	o.b.backfill.claimed.Add(n)
}

// backfillChanged makes the owner of subscription id on this instance reread its backfill.
func (b *Broker) backfillChanged(id int64) { b.rereadSubscription(id) }

// rereadSubscription makes the owner of subscription id on this instance, if any, reread the
// subscription (its state, group and backfill: owner.refresh) at its next pass, and wakes it.
// Never blocks.
func (b *Broker) rereadSubscription(id int64) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if o := b.subs[id]; o != nil {
		o.bfDirty.Store(true)
		o.wakeUp()
	}
}

package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Backpressure on producers (BRIEF section 4, seed 002 section 2.6): a topic may bound its
// backlog, the messages (and their estimated bytes) its slowest ACTIVE subscription has not done
// yet (storage.TopicConfig.MaxBacklogMessages, MaxBacklogBytes). The broker reads the backlog of
// the bounded topics from the engine's statistics every Config.BackpressureInterval (one
// TopicList, then per bounded topic its subscriptions' stats and the topic's size). Between two
// reads each publish is checked against an estimate: the last read plus what this broker
// accepted for the topic since (atomic counters, no engine read per publish), so the bound holds
// within one publish batch however fast publishes arrive:
//
//   - reject (the default policy): a publish that would start at or above the bound fails with
//     ErrRateLimited (RATE_LIMITED, HTTP 429) and a retry-after; once refused, publishes are
//     accepted again when a read finds the backlog below 90% of the bound.
//   - throttle: from half the bound each publish waits before its append, up to
//     Config.MaxThrottleDelay as the backlog nears the bound (the wait grows linearly from 40%),
//     released when a read finds it below 40%; at the bound publishes are refused as with reject.
//
// The thresholds apart leave room for hysteresis: the state does not flap around one value.
// Publishers holding the priority permission (PublishOptions.Priority) are exempt (their
// messages count in the estimate). On PostgreSQL each broker instance counts only its own
// accepts: until the next read, the topic can overshoot by what the other instances accept in
// one interval.

// Defaults of the backpressure settings of Config.
const (
	DefaultBackpressureInterval = time.Second
	DefaultMaxThrottleDelay     = time.Second
)

// Thresholds, as fractions of the bound.
const (
	throttleFrom    = 0.5
	throttleRelease = 0.4
	rejectRelease   = 0.9
	// maxRetryAfter bounds the retry-after hint of a refused publish.
	maxRetryAfter = 30 * time.Second
)

// Backpressure states of a topic (BackpressureInfo.State; the metric's values 0, 1, 2).
const (
	BackpressureNormal    = "normal"
	BackpressureThrottled = "throttled"
	BackpressureRejecting = "rejecting"
)

// Levels of bpTopic.level, in the order of the states above.
const (
	levelNormal int32 = iota
	levelThrottled
	levelRejecting
)

var levelNames = [...]string{BackpressureNormal, BackpressureThrottled, BackpressureRejecting}

// BackpressureInfo is a bounded topic's backpressure for the API and the metrics.
type BackpressureInfo struct {
	Topic string `json:"topic"`
	// State is normal, throttled or rejecting.
	State  string                `json:"state"`
	Policy storage.BacklogPolicy `json:"policy"`
	// BacklogMessages is the estimated largest pending count over the topic's ACTIVE
	// subscriptions: the last read plus what this broker accepted since. BacklogBytes estimates
	// their size (read messages times the topic's mean retained message size, plus the sizes of
	// the messages accepted since).
	BacklogMessages    int64 `json:"backlog_messages"`
	BacklogBytes       int64 `json:"backlog_bytes"`
	MaxBacklogMessages int64 `json:"max_backlog_messages,omitempty"`
	MaxBacklogBytes    int64 `json:"max_backlog_bytes,omitempty"`
	// Delay is what a throttled publish waits now; RetryAfter is the hint a refused one gets.
	Delay      time.Duration `json:"delay"`
	RetryAfter time.Duration `json:"retry_after"`
	// Throttled and Rejected count the publishes delayed and refused since the broker started.
	Throttled int64 `json:"throttled"`
	Rejected  int64 `json:"rejected"`
	// UpdatedAt is when the backlog was last read.
	UpdatedAt time.Time `json:"updated_at"`
}

// BackpressureError is the error of a publish refused because its topic's backlog is at its
// bound. It wraps storage.ErrRateLimited; RetryAfter is the broker's estimate of when the
// backlog is back under 90% of the bound.
type BackpressureError struct {
	Topic      string
	Backlog    int64
	Bound      string
	RetryAfter time.Duration
}

func (e *BackpressureError) Error() string {
	return fmt.Sprintf("%v: topic %q: backlog of the slowest active subscription at its bound (%d messages; %s): retry after %s",
		storage.ErrRateLimited, e.Topic, e.Backlog, e.Bound, e.RetryAfter)
}

func (e *BackpressureError) Unwrap() error { return storage.ErrRateLimited }

// bpTopic is the backpressure state of one bounded topic. info holds the last read (its
// BacklogMessages and BacklogBytes are the engine's figures, State, Delay and RetryAfter are
// filled in by view); it and the fields up to level are guarded by backpressure.mu.
type bpTopic struct {
	info BackpressureInfo
	// ratio is the estimated backlog over its bound at the last read (the larger of the two
	// dimensions); prevRatio and prevAt are the reading before, for the drain rate behind
	// RetryAfter.
	ratio     float64
	prevRatio float64
	prevAt    time.Time
	// baseMsgs and baseBytes are appendedMsgs and appendedBytes when the last read started:
	// what was accepted and not yet appended then may be missing from the read.
	baseMsgs, baseBytes int64

	// level is the state: set by each read, raised by the publishes that cross a threshold
	// between two reads (only a read lowers it: the hysteresis).
	level atomic.Int32
	// acceptedMsgs and acceptedBytes count what this broker admitted to the topic (a refused
	// batch is added, then taken back); appendedMsgs and appendedBytes what of it finished its
	// append, stored or failed. The estimated backlog is the last read plus acceptedMsgs minus
	// baseMsgs: the messages accepted since the read started and those in flight then.
	acceptedMsgs, acceptedBytes atomic.Int64
	appendedMsgs, appendedBytes atomic.Int64
	throttled                   atomic.Int64
	rejected                    atomic.Int64
}

// bounded reports whether t has a bound now.
func (t *bpTopic) bounded() bool { return t.info.MaxBacklogMessages > 0 || t.info.MaxBacklogBytes > 0 }

// estimate is t's backlog now: the last read plus what was accepted since (with acceptedMsgs
// and acceptedBytes given, the values before a publish's batch). backpressure.mu must be held.
func (t *bpTopic) estimate(acceptedMsgs, acceptedBytes int64) (msgs, bytes int64) {
	return t.info.BacklogMessages + max(0, acceptedMsgs-t.baseMsgs), t.info.BacklogBytes + max(0, acceptedBytes-t.baseBytes)
}

// ratioOf is a backlog over t's bound, the larger of the two dimensions.
func (t *bpTopic) ratioOf(msgs, bytes int64) float64 {
	r := 0.0
	if m := t.info.MaxBacklogMessages; m > 0 {
		r = float64(msgs) / float64(m)
	}
	if m := t.info.MaxBacklogBytes; m > 0 {
		r = max(r, float64(bytes)/float64(m))
	}
	return r
}

// levelFor is the state a backlog at ratio r leads to from level cur (the hysteresis).
func levelFor(policy storage.BacklogPolicy, cur int32, r float64) int32 {
	switch {
	case r >= 1:
		return levelRejecting
	case cur == levelRejecting && r > rejectRelease:
		return levelRejecting // stays refused until below 90%
	case policy == storage.BacklogThrottle && (r >= throttleFrom || (r >= throttleRelease && cur != levelNormal)):
		return levelThrottled
	}
	return levelNormal
}

// raise moves t's level up to l (never down: only a read lowers it).
func (t *bpTopic) raise(l int32) bool {
	for {
		cur := t.level.Load()
		if cur >= l {
			return false
		}
		if t.level.CompareAndSwap(cur, l) {
			return true
		}
	}
}

// throttleDelay is the wait of a throttled publish at ratio r: linear from 0 at 40% of the
// bound to Config.MaxThrottleDelay at the bound.
func (b *Broker) throttleDelay(r float64) time.Duration {
	f := max(0, min(1, (r-throttleRelease)/(1-throttleRelease)))
	return time.Duration(f * float64(b.maxThrottleDelay))
}

// backpressure holds the states of the bounded topics.
type backpressure struct {
	mu     sync.RWMutex
	topics map[string]*bpTopic
	// refreshMu serializes refreshes and guards the fields below.
	refreshMu sync.Mutex
	// bounded are the configurations of the bounded topics at the last listing of all topics,
	// which happens every listEvery refreshes (or at the next one after relist is set): in
	// between only the bounded topics' figures are read, so a broker with many topics and no
	// bound reads little.
	bounded   map[string]storage.TopicConfig
	sinceList int
	relist    atomic.Bool
}

// listEvery is how many refreshes reuse one listing of the topics: a bound set through another
// broker instance (PostgreSQL) applies within listEvery intervals, one set here at once.
const listEvery = 10

// admission is a publish counted in its topic's estimated backlog; appended must be called once
// its append finished, stored or failed. The zero admission counts nothing.
type admission struct {
	t            *bpTopic
	msgs, nbytes int64
}

func (a admission) appended() {
	if a.t != nil {
		a.t.appendedMsgs.Add(a.msgs)
		a.t.appendedBytes.Add(a.nbytes)
	}
}

// batchBytes is the size a batch adds to a backlog, for the bytes bound.
func batchBytes(msgs []storage.AppendMessage) int64 {
	var n int64
	for i := range msgs {
		m := &msgs[i]
		n += int64(len(m.Payload) + len(m.Key) + len(m.ProducerID))
		for k, v := range m.Headers {
			n += int64(len(k) + len(v))
		}
	}
	return n
}

// admit applies topic's backpressure to a publish of msgs: it counts the batch in the topic's
// estimated backlog and returns the wait of a throttled one, or refuses it (counting nothing)
// when the backlog before the batch is at the bound: the accepted messages exceed the bound by
// less than one batch, even with concurrent publishes (each adds its batch first, so later ones
// see it). A publish that would wait is refused with ErrWouldThrottle (counting nothing) when
// opts.NoWait is set.
func (b *Broker) admit(topic string, msgs []storage.AppendMessage, opts PublishOptions) (time.Duration, admission, error) {
	b.bp.mu.RLock()
	defer b.bp.mu.RUnlock()
	t := b.bp.topics[topic]
	if t == nil || !t.bounded() {
		return 0, admission{}, nil
	}
	a := admission{t: t, msgs: int64(len(msgs)), nbytes: batchBytes(msgs)}
	accMsgs, accBytes := t.acceptedMsgs.Add(a.msgs)-a.msgs, t.acceptedBytes.Add(a.nbytes)-a.nbytes
	if opts.Priority {
		return 0, a, nil
	}
	estMsgs, estBytes := t.estimate(accMsgs, accBytes)
	r := t.ratioOf(estMsgs, estBytes)
	cur := t.level.Load()
	l := levelFor(t.info.Policy, cur, r)
	if l > cur && t.raise(l) {
		b.logger.Info("topic backpressure changed", slog.String("topic", topic), slog.String("from", levelNames[cur]),
			slog.String("to", levelNames[l]), slog.Int64("backlog_messages", estMsgs), slog.Int64("backlog_bytes", estBytes),
			slog.String("by", "publish"))
	}
	switch l {
	case levelRejecting:
		t.acceptedMsgs.Add(-a.msgs)
		t.acceptedBytes.Add(-a.nbytes)
		t.rejected.Add(1)
		return 0, admission{}, &BackpressureError{Topic: topic, Backlog: estMsgs, Bound: boundText(&t.info, estBytes),
			RetryAfter: b.retryAfter(t, r)}
	case levelThrottled:
		d := b.throttleDelay(r)
		if d > 0 && opts.NoWait {
			t.acceptedMsgs.Add(-a.msgs)
			t.acceptedBytes.Add(-a.nbytes)
			return 0, admission{}, ErrWouldThrottle
		}
		if d > 0 {
			// Counted as delayed only when it waits: at the release threshold, which keeps
			// the topic throttled (hysteresis), the delay is 0.
			t.throttled.Add(1)
		}
		return d, a, nil
	}
	return 0, a, nil
}

// waitThrottle waits d (a throttled publish) or until ctx ends or the broker stops.
func (b *Broker) waitThrottle(ctx context.Context, topic string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("broker: publish to %q throttled: %w", topic, ctx.Err())
	case <-b.quit:
		return ErrNotRunning
	}
}

func boundText(i *BackpressureInfo, bytes int64) string {
	var parts []string
	if i.MaxBacklogMessages > 0 {
		parts = append(parts, fmt.Sprintf("max_backlog_messages %d", i.MaxBacklogMessages))
	}
	if i.MaxBacklogBytes > 0 {
		parts = append(parts, fmt.Sprintf("max_backlog_bytes %d, about %d now", i.MaxBacklogBytes, bytes))
	}
	return strings.Join(parts, ", ")
}

// view describes t now: the estimated backlog and the state it leads to (a backlog at the
// bound shows rejecting before a publish is refused). backpressure.mu must be held.
func (b *Broker) view(t *bpTopic) BackpressureInfo {
	i := t.info
	i.Throttled, i.Rejected = t.throttled.Load(), t.rejected.Load()
	i.State, i.Delay, i.RetryAfter = BackpressureNormal, 0, 0
	if !t.bounded() {
		return i
	}
	i.BacklogMessages, i.BacklogBytes = t.estimate(t.acceptedMsgs.Load(), t.acceptedBytes.Load())
	r := t.ratioOf(i.BacklogMessages, i.BacklogBytes)
	cur := t.level.Load()
	l := max(cur, levelFor(i.Policy, cur, r))
	i.State = levelNames[l]
	switch l {
	case levelThrottled:
		i.Delay = b.throttleDelay(r)
	case levelRejecting:
		i.RetryAfter = b.retryAfter(t, r)
	}
	return i
}

// Backpressure describes the backpressure of every topic that has (or had, since the broker
// started) a backlog bound, by topic name.
func (b *Broker) Backpressure() []BackpressureInfo {
	b.bp.mu.RLock()
	defer b.bp.mu.RUnlock()
	out := make([]BackpressureInfo, 0, len(b.bp.topics))
	for _, t := range b.bp.topics {
		out = append(out, b.view(t))
	}
	slices.SortFunc(out, func(a, b BackpressureInfo) int { return strings.Compare(a.Topic, b.Topic) })
	return out
}

// TopicBackpressure describes one topic's backpressure; ok is false for a topic without a bound.
func (b *Broker) TopicBackpressure(topic string) (BackpressureInfo, bool) {
	b.bp.mu.RLock()
	defer b.bp.mu.RUnlock()
	t := b.bp.topics[topic]
	if t == nil || !t.bounded() {
		return BackpressureInfo{}, false
	}
	return b.view(t), true
}

// backpressureLoop refreshes the backpressure states every backpressureInterval.
func (b *Broker) backpressureLoop() {
	ticker := time.NewTicker(b.backpressureInterval)
	defer ticker.Stop()
	failing := false
	for {
		select {
		case <-b.quit:
			return
		case <-ticker.C:
		}
		err := b.refreshBackpressure(b.rootCtx, false)
		switch {
		case err == nil:
			failing = false
		case errors.Is(err, storage.ErrClosed), b.rootCtx.Err() != nil:
		case !failing:
			failing = true // logged once until a refresh succeeds again
			b.logger.Warn("reading the topics' backlogs for backpressure failed; the last states stay", slog.Any("error", err))
		}
	}
}

// RefreshBackpressure lists the topics and reads the backlog of every bounded one, updating its
// state (tests call it; the broker's loop lists the topics only every listEvery refreshes). A
// topic whose bound was removed goes back to normal; a deleted topic is forgotten. A topic whose
// figures cannot be read keeps its state.
func (b *Broker) RefreshBackpressure(ctx context.Context) error {
	return b.refreshBackpressure(ctx, true)
}

// topicConfigChanged makes the next refresh list the topics again (a topic was created, changed
// or deleted through this broker).
func (b *Broker) topicConfigChanged() { b.bp.relist.Store(true) }

// forgetBackpressure drops a deleted topic's state at once: a topic created again with its name
// starts without it.
func (b *Broker) forgetBackpressure(topic string) {
	b.bp.mu.Lock()
	delete(b.bp.topics, topic)
	b.bp.mu.Unlock()
	b.topicConfigChanged()
}

func (b *Broker) refreshBackpressure(ctx context.Context, list bool) error {
	b.bp.refreshMu.Lock()
	defer b.bp.refreshMu.Unlock()
	bp := &b.bp
	if list || bp.bounded == nil || bp.sinceList >= listEvery || bp.relist.Swap(false) {
		topics, err := b.engine.TopicList(ctx)
		if err != nil {
			return err
		}
		bp.bounded, bp.sinceList = make(map[string]storage.TopicConfig), 0
		for _, tp := range topics {
			if tp.Config.HasBacklogBound() {
				bp.bounded[tp.Name] = tp.Config
			}
		}
		// Topics deleted or no longer bounded: forgotten, or back to normal (their counters stay).
		live := make(map[string]bool, len(topics))
		for _, tp := range topics {
			live[tp.Name] = true
		}
		bp.mu.Lock()
		for name, t := range bp.topics {
			switch {
			case !live[name]:
				delete(bp.topics, name)
			case !bp.bounded[name].HasBacklogBound():
				t.info.MaxBacklogMessages, t.info.MaxBacklogBytes = 0, 0
				t.level.Store(levelNormal)
			}
		}
		bp.mu.Unlock()
	}
	bp.sinceList++
	now := b.clock.Now()
	var firstErr error
	for name, cfg := range bp.bounded {
		bp.mu.Lock()
		if bp.topics == nil {
			bp.topics = make(map[string]*bpTopic)
		}
		t := bp.topics[name]
		if t == nil {
			t = &bpTopic{info: BackpressureInfo{Topic: name}}
			bp.topics[name] = t
		}
		bp.mu.Unlock()
		// What finished its append before the read is in it; what did not may not be, and stays
		// in the estimate until the next read.
		baseMsgs, baseBytes := t.appendedMsgs.Load(), t.appendedBytes.Load()
		msgs, bytes, err := b.topicBacklog(ctx, name)
		if err != nil {
			b.dropUnread(name, t)
			if errors.Is(err, storage.ErrTopicNotFound) {
				bp.relist.Store(true) // deleted meanwhile
				continue
			}
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		bp.mu.Lock()
		if bp.topics[name] != t { // deleted meanwhile (forgetBackpressure)
			bp.mu.Unlock()
			continue
		}
		old := t.level.Load()
		t.baseMsgs, t.baseBytes = baseMsgs, baseBytes
		b.updateBackpressure(t, cfg, msgs, bytes, now)
		info := b.view(t)
		bp.mu.Unlock()
		if info.State != levelNames[old] {
			b.logger.Info("topic backpressure changed", slog.String("topic", name), slog.String("from", levelNames[old]),
				slog.String("to", info.State), slog.Int64("backlog_messages", info.BacklogMessages), slog.Int64("backlog_bytes", info.BacklogBytes),
				slog.Duration("delay", info.Delay), slog.Duration("retry_after", info.RetryAfter))
		}
	}
	return firstErr
}

// topicBacklog returns the largest pending count over the topic's ACTIVE subscriptions and its
// estimated size.
func (b *Broker) topicBacklog(ctx context.Context, topic string) (msgs, bytes int64, err error) {
	subs, err := b.engine.SubscriptionList(ctx, &storage.SubscriptionListParams{Topic: topic})
	if err != nil {
		return 0, 0, err
	}
	for _, s := range subs {
		if s.State != storage.Active {
			continue
		}
		st, err := b.engine.SubscriptionStats(ctx, s.ID)
		if errors.Is(err, storage.ErrSubscriptionNotFound) {
			continue
		}
		if err != nil {
			return 0, 0, err
		}
		msgs = max(msgs, st.Pending)
	}
	if msgs == 0 {
		return 0, 0, nil
	}
	ts, err := b.engine.TopicStats(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	if ts.Messages > 0 {
		bytes = int64(float64(msgs) * float64(ts.Bytes) / float64(ts.Messages))
	}
	return msgs, bytes, nil
}

// updateBackpressure moves t's state for a new reading of its backlog (t.baseMsgs and
// t.baseBytes set for it). b.bp.mu must be held.
func (b *Broker) updateBackpressure(t *bpTopic, cfg storage.TopicConfig, msgs, bytes int64, now time.Time) {
	i := &t.info
	i.Policy = cfg.BacklogPolicy
	if i.Policy == "" {
		i.Policy = storage.BacklogReject
	}
	i.MaxBacklogMessages, i.MaxBacklogBytes = cfg.MaxBacklogMessages, cfg.MaxBacklogBytes
	t.prevAt = i.UpdatedAt
	i.BacklogMessages, i.BacklogBytes, i.UpdatedAt = msgs, bytes, now
	r := t.ratioOf(t.estimate(t.acceptedMsgs.Load(), t.acceptedBytes.Load()))
	t.prevRatio, t.ratio = t.ratio, r
	if t.prevAt.IsZero() {
		t.prevRatio = r
	}
	t.level.Store(levelFor(i.Policy, t.level.Load(), r))
}

// dropUnread forgets t when no read of its backlog ever succeeded (it was made for the read
// that failed): a topic is described once its backlog is known.
func (b *Broker) dropUnread(name string, t *bpTopic) {
	b.bp.mu.Lock()
	if b.bp.topics[name] == t && t.info.UpdatedAt.IsZero() {
		delete(b.bp.topics, name)
	}
	b.bp.mu.Unlock()
}

// retryAfter estimates when a backlog at ratio r is back under rejectRelease from how fast it
// fell between the last two reads: at least the refresh interval (nothing changes sooner), at
// most maxRetryAfter, and the interval when it did not fall. backpressure.mu must be held.
func (b *Broker) retryAfter(t *bpTopic, r float64) time.Duration {
	least := b.backpressureInterval
	if least <= 0 {
		least = DefaultBackpressureInterval // refreshed by hand (tests)
	}
	dt := t.info.UpdatedAt.Sub(t.prevAt)
	fell := t.prevRatio - t.ratio
	if t.prevAt.IsZero() || dt <= 0 || fell <= 0 {
		return least
	}
	need := (r - rejectRelease) / fell * float64(dt)
	if math.IsNaN(need) || need > float64(maxRetryAfter) {
		return maxRetryAfter
	}
	return max(least, time.Duration(need))
}

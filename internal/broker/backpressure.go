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
// TopicList, then per bounded topic its subscriptions' stats and the topic's size) and keeps a
// state per topic, which each publish only reads:
//
//   - reject (the default policy): at the bound publishes fail with ErrRateLimited
//     (RATE_LIMITED, HTTP 429) and a retry-after; they are accepted again below 90% of it.
//   - throttle: from half the bound each publish waits before its append, up to
//     Config.MaxThrottleDelay as the backlog nears the bound (the wait grows linearly from 40%),
//     released below 40%; at the bound publishes are refused as with reject.
//
// The thresholds apart leave room for hysteresis: the state does not flap around one value.
// Publishers holding the priority permission (PublishOptions.Priority) are exempt. The bound is
// as fresh as the last refresh: publishes in one interval can overshoot it by what arrives in
// that interval.

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

// BackpressureInfo is a bounded topic's backpressure for the API and the metrics.
type BackpressureInfo struct {
	Topic string `json:"topic"`
	// State is normal, throttled or rejecting.
	State  string                `json:"state"`
	Policy storage.BacklogPolicy `json:"policy"`
	// BacklogMessages is the largest pending count over the topic's ACTIVE subscriptions;
	// BacklogBytes estimates their size (messages times the topic's mean retained message size).
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

// bpTopic is the backpressure state of one bounded topic.
type bpTopic struct {
	info BackpressureInfo
	// ratio is the backlog over its bound (the larger of the two dimensions); prevRatio and
	// prevAt are the previous reading, for the drain rate behind RetryAfter.
	ratio     float64
	prevRatio float64
	prevAt    time.Time
	throttled atomic.Int64
	rejected  atomic.Int64
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

// admit applies topic's backpressure to a publish: the wait of a throttled one, or the error of
// a refused one.
func (b *Broker) admit(topic string, opts PublishOptions) (time.Duration, error) {
	if opts.Priority {
		return 0, nil
	}
	b.bp.mu.RLock()
	t := b.bp.topics[topic]
	var state string
	var delay time.Duration
	var e *BackpressureError
	if t != nil {
		state, delay = t.info.State, t.info.Delay
		if state == BackpressureRejecting {
			e = &BackpressureError{Topic: topic, Backlog: t.info.BacklogMessages, Bound: boundText(&t.info), RetryAfter: t.info.RetryAfter}
		}
	}
	b.bp.mu.RUnlock()
	switch state {
	case BackpressureRejecting:
		t.rejected.Add(1)
		return 0, e
	case BackpressureThrottled:
		t.throttled.Add(1)
		return delay, nil
	}
	return 0, nil
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

func boundText(i *BackpressureInfo) string {
	var parts []string
	if i.MaxBacklogMessages > 0 {
		parts = append(parts, fmt.Sprintf("max_backlog_messages %d", i.MaxBacklogMessages))
	}
	if i.MaxBacklogBytes > 0 {
		parts = append(parts, fmt.Sprintf("max_backlog_bytes %d, about %d now", i.MaxBacklogBytes, i.BacklogBytes))
	}
	return strings.Join(parts, ", ")
}

// Backpressure describes the backpressure of every topic that has (or had, since the broker
// started) a backlog bound, by topic name.
func (b *Broker) Backpressure() []BackpressureInfo {
	b.bp.mu.RLock()
	defer b.bp.mu.RUnlock()
	out := make([]BackpressureInfo, 0, len(b.bp.topics))
	for _, t := range b.bp.topics {
		i := t.info
		i.Throttled, i.Rejected = t.throttled.Load(), t.rejected.Load()
		out = append(out, i)
	}
	slices.SortFunc(out, func(a, b BackpressureInfo) int { return strings.Compare(a.Topic, b.Topic) })
	return out
}

// TopicBackpressure describes one topic's backpressure; ok is false for a topic without a bound.
func (b *Broker) TopicBackpressure(topic string) (BackpressureInfo, bool) {
	b.bp.mu.RLock()
	defer b.bp.mu.RUnlock()
	t := b.bp.topics[topic]
	if t == nil || !(storage.TopicConfig{MaxBacklogMessages: t.info.MaxBacklogMessages, MaxBacklogBytes: t.info.MaxBacklogBytes}).HasBacklogBound() {
		return BackpressureInfo{}, false
	}
	i := t.info
	i.Throttled, i.Rejected = t.throttled.Load(), t.rejected.Load()
	return i, true
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
				t.info.State, t.info.Delay, t.info.RetryAfter, t.info.MaxBacklogMessages, t.info.MaxBacklogBytes = BackpressureNormal, 0, 0, 0, 0
			}
		}
		bp.mu.Unlock()
	}
	bp.sinceList++
	now := b.clock.Now()
	var firstErr error
	for name, cfg := range bp.bounded {
		msgs, bytes, err := b.topicBacklog(ctx, name)
		if err != nil {
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
		if bp.topics == nil {
			bp.topics = make(map[string]*bpTopic)
		}
		t := bp.topics[name]
		if t == nil {
			t = &bpTopic{info: BackpressureInfo{Topic: name, State: BackpressureNormal}}
			bp.topics[name] = t
		}
		old := t.info.State
		b.updateBackpressure(t, cfg, msgs, bytes, now)
		info := t.info
		bp.mu.Unlock()
		if info.State != old {
			b.logger.Info("topic backpressure changed", slog.String("topic", name), slog.String("from", old),
				slog.String("to", info.State), slog.Int64("backlog_messages", msgs), slog.Int64("backlog_bytes", bytes),
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

// updateBackpressure moves t's state for a new reading of its backlog. b.bp.mu must be held.
func (b *Broker) updateBackpressure(t *bpTopic, cfg storage.TopicConfig, msgs, bytes int64, now time.Time) {
	i := &t.info
	i.Policy = cfg.BacklogPolicy
	if i.Policy == "" {
		i.Policy = storage.BacklogReject
	}
	i.MaxBacklogMessages, i.MaxBacklogBytes = cfg.MaxBacklogMessages, cfg.MaxBacklogBytes
	t.prevAt = i.UpdatedAt
	i.BacklogMessages, i.BacklogBytes, i.UpdatedAt = msgs, bytes, now
	r := 0.0
	if cfg.MaxBacklogMessages > 0 {
		r = float64(msgs) / float64(cfg.MaxBacklogMessages)
	}
	if cfg.MaxBacklogBytes > 0 {
		r = max(r, float64(bytes)/float64(cfg.MaxBacklogBytes))
	}
	t.prevRatio, t.ratio = t.ratio, r
	if t.prevAt.IsZero() {
		t.prevRatio = r
	}

	state := i.State
	switch {
	case r >= 1:
		state = BackpressureRejecting
	case state == BackpressureRejecting && r > rejectRelease:
		// stays refused until below 90%
	case i.Policy == storage.BacklogThrottle && (r >= throttleFrom || (r >= throttleRelease && state != BackpressureNormal)):
		state = BackpressureThrottled
	default:
		state = BackpressureNormal
	}
	i.State = state
	i.Delay = 0
	if state == BackpressureThrottled {
		f := min(1, (r-throttleRelease)/(1-throttleRelease))
		i.Delay = time.Duration(f * float64(b.maxThrottleDelay))
	}
	i.RetryAfter = 0
	if state == BackpressureRejecting {
		i.RetryAfter = b.retryAfter(t, r, now)
	}
}

// retryAfter estimates when the backlog is back under rejectRelease from how fast it fell since
// the previous reading: at least the refresh interval (nothing changes sooner), at most
// maxRetryAfter, and the interval when it did not fall.
func (b *Broker) retryAfter(t *bpTopic, r float64, now time.Time) time.Duration {
	least := b.backpressureInterval
	if least <= 0 {
		least = DefaultBackpressureInterval // refreshed by hand (tests)
	}
	dt := now.Sub(t.prevAt)
	fell := t.prevRatio - r
	if dt <= 0 || fell <= 0 {
		return least
	}
	need := (r - rejectRelease) / fell * float64(dt)
	if math.IsNaN(need) || need > float64(maxRetryAfter) {
		return maxRetryAfter
	}
	return max(least, time.Duration(need))
}

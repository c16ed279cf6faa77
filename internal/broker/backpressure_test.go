package broker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// newBPEnv is a broker whose backpressure is refreshed by the test only (RefreshBackpressure).
func newBPEnv(t *testing.T) *env {
	return newEnv(t, func(c *Config) {
		c.BackpressureInterval = -1
		c.MaxThrottleDelay = 40 * time.Millisecond
	})
}

func (e *env) refreshBP() BackpressureInfo {
	e.t.Helper()
	if err := e.b.RefreshBackpressure(e.ctx()); err != nil {
		e.t.Fatalf("RefreshBackpressure: %v", err)
	}
	i, _ := e.b.TopicBackpressure("bp")
	return i
}

func (e *env) tryPublish(topic, payload string, opts PublishOptions) error {
	_, err := e.b.PublishWith(e.ctx(), topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte(payload)}}, opts)
	return err
}

func wantState(t *testing.T, i BackpressureInfo, state string, backlog int64) {
	t.Helper()
	if i.State != state || i.BacklogMessages != backlog {
		t.Fatalf("backpressure %s with backlog %d, want %s with %d (%+v)", i.State, i.BacklogMessages, state, backlog, i)
	}
}

// A slow group holds the topic's backlog at its bound: publishes are refused with RATE_LIMITED
// and a retry-after (a priority publisher is not), a paused group does not count, and as the slow
// group drains below 90% of the bound publishes are accepted again. Nothing is lost.
func TestBackpressureRejectAtBoundOfSlowestGroup(t *testing.T) {
	e := newBPEnv(t)
	e.createTopic("bp", storage.TopicConfig{Semantics: storage.PubSub, MaxBacklogMessages: 10})
	start := storage.StartPosition{Kind: storage.FromBeginning}
	fast := e.subscribe(SubscribeParams{Pattern: "bp", Group: "fast", MaxInFlight: 100, Start: start})
	slow := e.subscribe(SubscribeParams{Pattern: "bp", Group: "slow", MaxInFlight: 100, Start: start})
	e.publishN("bp", "m", 10)
	ack(t, fast, recv(t, fast, 10)...)
	wantState(t, e.refreshBP(), BackpressureRejecting, 10)

	err := e.tryPublish("bp", "refused", PublishOptions{})
	var bpe *BackpressureError
	if !errors.Is(err, storage.ErrRateLimited) || !errors.As(err, &bpe) || bpe.RetryAfter < DefaultBackpressureInterval {
		t.Fatalf("publish at the bound: %v, want RATE_LIMITED with a retry-after of at least %s", err, DefaultBackpressureInterval)
	}
	if err := e.tryPublish("bp", "priority", PublishOptions{Priority: true}); err != nil {
		t.Fatalf("priority publish at the bound: %v", err)
	}
	ack(t, fast, recv(t, fast, 1)...)

	// A PAUSED group does not hold producers back; resumed, it does again.
	if _, err := e.b.PauseGroup(e.ctx(), "bp", "slow"); err != nil {
		t.Fatal(err)
	}
	wantState(t, e.refreshBP(), BackpressureNormal, 0)
	if _, err := e.b.ResumeGroup(e.ctx(), "bp", "slow"); err != nil {
		t.Fatal(err)
	}
	wantState(t, e.refreshBP(), BackpressureRejecting, 11)

	// Draining to 10 (91%) is not enough (hysteresis); to 9 (82%) is.
	// The retry-after follows the drain rate: 11 to 10 in 2 s, 1 more to go below 90%.
	ds := recv(t, slow, 11)
	ack(t, slow, ds[0])
	e.clock.Advance(2 * time.Second)
	at10 := e.refreshBP()
	wantState(t, at10, BackpressureRejecting, 10)
	if d := at10.RetryAfter; d < 1900*time.Millisecond || d > 2100*time.Millisecond {
		t.Fatalf("retry-after %s at 1 message/2 s with 1 to go, want about 2s", d)
	}
	if err := e.tryPublish("bp", "refused", PublishOptions{}); !errors.Is(err, storage.ErrRateLimited) {
		t.Fatalf("publish above 90%% of the bound after being refused: %v, want RATE_LIMITED", err)
	}
	ack(t, slow, ds[1:3]...)
	wantState(t, e.refreshBP(), BackpressureNormal, 8)
	if err := e.tryPublish("bp", "after", PublishOptions{}); err != nil {
		t.Fatalf("publish after the slow group drained: %v", err)
	}
	i, _ := e.b.TopicBackpressure("bp")
	if i.Rejected != 2 || i.Throttled != 0 {
		t.Fatalf("counted %d rejected, %d throttled; want 2 and 0", i.Rejected, i.Throttled)
	}

	// Nothing lost: both groups get the 12 messages stored, and none of the refused ones.
	rest := append(ds[3:], recv(t, slow, 1)...)
	ack(t, slow, rest...)
	all := append(ds, rest[len(rest)-1])
	got := map[string]bool{}
	for _, d := range all {
		got[string(d.Payload)] = true
	}
	for _, d := range recv(t, fast, 1) {
		got["fast:"+string(d.Payload)] = true
	}
	for k := range 10 {
		if !got[fmt.Sprint("m-", k)] {
			t.Fatalf("message m-%d missing: %v", k, got)
		}
	}
	if !got["priority"] || !got["after"] || got["refused"] || !got["fast:after"] {
		t.Fatalf("slow group got %v", got)
	}
}

// With the throttle policy publishes wait more and more from half the bound, are refused at it,
// and are released with hysteresis: still throttled at 40%, normal below.
func TestBackpressureThrottleProgressiveWithHysteresis(t *testing.T) {
	e := newBPEnv(t)
	e.createTopic("bp", storage.TopicConfig{MaxBacklogMessages: 10, BacklogPolicy: storage.BacklogThrottle})
	e.publishN("bp", "m", 4)
	wantState(t, e.refreshBP(), BackpressureNormal, 4)
	e.publishN("bp", "m", 2)
	at6 := e.refreshBP()
	wantState(t, at6, BackpressureThrottled, 6)
	if err := e.tryPublish("bp", "slowed", PublishOptions{}); err != nil {
		t.Fatalf("throttled publish: %v", err)
	}
	e.publishN("bp", "n", 2)
	at9 := e.refreshBP()
	wantState(t, at9, BackpressureThrottled, 9)
	if !(0 < at6.Delay && at6.Delay < at9.Delay && at9.Delay <= 40*time.Millisecond) {
		t.Fatalf("delays %s at 60%% and %s at 90%%: want growing up to 40ms", at6.Delay, at9.Delay)
	}
	if err := e.tryPublish("bp", "last", PublishOptions{}); err != nil {
		t.Fatalf("throttled publish: %v", err)
	}
	wantState(t, e.refreshBP(), BackpressureRejecting, 10)
	if err := e.tryPublish("bp", "refused", PublishOptions{}); !errors.Is(err, storage.ErrRateLimited) {
		t.Fatalf("publish at the bound with throttle: %v, want RATE_LIMITED", err)
	}

	m := e.subscribe(SubscribeParams{Pattern: "bp", MaxInFlight: 100})
	ds := recv(t, m, 10)
	ack(t, m, ds[:2]...)
	wantState(t, e.refreshBP(), BackpressureThrottled, 8)
	ack(t, m, ds[2:6]...)
	wantState(t, e.refreshBP(), BackpressureThrottled, 4) // 40%: not released yet
	ack(t, m, ds[6])
	wantState(t, e.refreshBP(), BackpressureNormal, 3)
	i, _ := e.b.TopicBackpressure("bp")
	if i.Throttled != 4 || i.Rejected != 1 || i.Delay != 0 { // slowed, n-0, n-1, last
		t.Fatalf("throttled %d, rejected %d, delay %s; want 4, 1, 0", i.Throttled, i.Rejected, i.Delay)
	}
}

// A topic whose bound is removed is released at the next refresh; topics without a bound are not
// listed.
func TestBackpressureBoundRemoved(t *testing.T) {
	e := newBPEnv(t)
	e.createTopic("bp", storage.TopicConfig{MaxBacklogMessages: 2})
	e.createTopic("free", storage.TopicConfig{})
	e.publishN("bp", "m", 2)
	e.publishN("free", "m", 5)
	wantState(t, e.refreshBP(), BackpressureRejecting, 2)
	if _, ok := e.b.TopicBackpressure("free"); ok {
		t.Fatal("a topic without a bound has a backpressure state")
	}
	if _, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "bp", Config: storage.TopicConfig{}}); err != nil {
		t.Fatal(err)
	}
	e.refreshBP()
	if _, ok := e.b.TopicBackpressure("bp"); ok {
		t.Fatal("a topic whose bound was removed still has a backpressure state")
	}
	if err := e.tryPublish("bp", "x", PublishOptions{}); err != nil {
		t.Fatalf("publish after the bound was removed: %v", err)
	}
}

// The broker's loop lists the topics every listEvery refreshes: a bound set through this broker
// applies at the next refresh, one set through another instance (the engine directly) within
// listEvery; a deleted topic's state goes at once, so a topic created again with its name is not
// refused.
func TestBackpressureRefreshCadence(t *testing.T) {
	e := newBPEnv(t)
	e.createTopic("bp", storage.TopicConfig{MaxBacklogMessages: 1})
	e.publishN("bp", "m", 1)
	if err := e.b.refreshBackpressure(e.ctx(), false); err != nil {
		t.Fatal(err)
	}
	if i, _ := e.b.TopicBackpressure("bp"); i.State != BackpressureRejecting {
		t.Fatalf("bound set through the broker: %+v, want rejecting at the next refresh", i)
	}

	if _, err := e.engine.TopicCreate(e.ctx(), &storage.TopicCreateParams{Name: "other", Config: storage.TopicConfig{MaxBacklogMessages: 1}}); err != nil {
		t.Fatal(err)
	}
	e.publishN("other", "m", 1)
	refreshes := 0
	for ; refreshes <= listEvery; refreshes++ {
		if i, ok := e.b.TopicBackpressure("other"); ok && i.State == BackpressureRejecting {
			break
		}
		if err := e.b.refreshBackpressure(e.ctx(), false); err != nil {
			t.Fatal(err)
		}
	}
	if refreshes > listEvery {
		t.Fatalf("a bound set through another instance not applied after %d refreshes", refreshes)
	}

	if err := e.b.DeleteTopic(e.ctx(), "bp", true); err != nil {
		t.Fatal(err)
	}
	e.createTopic("bp", storage.TopicConfig{})
	if err := e.tryPublish("bp", "again", PublishOptions{}); err != nil {
		t.Fatalf("publish to a topic created again without a bound: %v", err)
	}
}

// The bytes bound: the backlog's messages times the topic's mean retained message size.
func TestBackpressureBytesBound(t *testing.T) {
	e := newBPEnv(t)
	e.createTopic("bp", storage.TopicConfig{MaxBacklogBytes: 5000})
	payload := string(make([]byte, 1000))
	for range 10 {
		if err := e.tryPublish("bp", payload, PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	i := e.refreshBP()
	wantState(t, i, BackpressureRejecting, 10)
	if i.BacklogBytes < 10_000 || i.BacklogBytes > 12_000 {
		t.Fatalf("backlog bytes %d for 10 messages of 1000 bytes", i.BacklogBytes)
	}
	m := e.subscribe(SubscribeParams{Pattern: "bp", MaxInFlight: 100})
	ack(t, m, recv(t, m, 6)...)
	i = e.refreshBP()
	wantState(t, i, BackpressureNormal, 4)
	if err := e.tryPublish("bp", "x", PublishOptions{}); err != nil {
		t.Fatalf("publish under the bytes bound: %v", err)
	}
}

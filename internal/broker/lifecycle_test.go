package broker

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func lifecycleIDs(ss []*storage.Subscription) []int64 {
	var out []int64
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func sameIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The lifecycle job heartbeats the subscriptions with a member here, so only the one without a
// member goes DEAD; a member leaving never cancels its group; a member coming back resurrects it;
// a CANCELLED subscription becomes DELETED after subscription_retention, leaves the listings and
// leaves an audit line. Runs are called directly with the fake clock (the loop's first run is an
// hour of real time away).
func TestLifecycleJob(t *testing.T) {
	logs := &lockedBuffer{}
	var results []*LifecycleResult
	var mu sync.Mutex
	e := newEnv(t, func(c *Config) {
		c.LifecycleInterval = time.Hour
		c.SubscriptionRetention = 24 * time.Hour
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		c.OnLifecycle = func(r *LifecycleResult) {
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}
	})
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	m := e.subscribe(SubscribeParams{Pattern: "orders", Group: "live"})
	live, err := e.engine.SubscriptionGetByGroup(ctx, "orders", "live")
	if err != nil {
		t.Fatal(err)
	}
	idle, err := e.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "orders", Group: "idle"})
	if err != nil {
		t.Fatal(err)
	}

	// No member for the timeout: DEAD; the group with a member here is heartbeated.
	e.clock.Advance(storage.DefaultHeartbeatTimeout / 2)
	if r := e.b.runLifecycle(ctx); r.Err != nil || r.Heartbeats != 1 || len(r.Dead) != 0 {
		t.Fatalf("first run: %+v", r)
	}
	e.clock.Advance(storage.DefaultHeartbeatTimeout/2 + time.Second)
	r := e.b.runLifecycle(ctx)
	if r.Err != nil || !sameIDs(lifecycleIDs(r.Dead), []int64{idle.ID}) {
		t.Fatalf("second run: DEAD %v (err %v), want [%d]", lifecycleIDs(r.Dead), r.Err, idle.ID)
	}
	if !strings.Contains(logs.String(), "subscription dead") {
		t.Errorf("no log line for the DEAD subscription:\n%s", logs.String())
	}

	// The member leaves: its group is not cancelled, and goes DEAD a timeout later.
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if g, err := e.b.Group(ctx, "orders", "live"); err != nil || g.State != storage.Active {
		t.Fatalf("group after its last member left: %+v, %v", g, err)
	}
	e.clock.Advance(storage.DefaultHeartbeatTimeout + time.Second)
	if r := e.b.runLifecycle(ctx); !sameIDs(lifecycleIDs(r.Dead), []int64{live.ID}) {
		t.Fatalf("after the member left: DEAD %v, want [%d]", lifecycleIDs(r.Dead), live.ID)
	}

	// A member attaching resurrects it; so does a heartbeat if it went DEAD while attached.
	e.subscribe(SubscribeParams{Pattern: "orders", Group: "live"})
	if g, _ := e.b.Group(ctx, "orders", "live"); g == nil || g.State != storage.Active {
		t.Fatalf("group after a member came back: %+v", g)
	}
	if _, err := e.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: live.ID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	if r := e.b.runLifecycle(ctx); !sameIDs(lifecycleIDs(r.Resurrected), []int64{live.ID}) || len(r.Dead) != 0 {
		t.Fatalf("heartbeat of a DEAD subscription with a member: resurrected %v, dead %v", lifecycleIDs(r.Resurrected), lifecycleIDs(r.Dead))
	}

	// CANCELLED -> DELETED after subscription_retention (24 h here), gone from the listings.
	if _, err := e.b.CancelGroup(ctx, "orders", "idle"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(24 * time.Hour)
	if r := e.b.runLifecycle(ctx); len(r.Deleted) != 0 {
		t.Fatalf("DELETED at the retention: %v", lifecycleIDs(r.Deleted))
	}
	e.clock.Advance(time.Second)
	if r := e.b.runLifecycle(ctx); !sameIDs(lifecycleIDs(r.Deleted), []int64{idle.ID}) {
		t.Fatalf("DELETED %v, want [%d]", lifecycleIDs(r.Deleted), idle.ID)
	}
	groups, err := e.b.Groups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Subscription.ID == idle.ID {
			t.Errorf("Groups lists the DELETED subscription %d", idle.ID)
		}
	}
	if !strings.Contains(logs.String(), "cancelled subscription deleted") {
		t.Errorf("no audit line for the DELETED subscription:\n%s", logs.String())
	}
	mu.Lock()
	var runs, others int
	for _, r := range results {
		if r.Job {
			runs++
		} else {
			others++ // the member coming back resurrected it
		}
	}
	mu.Unlock()
	if runs != 6 || others != 1 {
		t.Errorf("OnLifecycle called for %d runs and %d other transitions, want 6 and 1", runs, others)
	}
}

// The run interval is at most a fifth of the shortest heartbeat timeout (seed 000's 20% rule).
func TestLifecycleIntervalFollowsShortestTimeout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LifecycleInterval = time.Hour })
	ctx := e.ctx()
	if got := e.b.nextLifecycle(ctx); got != time.Hour {
		t.Fatalf("interval without subscriptions: %s", got)
	}
	e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
	if _, err := e.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g", HeartbeatTimeout: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if got := e.b.nextLifecycle(ctx); got != 4*time.Second {
		t.Fatalf("interval with a 20 s timeout: %s, want 4s", got)
	}
	if _, err := e.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "h", HeartbeatTimeout: storage.MinHeartbeatTimeout}); err != nil {
		t.Fatal(err)
	}
	if got := e.b.nextLifecycle(ctx); got != MinLifecycleInterval || got > storage.MinHeartbeatTimeout/5 {
		t.Fatalf("interval with the shortest timeout: %s, want %s (at most 20%% of it)", got, MinLifecycleInterval)
	}
}

func TestLifecycleConfigRefused(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []Config{
		{Engine: e.engine, LifecycleInterval: time.Millisecond},
		{Engine: e.engine, SubscriptionRetention: -time.Second},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

// heartbeatAttached heartbeats one subscription at once and resurrects it if it is DEAD.
func TestHeartbeatAttached(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LifecycleInterval = time.Hour })
	ctx := e.ctx()
	e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
	s, err := e.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	e.b.heartbeatAttached(ctx, s.ID)
	got, _ := e.engine.SubscriptionGet(ctx, s.ID)
	if !got.LastHeartbeatAt.Equal(e.clock.Now()) {
		t.Fatalf("LastHeartbeatAt %s, want %s", got.LastHeartbeatAt, e.clock.Now())
	}
	if _, err := e.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: s.ID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	e.b.heartbeatAttached(ctx, s.ID)
	if got, _ := e.engine.SubscriptionGet(ctx, s.ID); got.State != storage.Active {
		t.Fatalf("state after a heartbeat of a DEAD subscription: %s", got.State)
	}
}

// A member that attaches and leaves between two lifecycle runs counts as live: attaching a durable
// subscription heartbeats it at once, so it is not DEAD a timeout after its creation.
func TestBriefAttachCountsAsLive(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LifecycleInterval = time.Hour })
	ctx := e.ctx()
	e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
	s, err := e.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(storage.DefaultHeartbeatTimeout - time.Second)
	m := e.subscribe(SubscribeParams{Pattern: "t", Group: "g"})
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second) // past the timeout since creation, not since the attach
	if r := e.b.runLifecycle(ctx); r.Err != nil || len(r.Dead) != 0 {
		t.Fatalf("after a brief attach: DEAD %v (err %v), want none", lifecycleIDs(r.Dead), r.Err)
	}
	if got, _ := e.engine.SubscriptionGet(ctx, s.ID); got.State != storage.Active {
		t.Fatalf("state %s, want ACTIVE", got.State)
	}
}

// lifecycleRecorder records what the broker reports to Config.OnLifecycle: the runs of the
// lifecycle loop on runs with the fake time of each, the transitions made outside the job on
// others.
type lifecycleRecorder struct {
	clock  *fakeClock
	runs   chan lifecycleRun
	mu     sync.Mutex
	others []*LifecycleResult
}

type lifecycleRun struct {
	at  time.Time
	res *LifecycleResult
}

func recordLifecycle(e *env) *lifecycleRecorder {
	r := &lifecycleRecorder{clock: e.clock, runs: make(chan lifecycleRun, 1000)}
	e.cfg.OnLifecycle = func(res *LifecycleResult) {
		if res.Job {
			r.runs <- lifecycleRun{at: r.clock.Now(), res: res}
			return
		}
		r.mu.Lock()
		r.others = append(r.others, res)
		r.mu.Unlock()
	}
	return r
}

func (r *lifecycleRecorder) outside() []*LifecycleResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.others)
}

// lifecycleEnv is an env whose broker reports to a lifecycleRecorder, with the default
// LifecycleInterval (one minute) unless mod changes it.
func lifecycleEnv(t *testing.T, mod func(*Config)) (*env, *lifecycleRecorder) {
	e := &env{t: t, dir: t.TempDir(), clock: newFakeClock()}
	e.cfg = Config{Logger: testLogger(t), RetentionInterval: -1, PollInterval: time.Hour}
	if mod != nil {
		mod(&e.cfg)
	}
	r := recordLifecycle(e)
	e.open()
	t.Cleanup(e.close)
	return e, r
}

// step moves the fake clock by d, lets the lifecycle loop look, and returns its run at the new
// time (waited for a bounded real time: the loop runs on its goroutine).
func (r *lifecycleRecorder) step(t *testing.T, e *env, d time.Duration) *LifecycleResult {
	t.Helper()
	e.clock.Advance(d)
	now := e.clock.Now()
	e.b.checkLifecycle()
	limit := time.NewTimer(5 * time.Second)
	defer limit.Stop()
	for {
		select {
		case run := <-r.runs:
			if run.at.Equal(now) {
				return run.res
			}
		case <-limit.C:
			t.Fatalf("no lifecycle run at %s", now)
			return nil
		}
	}
}

// Seed 000: DEAD is detected within the heartbeat timeout plus at most 20% of it. With the default
// LifecycleInterval (one minute), a group with a 10 s timeout goes DEAD within 12 s of its last
// heartbeat, however it came to this broker: it existed at the start (the first wait is the
// computed one, not the configured minute), was created or updated here after the start, or a
// member attached to it (each reschedules the loop at once).
func TestLifecycleReschedulesForShortTimeout(t *testing.T) {
	const timeout = 10 * time.Second
	for _, c := range []struct {
		name string
		// group makes the group with the 10 s timeout at the fake start time, returns its ID.
		group func(e *env) int64
	}{
		{"existing_at_start", func(e *env) int64 {
			s, err := e.engine.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: "t", Group: "g", HeartbeatTimeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			e.restart()
			return s.ID
		}},
		{"created", func(e *env) int64 {
			s, err := e.b.CreateGroup(e.ctx(), CreateGroupParams{Topic: "t", Group: "g", HeartbeatTimeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			return s.ID
		}},
		{"updated", func(e *env) int64 {
			s, err := e.b.CreateGroup(e.ctx(), CreateGroupParams{Topic: "t", Group: "g"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.b.UpdateGroup(e.ctx(), UpdateGroupParams{Topic: "t", Group: "g", HeartbeatTimeout: timeout}); err != nil {
				t.Fatal(err)
			}
			return s.ID
		}},
		{"attached", func(e *env) int64 {
			// Created elsewhere (another instance, the engine): this broker learns of it when a
			// member attaches.
			s, err := e.engine.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: "t", Group: "g", HeartbeatTimeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			m := e.subscribe(SubscribeParams{Pattern: "t", Group: "g"})
			if err := m.Close(e.ctx()); err != nil {
				t.Fatal(err)
			}
			return s.ID
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, rec := lifecycleEnv(t, nil)
			e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
			id := c.group(e)
			// Runs every 2 s of fake time (a fifth of the timeout): not DEAD at the timeout,
			// DEAD at the first run past it.
			var dead time.Duration
			for at := 2 * time.Second; at <= timeout+timeout/5 && dead == 0; at += 2 * time.Second {
				r := rec.step(t, e, 2*time.Second)
				if r.Err != nil {
					t.Fatalf("run at +%s: %v", at, r.Err)
				}
				if slices.Contains(lifecycleIDs(r.Dead), id) {
					dead = at
				}
			}
			if dead == 0 {
				t.Fatalf("not DEAD %s after its last heartbeat (timeout %s)", timeout+timeout/5, timeout)
			}
			if dead <= timeout {
				t.Fatalf("DEAD at +%s, before its timeout %s", dead, timeout)
			}
		})
	}
}

// Seed 000's debounce: a member that keeps crashing and reconnecting within the heartbeat timeout
// never flips its group's state, over many timeouts; once members stay away a whole timeout the
// group goes DEAD, once.
func TestCrashLoopingMemberNeverFlipsState(t *testing.T) {
	const timeout = 10 * time.Second
	e, rec := lifecycleEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
	sub, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "t", Group: "g", HeartbeatTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	// Six crashes 9 s apart: 54 s, more than five timeouts; the lifecycle job runs between each
	// crash and the next attach, when no member is attached.
	for i := range 6 {
		m := e.subscribe(SubscribeParams{Pattern: "t", Group: "g"})
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
		r := rec.step(t, e, timeout-time.Second)
		if r.Err != nil || len(r.Dead) != 0 || len(r.Resurrected) != 0 {
			t.Fatalf("run after crash %d: dead %v, resurrected %v, err %v", i, lifecycleIDs(r.Dead), lifecycleIDs(r.Resurrected), r.Err)
		}
		if g, err := e.b.Group(ctx, "t", "g"); err != nil || g.State != storage.Active {
			t.Fatalf("group after crash %d: %+v, %v", i, g, err)
		}
	}
	// The members stay away: DEAD at the first run past the timeout (2 s later: the run 9 s
	// after the last attach was the last one before it), and only once.
	if r := rec.step(t, e, 2*time.Second); !sameIDs(lifecycleIDs(r.Dead), []int64{sub.ID}) {
		t.Fatalf("DEAD %v at the first run past the timeout, want [%d]", lifecycleIDs(r.Dead), sub.ID)
	}
	// With no live short timeout left the loop waits the configured minute again.
	if r := rec.step(t, e, DefaultLifecycleInterval); len(r.Dead) != 0 || len(r.Resurrected) != 0 {
		t.Fatalf("next run: dead %v, resurrected %v", lifecycleIDs(r.Dead), lifecycleIDs(r.Resurrected))
	}
	if g, err := e.b.Group(ctx, "t", "g"); err != nil || g.State != storage.Dead {
		t.Fatalf("group after members stayed away: %+v, %v", g, err)
	}
	if others := rec.outside(); len(others) != 0 {
		t.Fatalf("transitions outside the job: %+v", others)
	}
}

// Every resurrection and deletion made outside the lifecycle job reaches Config.OnLifecycle once
// (the metrics' one path): a member attaching to a DEAD group, a heartbeat of an attached DEAD
// group, ResurrectGroup and ResumeGroup of a DEAD group, RemoveGroup; resuming a PAUSED group is
// no resurrection and a second RemoveGroup deletes nothing.
func TestTransitionsOutsideJobReported(t *testing.T) {
	e, rec := lifecycleEnv(t, func(c *Config) { c.LifecycleInterval = time.Hour })
	ctx := e.ctx()
	e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
	sub, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "t", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	kill := func() {
		t.Helper()
		if _, err := e.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub.ID, State: storage.Dead}); err != nil {
			t.Fatal(err)
		}
	}
	seen := 0
	expect := func(what string, resurrected, deleted []int64) {
		t.Helper()
		all := rec.outside()
		got := all[seen:]
		seen = len(all)
		var res, del []int64
		for _, r := range got {
			if r.Job || r.Heartbeats != 0 || len(r.Dead) != 0 {
				t.Errorf("%s: report %+v", what, r)
			}
			res = append(res, lifecycleIDs(r.Resurrected)...)
			del = append(del, lifecycleIDs(r.Deleted)...)
		}
		if !sameIDs(res, resurrected) || !sameIDs(del, deleted) {
			t.Fatalf("%s: reported resurrected %v deleted %v, want %v and %v", what, res, del, resurrected, deleted)
		}
	}

	kill()
	m := e.subscribe(SubscribeParams{Pattern: "t", Group: "g"})
	expect("member attaching to a DEAD group", []int64{sub.ID}, nil)
	kill()
	e.b.heartbeatAttached(ctx, sub.ID)
	expect("heartbeat of an attached DEAD group", []int64{sub.ID}, nil)
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	kill()
	if _, err := e.b.ResurrectGroup(ctx, "t", "g", true); err != nil {
		t.Fatal(err)
	}
	expect("ResurrectGroup", []int64{sub.ID}, nil)
	kill()
	if _, err := e.b.ResumeGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	expect("ResumeGroup of a DEAD group", []int64{sub.ID}, nil)
	if _, err := e.b.PauseGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.ResumeGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	expect("pause and resume", nil, nil)
	if _, err := e.b.RemoveGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	expect("RemoveGroup", nil, []int64{sub.ID})
	if _, err := e.b.RemoveGroup(ctx, "t", "g"); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Fatalf("second RemoveGroup: %v", err)
	}
	// A CANCELLED group removed: deleted at once too.
	other, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "t", Group: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.CancelGroup(ctx, "t", "h"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.RemoveGroup(ctx, "t", "h"); err != nil {
		t.Fatal(err)
	}
	expect("RemoveGroup of a CANCELLED group", nil, []int64{other.ID})
	// The job's own runs stay reported as runs.
	if r := e.b.runLifecycle(ctx); !r.Job {
		t.Fatalf("a run reported with Job false: %+v", r)
	}
	expect("a run of the job", nil, nil)
}

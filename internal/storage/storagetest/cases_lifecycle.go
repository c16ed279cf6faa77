package storagetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Subscription lifecycle (seed 000): heartbeats, DEAD after the heartbeat timeout, resurrection,
// and CANCELLED -> DELETED after subscription_retention. Time is the fake clock only.
func lifecycleCases() []testCase {
	return []testCase{
		{name: "dead_after_timeout_not_before", fn: testLifeDeadAfterTimeout},
		{name: "heartbeat_postpones_dead", fn: testLifeHeartbeatPostpones},
		{name: "heartbeat_timeout_per_group", fn: testLifeTimeoutPerGroup},
		{name: "resurrection", fn: testLifeResurrection},
		{name: "paused_never_dead", fn: testLifePausedNeverDead},
		{name: "dead_stops_holding_retention", fn: testLifeDeadRetention},
		{name: "cancelled_deleted_after_retention", fn: testLifeCancelledDeleted},
		{name: "invalid_params", fn: testLifeInvalid},
		{name: "restart_keeps_lifecycle", restart: true, fn: testLifeRestart},
		{name: "configure_start_without_progress", fn: testLifeConfigureStart},
		{name: "configure_heartbeat_timeout", fn: testLifeConfigureTimeout},
		{name: "configure_refused", fn: testLifeConfigureRefused},
		{name: "configure_restart", restart: true, fn: testLifeConfigureRestart},
		{name: "maintain_concurrent_once", fn: testLifeMaintainConcurrent},
		{name: "heartbeat_races_maintain", fn: testLifeHeartbeatRacesMaintain},
	}
}

// maintain runs SubscriptionsMaintain with a CANCELLED retention (0: the default).
func (x *env) maintain(retention time.Duration) *storage.SubscriptionsMaintainResult {
	x.t.Helper()
	res, err := x.e.SubscriptionsMaintain(x.ctx, &storage.SubscriptionsMaintainParams{CancelledRetention: retention})
	noErr(x.t, err, "SubscriptionsMaintain")
	return res
}

// heartbeat runs SubscriptionsHeartbeat.
func (x *env) heartbeat(ids ...int64) *storage.SubscriptionsHeartbeatResult {
	x.t.Helper()
	res, err := x.e.SubscriptionsHeartbeat(x.ctx, &storage.SubscriptionsHeartbeatParams{IDs: ids})
	noErr(x.t, err, "SubscriptionsHeartbeat(%v)", ids)
	return res
}

func subIDs(ss []*storage.Subscription) []int64 {
	out := []int64{}
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func requireIDs(t testing.TB, got []*storage.Subscription, want []int64, what string) {
	t.Helper()
	ids := subIDs(got)
	if len(ids) != len(want) {
		t.Fatalf("%s: got subscriptions %v, want %v", what, ids, want)
	}
	for i := range ids {
		if ids[i] != want[i] {
			t.Fatalf("%s: got subscriptions %v, want %v", what, ids, want)
		}
	}
}

func testLifeDeadAfterTimeout(t *testing.T, x *env) {
	x.createTopic("hb", pubSub(1))
	s := x.subscribe("hb", "g", fromBeginning)
	equal(t, s.HeartbeatTimeout, storage.DefaultHeartbeatTimeout, "default heartbeat timeout")
	timeEqual(t, s.LastHeartbeatAt, x.now(), "LastHeartbeatAt at creation")
	q := x.queueSub(x.createTopic("hbq", storage.TopicConfig{}).Name)
	equal(t, q.HeartbeatTimeout, storage.DefaultHeartbeatTimeout, "queue subscription's heartbeat timeout")

	x.advance(storage.DefaultHeartbeatTimeout)
	requireIDs(t, x.maintain(0).Dead, nil, "DEAD exactly at the timeout")
	equal(t, x.getSub(s.ID).State, storage.Active, "state at the timeout")
	x.advance(time.Millisecond)
	res := x.maintain(0)
	requireIDs(t, res.Dead, []int64{s.ID, q.ID}, "DEAD past the timeout")
	equal(t, res.Dead[0].State, storage.Dead, "state in the result")
	got := x.getSub(s.ID)
	equal(t, got.State, storage.Dead, "state past the timeout")
	timeEqual(t, got.UpdatedAt, x.now(), "UpdatedAt of the DEAD subscription")
	requireIDs(t, x.maintain(0).Dead, nil, "a second run")
	_, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: 1})
	errIs(t, err, storage.ErrSubscriptionNotActive, "claim on a DEAD subscription")
}

func testLifeHeartbeatPostpones(t *testing.T, x *env) {
	x.createTopic("hb", pubSub(1))
	s, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "hb", Group: "g", HeartbeatTimeout: 10 * time.Second})
	noErr(t, err, "SubscriptionCreate with a heartbeat timeout")
	equal(t, s.HeartbeatTimeout, 10*time.Second, "heartbeat timeout")
	for range 5 {
		x.advance(8 * time.Second)
		res := x.heartbeat(s.ID, s.ID, 1<<40)
		equal(t, res.Beats, 1, "beats (a duplicate and an unknown ID)")
		requireIDs(t, res.Resurrected, nil, "resurrected")
		requireIDs(t, x.maintain(0).Dead, nil, "DEAD while heartbeating")
	}
	timeEqual(t, x.getSub(s.ID).LastHeartbeatAt, x.now(), "LastHeartbeatAt")
	x.advance(10 * time.Second)
	requireIDs(t, x.maintain(0).Dead, nil, "DEAD at the timeout after the last heartbeat")
	x.advance(time.Millisecond)
	requireIDs(t, x.maintain(0).Dead, []int64{s.ID}, "DEAD past the timeout after the last heartbeat")
}

func testLifeTimeoutPerGroup(t *testing.T, x *env) {
	x.createTopic("hb", pubSub(1))
	short, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "hb", Group: "short", HeartbeatTimeout: storage.MinHeartbeatTimeout})
	noErr(t, err, "SubscriptionCreate short")
	long, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "hb", Group: "long", HeartbeatTimeout: storage.MaxHeartbeatTimeout})
	noErr(t, err, "SubscriptionCreate long")
	def := x.subscribe("hb", "default", fromBeginning)
	x.advance(storage.MinHeartbeatTimeout + time.Millisecond)
	requireIDs(t, x.maintain(0).Dead, []int64{short.ID}, "after the shortest timeout")
	x.advance(storage.DefaultHeartbeatTimeout - storage.MinHeartbeatTimeout)
	requireIDs(t, x.maintain(0).Dead, []int64{def.ID}, "after the default timeout")
	x.advance(storage.MaxHeartbeatTimeout - storage.DefaultHeartbeatTimeout)
	requireIDs(t, x.maintain(0).Dead, []int64{long.ID}, "after the longest timeout")
}

func testLifeResurrection(t *testing.T, x *env) {
	x.createTopic("res", pubSub(1))
	x.publishN("res", 0, 2)
	s := x.subscribe("res", "g", fromBeginning)
	gone := x.subscribe("res", "gone", fromBeginning)
	x.setState(gone.ID, storage.Cancelled)
	x.advance(storage.DefaultHeartbeatTimeout + time.Second)
	requireIDs(t, x.maintain(0).Dead, []int64{s.ID}, "DEAD")
	x.advance(time.Hour)

	// A heartbeat (a member is attached again) resurrects it; a CANCELLED one stays cancelled.
	res := x.heartbeat(gone.ID, s.ID)
	equal(t, res.Beats, 1, "beats (the CANCELLED subscription is skipped)")
	requireIDs(t, res.Resurrected, []int64{s.ID}, "resurrected")
	got := x.getSub(s.ID)
	equal(t, got.State, storage.Active, "state after the heartbeat")
	timeEqual(t, got.LastHeartbeatAt, x.now(), "LastHeartbeatAt after resurrection")
	timeEqual(t, got.UpdatedAt, x.now(), "UpdatedAt after resurrection")
	equal(t, x.getSub(gone.ID).State, storage.Cancelled, "the CANCELLED subscription")
	requireOffsets(t, x.claimAll(s.ID, "m"), []int64{0, 1}, "a resurrected subscription delivers what it had not")
	requireIDs(t, x.heartbeat(s.ID).Resurrected, nil, "a second heartbeat resurrects nothing")

	// Becoming ACTIVE through SubscriptionUpdate restarts the timeout too.
	x.advance(storage.DefaultHeartbeatTimeout + time.Second)
	requireIDs(t, x.maintain(0).Dead, []int64{s.ID}, "DEAD again")
	x.advance(time.Hour)
	up := x.setState(s.ID, storage.Active)
	timeEqual(t, up.LastHeartbeatAt, x.now(), "LastHeartbeatAt after SubscriptionUpdate to ACTIVE")
	requireIDs(t, x.maintain(0).Dead, nil, "DEAD right after SubscriptionUpdate to ACTIVE")
}

func testLifePausedNeverDead(t *testing.T, x *env) {
	x.createTopic("p", pubSub(1))
	s := x.subscribe("p", "g", fromBeginning)
	x.setState(s.ID, storage.Paused)
	x.advance(3 * storage.DefaultHeartbeatTimeout)
	requireIDs(t, x.maintain(0).Dead, nil, "DEAD while PAUSED")
	_, err := x.e.SubscriptionUpdate(x.ctx, &storage.SubscriptionUpdateParams{ID: s.ID, State: storage.Dead})
	errIs(t, err, storage.ErrInvalidTransition, "PAUSED to DEAD")
	equal(t, x.heartbeat(s.ID).Beats, 1, "a heartbeat of a PAUSED subscription")
	equal(t, x.getSub(s.ID).State, storage.Paused, "a heartbeat does not resume")
	x.advance(3 * storage.DefaultHeartbeatTimeout)
	up := x.setState(s.ID, storage.Active)
	timeEqual(t, up.LastHeartbeatAt, x.now(), "LastHeartbeatAt after resume")
	requireIDs(t, x.maintain(0).Dead, nil, "DEAD right after resume")
	x.advance(storage.DefaultHeartbeatTimeout + time.Millisecond)
	requireIDs(t, x.maintain(0).Dead, []int64{s.ID}, "DEAD a timeout after resume")
}

// testLifeDeadRetention: a subscription made DEAD by the detection job stops holding retention:
// messages the live group completed go after message_retention, counted as dead_subscription;
// resurrected, it continues from the oldest retained message.
func testLifeDeadRetention(t *testing.T, x *env) {
	cfg := pubSub(1)
	cfg.MessageRetention = time.Hour
	x.createTopic("dr", cfg)
	live := x.subscribe("dr", "live", fromBeginning)
	dead := x.subscribe("dr", "dead", fromBeginning)
	x.publishN("dr", 0, 3)
	x.drain(live.ID, "m")
	x.advance(2 * time.Hour)
	x.heartbeat(live.ID)
	res, err := x.e.RetentionApply(x.ctx)
	noErr(t, err, "RetentionApply while both are ACTIVE")
	equal(t, res.MessagesExpired+res.MessagesDeleted, 0, "removed while the other group is ACTIVE")
	requireIDs(t, x.maintain(0).Dead, []int64{dead.ID}, "DEAD")
	res, err = x.e.RetentionApply(x.ctx)
	noErr(t, err, "RetentionApply")
	equal(t, res.MessagesExpired, 3, "expired once the group is DEAD")
	equal(t, len(res.Expired), 1, "expired entries")
	equal(t, res.Expired[0].Reason, storage.ExpiredDeadSubscription, "reason")

	// Resurrected, it goes on from the oldest retained message: what it lost is gone (and was
	// counted), nothing after it is skipped.
	x.publishN("dr", 0, 2)
	requireIDs(t, x.heartbeat(dead.ID).Resurrected, []int64{dead.ID}, "resurrected")
	equal(t, partStats(t, x.stats(dead.ID), 0).AckFloor, int64(3), "floor after resurrection")
	requireOffsets(t, x.claimAll(dead.ID, "m"), []int64{3, 4}, "a resurrected group gets the retained messages")
}

func testLifeCancelledDeleted(t *testing.T, x *env) {
	x.createTopic("c", pubSub(1))
	s := x.subscribe("c", "g", fromBeginning)
	other := x.subscribe("c", "other", fromBeginning)
	x.advance(time.Minute)
	x.setState(s.ID, storage.Cancelled)
	x.heartbeat(other.ID)
	x.advance(time.Hour)
	x.heartbeat(other.ID)
	requireIDs(t, x.maintain(time.Hour).Deleted, nil, "DELETED exactly at the retention")
	equal(t, x.getSub(s.ID).State, storage.Cancelled, "state at the retention")
	x.advance(time.Millisecond)
	res := x.maintain(time.Hour)
	requireIDs(t, res.Deleted, []int64{s.ID}, "DELETED past the retention")
	requireIDs(t, res.Dead, nil, "DEAD")
	equal(t, res.Deleted[0].State, storage.Deleted, "state in the result")
	requireIDs(t, x.maintain(time.Hour).Deleted, nil, "a second run")
	_, err := x.e.SubscriptionGet(x.ctx, s.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "SubscriptionGet of a DELETED subscription")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "c", "g")
	errIs(t, err, storage.ErrSubscriptionNotFound, "SubscriptionGetByGroup of a DELETED subscription")
	requireIDs(t, x.listSubs("c"), []int64{other.ID}, "listing")
	all, err := x.e.SubscriptionList(x.ctx, &storage.SubscriptionListParams{Topic: "c", IncludeDeleted: true})
	noErr(t, err, "SubscriptionList IncludeDeleted")
	requireIDs(t, all, []int64{s.ID, other.ID}, "listing with IncludeDeleted")

	// The default retention is 30 days.
	s2 := x.subscribe("c", "g", fromBeginning)
	x.setState(s2.ID, storage.Cancelled)
	x.advance(storage.DefaultSubscriptionRetention)
	x.heartbeat(other.ID)
	requireIDs(t, x.maintain(0).Deleted, nil, "DELETED at the default retention")
	x.advance(time.Millisecond)
	requireIDs(t, x.maintain(0).Deleted, []int64{s2.ID}, "DELETED past the default retention")
}

func testLifeInvalid(t *testing.T, x *env) {
	x.createTopic("inv", pubSub(1))
	for _, d := range []time.Duration{-time.Second, time.Millisecond, storage.MinHeartbeatTimeout - time.Millisecond, storage.MaxHeartbeatTimeout + time.Second} {
		_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "inv", Group: "g", HeartbeatTimeout: d})
		errIs(t, err, storage.ErrInvalidArgument, "heartbeat timeout %s", d)
	}
	equal(t, len(x.listSubs("inv")), 0, "subscriptions after refused creations")
	_, err := x.e.SubscriptionsMaintain(x.ctx, &storage.SubscriptionsMaintainParams{CancelledRetention: -time.Second})
	errIs(t, err, storage.ErrInvalidArgument, "negative subscription retention")
	_, err = x.e.SubscriptionsMaintain(x.ctx, nil)
	errIs(t, err, storage.ErrInvalidArgument, "nil maintain params")
	_, err = x.e.SubscriptionsHeartbeat(x.ctx, nil)
	errIs(t, err, storage.ErrInvalidArgument, "nil heartbeat params")
	_, err = x.e.SubscriptionsHeartbeat(x.ctx, &storage.SubscriptionsHeartbeatParams{IDs: make([]int64, storage.MaxHeartbeatIDs+1)})
	errIs(t, err, storage.ErrInvalidArgument, "too many heartbeat IDs")
	equal(t, x.heartbeat().Beats, 0, "a heartbeat of nothing")
}

func testLifeRestart(t *testing.T, x *env) {
	x.createTopic("rs", pubSub(1))
	s, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "rs", Group: "g", HeartbeatTimeout: 10 * time.Second})
	noErr(t, err, "SubscriptionCreate")
	d := x.subscribe("rs", "d", fromBeginning)
	x.advance(storage.DefaultHeartbeatTimeout + time.Second)
	x.heartbeat(s.ID)
	requireIDs(t, x.maintain(0).Dead, []int64{d.ID}, "DEAD before the restart")
	x.restart()
	got := x.getSub(s.ID)
	equal(t, got.HeartbeatTimeout, 10*time.Second, "heartbeat timeout after the restart")
	equal(t, got.State, storage.Active, "state after the restart")
	equal(t, x.getSub(d.ID).State, storage.Dead, "DEAD after the restart")
	timeEqual(t, got.LastHeartbeatAt, x.now(), "LastHeartbeatAt after the restart")
	x.advance(10*time.Second + time.Millisecond)
	requireIDs(t, x.maintain(0).Dead, []int64{s.ID}, "DEAD a timeout after the restart")
}

func (x *env) configure(p storage.SubscriptionConfigureParams) *storage.Subscription {
	x.t.Helper()
	s, err := x.e.SubscriptionConfigure(x.ctx, &p)
	noErr(x.t, err, "SubscriptionConfigure(%+v)", p)
	return s
}

// testLifeConfigureStart: a group created ahead of its consumers changes its start position until
// it delivers something; then the change is refused and changes nothing.
func testLifeConfigureStart(t *testing.T, x *env) {
	x.createTopic("cs", pubSub(2))
	x.publishN("cs", 0, 2)
	x.publishN("cs", 1, 1)
	s := x.subscribe("cs", "g", storage.StartPosition{})
	x.advance(time.Second)
	up := x.configure(storage.SubscriptionConfigureParams{ID: s.ID, Start: &fromBeginning})
	equal(t, up.Start.Kind, storage.FromBeginning, "start after configure")
	timeEqual(t, up.UpdatedAt, x.now(), "UpdatedAt after configure")
	equal(t, up.HeartbeatTimeout, storage.DefaultHeartbeatTimeout, "heartbeat timeout kept")
	isTrue(t, up.StartOffsets == nil, "StartOffsets given to a caller: %v", up.StartOffsets)
	x.requireStats(s.ID, wantStats{pending: 3, lag: 3}, "stats after FROM_BEGINNING")
	// Back to FROM_NOW, then FROM_MESSAGE_ID: still no progress.
	x.configure(storage.SubscriptionConfigureParams{ID: s.ID, Start: &storage.StartPosition{Kind: storage.FromNow}})
	x.requireStats(s.ID, wantStats{}, "stats after FROM_NOW")
	x.configure(storage.SubscriptionConfigureParams{ID: s.ID, Start: &storage.StartPosition{Kind: storage.FromMessageID, Partition: 0, Offset: 1}})
	// Partition 1's message was published after 0:1, so it is delivered too.
	got := x.claimAll(s.ID, "m")
	equal(t, len(got), 2, "claims after FROM_MESSAGE_ID 0:1: %v", RefsOf(got))

	// Progress: the change is refused and nothing changes.
	_, err := x.e.SubscriptionConfigure(x.ctx, &storage.SubscriptionConfigureParams{ID: s.ID, Start: &fromBeginning})
	errIs(t, err, storage.ErrSubscriptionHasProgress, "new start with a leased message")
	errIs(t, err, storage.ErrInvalidTransition, "ErrSubscriptionHasProgress wraps")
	x.ack(s.ID, "m", ref(0, 1))
	_, err = x.e.SubscriptionConfigure(x.ctx, &storage.SubscriptionConfigureParams{ID: s.ID, Start: &fromBeginning})
	errIs(t, err, storage.ErrSubscriptionHasProgress, "new start after an ack")
	equal(t, x.getSub(s.ID).Start.Kind, storage.FromMessageID, "start after the refused change")
	x.requireStats(s.ID, wantStats{pending: 1, inFlight: 1}, "stats after the refused change")
}

func testLifeConfigureTimeout(t *testing.T, x *env) {
	x.createTopic("ct", pubSub(1))
	x.publishN("ct", 0, 1)
	s := x.subscribe("ct", "g", fromBeginning)
	x.claim(s.ID, "m", 1) // progress does not stop a timeout change
	up := x.configure(storage.SubscriptionConfigureParams{ID: s.ID, HeartbeatTimeout: 10 * time.Second})
	equal(t, up.HeartbeatTimeout, 10*time.Second, "heartbeat timeout")
	equal(t, up.Start.Kind, storage.FromBeginning, "start kept")
	x.advance(10*time.Second + time.Millisecond)
	requireIDs(t, x.maintain(0).Dead, []int64{s.ID}, "DEAD after the new timeout")
	up = x.configure(storage.SubscriptionConfigureParams{ID: s.ID, HeartbeatTimeout: storage.DefaultHeartbeatTimeout})
	equal(t, up.HeartbeatTimeout, storage.DefaultHeartbeatTimeout, "back to the default")
	equal(t, up.State, storage.Dead, "state kept")
}

func testLifeConfigureRefused(t *testing.T, x *env) {
	x.createTopic("cr", pubSub(1))
	x.publishN("cr", 0, 2)
	s := x.subscribe("cr", "g", storage.StartPosition{})
	for _, c := range []struct {
		p    *storage.SubscriptionConfigureParams
		want error
		what string
	}{
		{nil, storage.ErrInvalidArgument, "nil params"},
		{&storage.SubscriptionConfigureParams{ID: s.ID}, storage.ErrInvalidArgument, "nothing to change"},
		{&storage.SubscriptionConfigureParams{ID: s.ID, HeartbeatTimeout: time.Millisecond}, storage.ErrInvalidArgument, "timeout too short"},
		{&storage.SubscriptionConfigureParams{ID: s.ID, Start: &storage.StartPosition{Kind: "SOMEWHERE"}}, storage.ErrInvalidArgument, "bad start kind"},
		{&storage.SubscriptionConfigureParams{ID: s.ID, Start: &storage.StartPosition{Kind: storage.FromMessageID, Offset: 99}}, storage.ErrOffsetOutOfRange, "start above the high-water mark"},
		{&storage.SubscriptionConfigureParams{ID: s.ID, Start: &storage.StartPosition{Kind: storage.FromMessageID, Partition: 3}}, storage.ErrInvalidArgument, "start in a missing partition"},
		{&storage.SubscriptionConfigureParams{ID: 1 << 40, HeartbeatTimeout: time.Minute}, storage.ErrSubscriptionNotFound, "unknown subscription"},
	} {
		_, err := x.e.SubscriptionConfigure(x.ctx, c.p)
		errIs(t, err, c.want, "%s", c.what)
	}
	got := x.getSub(s.ID)
	equal(t, got.Start.Kind, storage.FromNow, "start after refused changes")
	equal(t, got.HeartbeatTimeout, storage.DefaultHeartbeatTimeout, "timeout after refused changes")
	x.requireStats(s.ID, wantStats{}, "stats after refused changes")

	x.setState(s.ID, storage.Cancelled)
	_, err := x.e.SubscriptionConfigure(x.ctx, &storage.SubscriptionConfigureParams{ID: s.ID, HeartbeatTimeout: time.Minute})
	errIs(t, err, storage.ErrInvalidTransition, "configure a CANCELLED subscription")
	eph, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "cr", Ephemeral: true})
	noErr(t, err, "ephemeral subscription")
	_, err = x.e.SubscriptionConfigure(x.ctx, &storage.SubscriptionConfigureParams{ID: eph.ID, HeartbeatTimeout: time.Minute})
	errIs(t, err, storage.ErrInvalidArgument, "configure an ephemeral subscription")
}

// testLifeConfigureRestart: a new start and timeout survive a restart, and progress is still
// known after it.
func testLifeConfigureRestart(t *testing.T, x *env) {
	x.createTopic("crs", pubSub(1))
	x.publishN("crs", 0, 3)
	s := x.subscribe("crs", "g", storage.StartPosition{})
	done := x.subscribe("crs", "done", fromBeginning)
	x.ack(done.ID, "m", RefsOf(x.claimAll(done.ID, "m"))...)
	x.configure(storage.SubscriptionConfigureParams{ID: s.ID, Start: &storage.StartPosition{Kind: storage.FromMessageID, Offset: 1}, HeartbeatTimeout: time.Minute})
	x.restart()
	got := x.getSub(s.ID)
	equal(t, got.Start.Kind, storage.FromMessageID, "start after the restart")
	equal(t, got.HeartbeatTimeout, time.Minute, "timeout after the restart")
	x.requireStats(s.ID, wantStats{pending: 2, lag: 2}, "stats after the restart")
	x.configure(storage.SubscriptionConfigureParams{ID: s.ID, Start: &fromBeginning})
	x.requireStats(s.ID, wantStats{pending: 3, lag: 3}, "no progress after the restart")
	_, err := x.e.SubscriptionConfigure(x.ctx, &storage.SubscriptionConfigureParams{ID: done.ID, Start: &fromBeginning})
	errIs(t, err, storage.ErrSubscriptionHasProgress, "progress after the restart")
}

// testLifeMaintainConcurrent: several callers (broker instances) run SubscriptionsMaintain at the
// same time: every transition is made once and reported by exactly one call, and the final states
// are right (a PAUSED subscription and one heartbeated now are left alone).
func testLifeMaintainConcurrent(t *testing.T, x *env) {
	const retention = time.Hour
	x.createTopic("mc", pubSub(1))
	var wantDead, wantDeleted []int64
	for i := range 6 {
		wantDead = append(wantDead, x.subscribe("mc", fmt.Sprintf("idle-%d", i), fromBeginning).ID)
	}
	for i := range 4 {
		s := x.subscribe("mc", fmt.Sprintf("gone-%d", i), fromBeginning)
		x.setState(s.ID, storage.Cancelled)
		wantDeleted = append(wantDeleted, s.ID)
	}
	paused := x.subscribe("mc", "paused", fromBeginning)
	x.setState(paused.ID, storage.Paused)
	live := x.subscribe("mc", "live", fromBeginning)
	x.advance(max(storage.DefaultHeartbeatTimeout, retention) + time.Second)
	x.heartbeat(live.ID)

	for round := range 3 {
		const callers = 8
		results := make([]*storage.SubscriptionsMaintainResult, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				res, err := x.e.SubscriptionsMaintain(x.ctx, &storage.SubscriptionsMaintainParams{CancelledRetention: retention})
				if err != nil {
					t.Errorf("round %d: SubscriptionsMaintain %d: %v", round, i, err)
					return
				}
				results[i] = res
			})
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			return
		}
		dead, deleted := map[int64]int{}, map[int64]int{}
		for _, res := range results {
			for _, s := range res.Dead {
				dead[s.ID]++
				equal(t, s.State, storage.Dead, "round %d: state of DEAD subscription %d in the result", round, s.ID)
			}
			for _, s := range res.Deleted {
				deleted[s.ID]++
				equal(t, s.State, storage.Deleted, "round %d: state of DELETED subscription %d in the result", round, s.ID)
			}
		}
		if round > 0 {
			// Everything happened in the first round: later ones find nothing to do.
			equal(t, len(dead)+len(deleted), 0, "round %d: transitions reported (dead %v, deleted %v)", round, dead, deleted)
			continue
		}
		requireOnce(t, dead, wantDead, "DEAD")
		requireOnce(t, deleted, wantDeleted, "DELETED")
	}
	for _, id := range wantDead {
		equal(t, x.subState(id), storage.Dead, "final state of %d", id)
	}
	for _, id := range wantDeleted {
		equal(t, x.subState(id), storage.Deleted, "final state of %d", id)
	}
	equal(t, x.subState(paused.ID), storage.Paused, "final state of the PAUSED subscription")
	equal(t, x.subState(live.ID), storage.Active, "final state of the heartbeated subscription")
}

// requireOnce checks that counts holds each of want exactly once and nothing else.
func requireOnce(t *testing.T, counts map[int64]int, want []int64, what string) {
	t.Helper()
	for _, id := range want {
		equal(t, counts[id], 1, "%s reports of subscription %d across the concurrent calls", what, id)
	}
	for id := range counts {
		isTrue(t, slices.Contains(want, id), "%s reported for subscription %d, want only %v", what, id, want)
	}
}

// testLifeHeartbeatRacesMaintain: a heartbeat racing SubscriptionsMaintain past the timeout is
// never lost. Either the heartbeat comes first (the subscription stays ACTIVE, Maintain reports
// nothing) or Maintain does (DEAD) and the heartbeat resurrects it (in its result): the
// subscription ends ACTIVE with the heartbeat's time, and a DEAD report always comes with a
// resurrection.
func testLifeHeartbeatRacesMaintain(t *testing.T, x *env) {
	x.createTopic("hr", pubSub(1))
	var ids []int64
	for i := range 5 {
		ids = append(ids, x.subscribe("hr", fmt.Sprintf("g-%d", i), fromBeginning).ID)
	}
	for round := range 10 {
		x.advance(storage.DefaultHeartbeatTimeout + time.Millisecond)
		var hb *storage.SubscriptionsHeartbeatResult
		var mt *storage.SubscriptionsMaintainResult
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			<-start
			var err error
			if hb, err = x.e.SubscriptionsHeartbeat(x.ctx, &storage.SubscriptionsHeartbeatParams{IDs: ids}); err != nil {
				t.Errorf("round %d: SubscriptionsHeartbeat: %v", round, err)
			}
		})
		wg.Go(func() {
			<-start
			var err error
			if mt, err = x.e.SubscriptionsMaintain(x.ctx, &storage.SubscriptionsMaintainParams{}); err != nil {
				t.Errorf("round %d: SubscriptionsMaintain: %v", round, err)
			}
		})
		close(start)
		wg.Wait()
		if t.Failed() {
			return
		}
		equal(t, hb.Beats, len(ids), "round %d: beats", round)
		dead, back := subIDs(mt.Dead), subIDs(hb.Resurrected)
		for _, id := range ids {
			equal(t, slices.Contains(dead, id), slices.Contains(back, id),
				"round %d: subscription %d DEAD %v but resurrected %v", round, id, dead, back)
			got := x.getSub(id)
			equal(t, got.State, storage.Active, "round %d: state of %d after the race", round, id)
			timeEqual(t, got.LastHeartbeatAt, x.now(), "round %d: LastHeartbeatAt of %d", round, id)
		}
		requireIDs(t, x.maintain(0).Dead, nil, fmt.Sprintf("round %d: Maintain after the race", round))
	}
}

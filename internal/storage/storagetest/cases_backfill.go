package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Backfill (issue 18 item 3): the catch-up range of a late or resurrected group, bounded to the
// newest max_backfill_messages, persisted with the subscription, its progress the ack floors'
// distance into it. Time is the fake clock only.
func backfillCases() []testCase {
	return []testCase{
		{name: "range_at_create", fn: testBackfillRange},
		{name: "bound_keeps_newest", fn: testBackfillBound},
		{name: "progress_and_completed", fn: testBackfillProgress},
		{name: "crash_resume_no_double_delivery", restart: true, fn: testBackfillCrashResume},
		{name: "cancel_resume_skip", restart: true, fn: testBackfillCancelResumeSkip},
		{name: "begin_on_resurrection", fn: testBackfillBegin},
		{name: "queue_never_cut", fn: testBackfillQueue},
		{name: "invalid", fn: testBackfillInvalid},
	}
}

func (x *env) subscribeMax(topic, group string, start storage.StartPosition, maxBackfill int64) *storage.Subscription {
	x.t.Helper()
	s, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: group, Start: start, MaxBackfillMessages: maxBackfill})
	noErr(x.t, err, "SubscriptionCreate(%q, %q, max %d)", topic, group, maxBackfill)
	return s
}

func (x *env) backfill(id int64, action storage.BackfillAction) *storage.SubscriptionBackfillResult {
	x.t.Helper()
	res, err := x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: id, Action: action})
	noErr(x.t, err, "SubscriptionBackfill(%d, %s)", id, action)
	return res
}

// progress is the backfill progress of a subscription from its stored range and its stats.
func (x *env) progress(id int64) storage.BackfillProgress {
	x.t.Helper()
	return x.getSub(id).Backfill.Progress(x.stats(id).Partitions)
}

func requireProgress(t testing.TB, got storage.BackfillProgress, state storage.BackfillState, processed, total, skipped int64, what string) {
	t.Helper()
	if got.State != state || got.Processed != processed || got.Total != total || got.Skipped != skipped {
		t.Fatalf("%s: backfill %s processed %d/%d skipped %d, want %s %d/%d skipped %d",
			what, got.State, got.Processed, got.Total, got.Skipped, state, processed, total, skipped)
	}
}

// testBackfillRange: FROM_BEGINNING gets the range from the first retained message to the log end
// at creation; FROM_NOW none (NOT_STARTED); messages published later are past the range.
func testBackfillRange(t *testing.T, x *env) {
	x.createTopic("br", pubSub(2))
	x.publishN("br", 0, 3)
	x.publishN("br", 1, 2)
	s := x.subscribe("br", "g", fromBeginning)
	isTrue(t, s.Backfill != nil, "FROM_BEGINNING with messages has a backfill")
	equal(t, s.Backfill.State, storage.BackfillInProgress, "state at creation")
	deepEqual(t, s.Backfill.Start, []int64{0, 0}, "range start")
	deepEqual(t, s.Backfill.End, []int64{3, 2}, "range end")
	equal(t, s.Backfill.Total, int64(5), "total")
	equal(t, s.Backfill.MaxMessages, int64(storage.DefaultMaxBackfillMessages), "default bound")
	timeEqual(t, s.Backfill.StartedAt, x.now(), "StartedAt")
	now := x.subscribe("br", "n", storage.StartPosition{})
	isTrue(t, now.Backfill == nil, "FROM_NOW has no backfill: %+v", now.Backfill)
	requireProgress(t, x.progress(now.ID), storage.BackfillNotStarted, 0, 0, 0, "FROM_NOW")
	x.publishN("br", 0, 2)
	requireProgress(t, x.progress(s.ID), storage.BackfillInProgress, 0, 5, 0, "after later publishes")
	got := x.getSub(s.ID).Backfill
	deepEqual(t, got.End, []int64{3, 2}, "range end after later publishes")
}

// testBackfillBound: a range longer than max_backfill_messages keeps the newest: the start rises,
// the cut is counted, the group is never offered the older messages.
func testBackfillBound(t *testing.T, x *env) {
	x.createTopic("bb", pubSub(1))
	x.publishN("bb", 0, 10)
	s := x.subscribeMax("bb", "g", fromBeginning, 4)
	deepEqual(t, s.Backfill.Start, []int64{6}, "cut start")
	equal(t, s.Backfill.Total, int64(4), "total")
	equal(t, s.Backfill.Skipped, int64(6), "skipped")
	x.requireFloor(s.ID, 0, 6, 6, "floor at the cut")
	ds := x.drain(s.ID, "m")
	equal(t, len(ds), 4, "deliveries")
	equal(t, ds[0].Offset, int64(6), "first delivered offset")
	// Two partitions: the cut keeps each partition's newest, in proportion, adding up exactly.
	x.createTopic("bb2", pubSub(2))
	x.publishN("bb2", 0, 6)
	x.publishN("bb2", 1, 2)
	s2 := x.subscribeMax("bb2", "g", fromBeginning, 4)
	deepEqual(t, s2.Backfill.Start, []int64{3, 1}, "cut starts of two partitions")
	equal(t, s2.Backfill.Total, int64(4), "total of two partitions")
	equal(t, s2.Backfill.Skipped, int64(4), "skipped of two partitions")
	// Unlimited keeps everything.
	u := x.subscribeMax("bb", "u", fromBeginning, storage.UnlimitedBackfill)
	equal(t, u.Backfill.Total, int64(10), "unlimited total")
	equal(t, u.Backfill.Skipped, int64(0), "unlimited skipped")
}

// testBackfillProgress: processed follows the ack floor into the range; COMPLETED once the floor
// reaches the end in every partition.
func testBackfillProgress(t *testing.T, x *env) {
	x.createTopic("bp", pubSub(1))
	x.publishN("bp", 0, 4)
	s := x.subscribe("bp", "g", fromBeginning)
	ds := x.claim(s.ID, "m", 3)
	equal(t, len(ds), 3, "claimed")
	requireProgress(t, x.progress(s.ID), storage.BackfillInProgress, 0, 4, 0, "claimed, not acked")
	x.ack(s.ID, "m", ds[1].Ref())
	requireProgress(t, x.progress(s.ID), storage.BackfillInProgress, 0, 4, 0, "acked out of order")
	x.ack(s.ID, "m", ds[0].Ref(), ds[2].Ref())
	requireProgress(t, x.progress(s.ID), storage.BackfillInProgress, 3, 4, 0, "three acked")
	rest := x.claim(s.ID, "m", 10)
	x.ack(s.ID, "m", rest[0].Ref())
	p := x.progress(s.ID)
	requireProgress(t, p, storage.BackfillCompleted, 4, 4, 0, "all acked")
	equal(t, p.Remaining, int64(0), "remaining")
}

// testBackfillCrashResume: the range and its progress survive a restart; what was acked before
// is never delivered again, what was leased comes back (at-least-once), the rest follows.
func testBackfillCrashResume(t *testing.T, x *env) {
	x.createTopic("bc", pubSub(1))
	x.publishN("bc", 0, 20)
	s := x.subscribeMax("bc", "g", fromBeginning, 12)
	ds := x.claim(s.ID, "m", 5)
	equal(t, ds[0].Offset, int64(8), "first backfill delivery")
	x.ack(s.ID, "m", ds[0].Ref(), ds[1].Ref(), ds[2].Ref())
	x.publishN("bc", 0, 3) // past the range
	x.restart()
	got := x.getSub(s.ID)
	isTrue(t, got.Backfill != nil, "backfill after the restart")
	deepEqual(t, got.Backfill.Start, []int64{8}, "range start after the restart")
	deepEqual(t, got.Backfill.End, []int64{20}, "range end after the restart")
	equal(t, got.Backfill.Skipped, int64(8), "skipped after the restart")
	equal(t, got.MaxBackfillMessages, int64(12), "bound after the restart")
	requireProgress(t, x.progress(s.ID), storage.BackfillInProgress, 3, 12, 8, "progress after the restart")
	x.advance(time.Minute) // leases that outlived the restart (PostgreSQL keeps them) expire
	seen := map[int64]int{}
	for _, d := range x.drain(s.ID, "m") {
		seen[d.Offset]++
	}
	for o := int64(8); o < 23; o++ {
		want := 1
		if o < 11 {
			want = 0 // acked before the restart
		}
		equal(t, seen[o], want, "deliveries of offset %d after the restart", o)
	}
	for o := range seen {
		isTrue(t, o >= 11, "offset %d delivered after the restart", o)
	}
	requireProgress(t, x.progress(s.ID), storage.BackfillCompleted, 12, 12, 8, "all acked after the restart")
}

// testBackfillCancelResumeSkip: cancel and resume change the stored state only (and survive a
// restart); skip gives up the rest of the range: floors rise to its end, leases below it end,
// the undone messages are counted.
func testBackfillCancelResumeSkip(t *testing.T, x *env) {
	x.createTopic("bx", pubSub(1))
	x.publishN("bx", 0, 10)
	s := x.subscribe("bx", "g", fromBeginning)
	x.advance(time.Second)
	c := x.backfill(s.ID, storage.BackfillCancel).Subscription
	equal(t, c.Backfill.State, storage.BackfillCancelled, "state after cancel")
	timeEqual(t, c.Backfill.UpdatedAt, x.now(), "UpdatedAt after cancel")
	x.restart()
	equal(t, x.getSub(s.ID).Backfill.State, storage.BackfillCancelled, "cancel after the restart")
	_, err := x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: storage.BackfillCancel})
	errIs(t, err, storage.ErrInvalidTransition, "cancel a CANCELLED backfill")
	r := x.backfill(s.ID, storage.BackfillResume).Subscription
	equal(t, r.Backfill.State, storage.BackfillInProgress, "state after resume")
	ds := x.claim(s.ID, "m", 4)
	x.ack(s.ID, "m", ds[0].Ref(), ds[1].Ref())
	res := x.backfill(s.ID, storage.BackfillSkip)
	equal(t, res.Skipped, int64(8), "skipped by skip (2 leased, 6 never delivered)")
	equal(t, res.Subscription.Backfill.State, storage.BackfillCancelled, "state after skip")
	x.requireFloor(s.ID, 0, 10, 10, "floor after skip")
	ack := x.ack(s.ID, "m", ds[2].Ref())
	equal(t, ack.AlreadyDone, 1, "ack of a lease the skip ended")
	x.restart()
	requireProgress(t, x.progress(s.ID), storage.BackfillCancelled, 10, 10, 8, "after skip and restart")
	x.publishN("bx", 0, 1)
	ds = x.drain(s.ID, "m")
	equal(t, len(ds), 1, "deliveries after skip")
	equal(t, ds[0].Offset, int64(10), "offset after skip")
}

// testBackfillBegin: a resurrected group's new range runs from its ack floor to the log end,
// cut to its bound; without messages missed the last range stays.
func testBackfillBegin(t *testing.T, x *env) {
	x.createTopic("bg", pubSub(1))
	s := x.subscribeMax("bg", "g", storage.StartPosition{}, 5)
	isTrue(t, s.Backfill == nil, "no backfill at creation")
	res := x.backfill(s.ID, storage.BackfillBegin)
	isTrue(t, res.Subscription.Backfill == nil, "begin with nothing missed: still none")
	x.publishN("bg", 0, 2)
	x.drain(s.ID, "m")
	x.advance(storage.DefaultHeartbeatTimeout + time.Second)
	requireIDs(t, x.maintain(0).Dead, []int64{s.ID}, "DEAD")
	x.publishN("bg", 0, 9)
	x.setState(s.ID, storage.Active)
	res = x.backfill(s.ID, storage.BackfillBegin)
	bf := res.Subscription.Backfill
	deepEqual(t, bf.Start, []int64{6}, "resurrection range start")
	deepEqual(t, bf.End, []int64{11}, "resurrection range end")
	equal(t, bf.Skipped, int64(4), "resurrection skipped")
	equal(t, res.Skipped, int64(4), "result skipped")
	x.requireFloor(s.ID, 0, 6, 6, "floor after begin")
	// A bound given to begin overrides the subscription's.
	x.publishN("bg", 0, 3)
	res, err := x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: storage.BackfillBegin, MaxMessages: 1})
	noErr(t, err, "begin with a bound")
	deepEqual(t, res.Subscription.Backfill.Start, []int64{13}, "range start with bound 1")
	equal(t, len(x.drain(s.ID, "m")), 1, "deliveries after begin with bound 1")
}

// testBackfillInvalid: bad parameters are refused and change nothing.
func testBackfillInvalid(t *testing.T, x *env) {
	x.createTopic("bi", pubSub(1))
	x.publishN("bi", 0, 3)
	_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "bi", Group: "g", Start: fromBeginning, MaxBackfillMessages: -2})
	errIs(t, err, storage.ErrInvalidArgument, "max_backfill_messages -2")
	s := x.subscribe("bi", "g", fromBeginning)
	_, err = x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: "rewind"})
	errIs(t, err, storage.ErrInvalidArgument, "unknown action")
	_, err = x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: storage.BackfillResume})
	errIs(t, err, storage.ErrInvalidTransition, "resume an IN_PROGRESS backfill")
	_, err = x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: 999999, Action: storage.BackfillCancel})
	errIs(t, err, storage.ErrSubscriptionNotFound, "unknown subscription")
	n := x.subscribe("bi", "n", storage.StartPosition{})
	_, err = x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: n.ID, Action: storage.BackfillCancel})
	errIs(t, err, storage.ErrInvalidTransition, "cancel without a backfill")
	x.setState(s.ID, storage.Cancelled)
	_, err = x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: storage.BackfillBegin})
	errIs(t, err, storage.ErrSubscriptionNotActive, "begin on a CANCELLED subscription")
	equal(t, x.getSub(n.ID).Backfill == nil, true, "nothing changed")
}

// testBackfillQueue: a QUEUE topic's subscription never gets a backfill: its backlog is its work,
// never cut nor paced, also when recreated after a cancel or after being DEAD.
func testBackfillQueue(t *testing.T, x *env) {
	x.createTopic("bq", storage.TopicConfig{})
	x.publishN("bq", 0, 5)
	q := x.queueSub("bq")
	x.setState(q.ID, storage.Cancelled)
	s, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "bq", Start: fromBeginning, MaxBackfillMessages: 2})
	noErr(t, err, "recreate the queue subscription")
	isTrue(t, s.Backfill == nil, "queue subscription with a backfill: %+v", s.Backfill)
	x.requireStats(s.ID, wantStats{pending: 5, lag: 5}, "queue backlog kept")
	res, err := x.e.SubscriptionBackfill(x.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: storage.BackfillBegin, MaxMessages: 1})
	noErr(t, err, "begin on a queue")
	isTrue(t, res.Subscription.Backfill == nil && res.Skipped == 0, "begin on a queue: %+v, skipped %d", res.Subscription.Backfill, res.Skipped)
	x.requireStats(s.ID, wantStats{pending: 5, lag: 5}, "queue backlog after begin")
}

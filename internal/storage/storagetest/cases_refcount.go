package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Completion tracking refcount (issue 18 item 4, BRIEF.md section 4): a message waits for the
// subscriptions live at its publish; DEAD groups leave the set of pending messages, joining ones
// are added to pending messages only; completed messages are never touched; the per-message,
// per-group completion record is queryable. Time is the fake clock only.
func refcountCases() []testCase {
	return []testCase{
		{name: "waits_for_groups_live_at_publish", fn: testRefcountLiveAtPublish},
		{name: "later_group_skips_completed", fn: testRefcountLaterGroup},
		{name: "dead_group_removed_from_pending", fn: testRefcountDeadGroup},
		{name: "completed_removed_never_rewritten", fn: testRefcountNeverRewritten},
		{name: "out_of_order_completions_skipped", fn: testRefcountOutOfOrder},
		{name: "dead_lettered", fn: testRefcountDeadLettered},
		{name: "pubsub_to_queue_joins", fn: testRefcountToQueue},
		{name: "mode_switch", fn: testRefcountModeSwitch},
		{name: "restart_keeps_records", restart: true, fn: testRefcountRestart},
	}
}

func refcountTopic(partitions int) storage.TopicConfig {
	cfg := pubSub(partitions)
	cfg.CompletionTracking = storage.Refcount
	cfg.MessageRetention = time.Hour
	return cfg
}

// completion returns the completion record of offset o of partition 0 of topic.
func (x *env) completion(topic string, o int64) (*storage.MessageCompletion, error) {
	x.t.Helper()
	a, ok := x.rec.engine().(storage.CompletionAuditor)
	isTrue(x.t, ok, "the engine does not implement storage.CompletionAuditor")
	return a.MessageCompletion(x.ctx, &storage.MessageCompletionParams{Topic: topic, Partition: 0, Offset: o})
}

// want is one group's expected entry: its state and time (zero: none).
type want struct {
	sub   int64
	state storage.CompletionState
	at    time.Time
}

// requireCompletion checks the completion record of offset o: complete, and exactly the groups of
// ws in order.
func (x *env) requireCompletion(topic string, o int64, complete bool, ws ...want) *storage.MessageCompletion {
	x.t.Helper()
	mc, err := x.completion(topic, o)
	noErr(x.t, err, "MessageCompletion(%q, %d)", topic, o)
	x.t.Logf("completion of %s/%d: %+v", topic, o, *mc)
	equal(x.t, mc.Offset, o, "offset")
	equal(x.t, mc.Complete, complete, "complete of offset %d", o)
	equal(x.t, len(mc.Groups), len(ws), "groups in the record of offset %d (%+v)", o, mc.Groups)
	for i, w := range ws {
		g := mc.Groups[i]
		equal(x.t, g.SubscriptionID, w.sub, "offset %d group %d: subscription", o, i)
		equal(x.t, g.State, w.state, "offset %d subscription %d: state", o, w.sub)
		timeEqual(x.t, g.At, w.at, "offset %d subscription %d: time", o, w.sub)
	}
	return mc
}

var fromNow = storage.StartPosition{Kind: storage.FromNow}

func testRefcountLiveAtPublish(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromNow)
	b := x.subscribe("rc", "b", fromNow)
	x.publishN("rc", 0, 1)
	x.advance(time.Second)
	c := x.subscribe("rc", "c", fromNow)
	x.publishN("rc", 0, 1)
	x.requireCompletion("rc", 0, false, want{a.ID, storage.CompletionPending, time.Time{}}, want{b.ID, storage.CompletionPending, time.Time{}})

	aAt := x.advance(time.Second)
	x.drain(a.ID, "m")
	x.requireCompletion("rc", 0, false, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionPending, time.Time{}})
	bAt := x.advance(time.Second)
	requireOffsets(t, x.drain(b.ID, "m"), []int64{0, 1}, "b")
	// c joined after offset 0 was published: not in its set, also not once everyone acked it.
	x.requireCompletion("rc", 0, true, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionAcked, bAt})
	x.requireCompletion("rc", 1, false, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionAcked, bAt},
		want{c.ID, storage.CompletionPending, time.Time{}})
}

func testRefcountLaterGroup(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromBeginning)
	x.publishN("rc", 0, 3)
	at := x.advance(time.Second)
	x.drain(a.ID, "m")
	// FROM_BEGINNING on a refcount topic: added to the pending messages only, and there are none.
	c := x.subscribe("rc", "c", fromBeginning)
	requireOffsets(t, x.claimAll(c.ID, "m"), nil, "the later group claims the completed messages")
	x.requireCompletion("rc", 1, true, want{a.ID, storage.CompletionAcked, at})

	// It does not hold them: retention removes them after message_retention (on a watermark topic
	// c's ack floor would keep them).
	x.advance(2 * time.Hour)
	x.heartbeat(a.ID, c.ID)
	res, removed := x.retention("rc")
	equal(t, removed, 3, "messages removed")
	equal(t, res.MessagesExpired, 0, "messages expired")
	_, err := x.completion("rc", 1)
	errIs(t, err, storage.ErrOffsetOutOfRange, "completion record of a removed message")

	// A joining group is added to the pending messages only: 6 waits for c, not 3 to 5.
	x.publishN("rc", 0, 3)
	x.drain(a.ID, "m")
	requireOffsets(t, x.drain(c.ID, "m"), []int64{3, 4, 5}, "the FROM_BEGINNING group joined before")
	x.publishN("rc", 0, 1)
	at2 := x.advance(time.Second)
	requireOffsets(t, x.drain(a.ID, "m"), []int64{6}, "a")
	d := x.subscribe("rc", "d", fromBeginning)
	requireOffsets(t, x.claimAll(d.ID, "m"), []int64{6}, "the later group claims the pending message")
	x.requireCompletion("rc", 6, false, want{a.ID, storage.CompletionAcked, at2},
		want{c.ID, storage.CompletionPending, time.Time{}}, want{d.ID, storage.CompletionPending, time.Time{}})
}

func testRefcountDeadGroup(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromNow)
	b := x.subscribe("rc", "b", fromNow)
	x.publishN("rc", 0, 1)
	aAt := x.advance(time.Second)
	x.drain(a.ID, "m")
	x.requireCompletion("rc", 0, false, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionPending, time.Time{}})

	x.advance(storage.DefaultHeartbeatTimeout)
	x.heartbeat(a.ID)
	deadAt := x.advance(time.Second)
	requireIDs(t, x.maintain(0).Dead, []int64{b.ID}, "DEAD")
	// Dropped from the pending message: it is complete.
	x.requireCompletion("rc", 0, true, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionRemoved, deadAt})
	// Published while b is DEAD: not in its set.
	x.advance(time.Second)
	x.publishN("rc", 0, 1)
	x.requireCompletion("rc", 1, false, want{a.ID, storage.CompletionPending, time.Time{}})

	// Back: b is added to the pending message only, the completed one stays as it was.
	requireIDs(t, x.heartbeat(b.ID).Resurrected, []int64{b.ID}, "resurrected")
	requireOffsets(t, x.claimAll(b.ID, "m"), []int64{1}, "claims of the group back from DEAD")
	x.requireCompletion("rc", 0, true, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionRemoved, deadAt})
	x.requireCompletion("rc", 1, false, want{a.ID, storage.CompletionPending, time.Time{}}, want{b.ID, storage.CompletionPending, time.Time{}})

	// Retention removes the completed message (the DEAD group did not hold it), not the pending one.
	x.advance(2 * time.Hour)
	x.heartbeat(a.ID, b.ID)
	x.retention("rc")
	_, err := x.completion("rc", 1)
	noErr(t, err, "completion of the pending message after retention")
}

func testRefcountNeverRewritten(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromNow)
	b := x.subscribe("rc", "b", fromNow)
	x.publishN("rc", 0, 2)
	at := x.advance(time.Second)
	x.drain(a.ID, "m")
	x.drain(b.ID, "m")
	complete := []want{{a.ID, storage.CompletionAcked, at}, {b.ID, storage.CompletionAcked, at}}
	x.requireCompletion("rc", 0, true, complete...)

	// Groups come and go: the completed messages keep their record and get no group.
	x.advance(storage.DefaultHeartbeatTimeout + time.Second)
	x.heartbeat(a.ID)
	requireIDs(t, x.maintain(0).Dead, []int64{b.ID}, "DEAD")
	x.setState(a.ID, storage.Cancelled)
	c := x.subscribe("rc", "c", fromBeginning)
	requireOffsets(t, x.claimAll(c.ID, "m"), nil, "claims of a group joining after completion")
	x.heartbeat(b.ID)
	requireOffsets(t, x.claimAll(b.ID, "m"), nil, "claims of the group back from DEAD")
	for o := range int64(2) {
		x.requireCompletion("rc", o, true, complete...)
	}
	x.advance(2 * time.Hour)
	x.heartbeat(b.ID, c.ID)
	res, removed := x.retention("rc")
	equal(t, removed, 2, "completed messages removed")
	equal(t, res.MessagesExpired, 0, "expired")
}

func testRefcountDeadLettered(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromNow)
	x.publishN("rc", 0, 1)
	at := x.advance(time.Second)
	ds := x.claimAll(a.ID, "m")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: a.ID, Member: "m", Refs: RefsOf(ds), ToDLQ: true, Reason: "bad"})
	x.requireCompletion("rc", 0, true, want{a.ID, storage.CompletionDeadLettered, at})
}

func testRefcountModeSwitch(t *testing.T, x *env) {
	x.createTopic("wm", pubSub(1))
	x.createTopic("empty", pubSub(1))
	x.publishN("wm", 0, 1)
	_, err := x.completion("wm", 0)
	errIs(t, err, storage.ErrInvalidArgument, "completion record on a watermark topic")
	_, err = x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "wm", Config: refcountTopic(1)})
	errIs(t, err, storage.ErrCompletionTrackingChange, "switching a topic with messages")
	equal(t, x.getTopic("wm").Config.CompletionTracking, storage.Watermark, "mode after the refused switch")
	up := x.updateTopic(storage.TopicUpdateParams{Name: "empty", Config: refcountTopic(1)})
	equal(t, up.Config.CompletionTracking, storage.Refcount, "mode of an empty topic after the switch")
	x.createTopic("rc", refcountTopic(1))
	x.publishN("rc", 0, 1)
	_, err = x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "rc", Config: pubSub(1)})
	errIs(t, err, storage.ErrCompletionTrackingChange, "switching back with messages")
	_, err = x.completion("rc", 1)
	errIs(t, err, storage.ErrOffsetOutOfRange, "completion record above the high-water mark")
}

func testRefcountRestart(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromNow)
	b := x.subscribe("rc", "b", fromNow)
	x.publishN("rc", 0, 3)
	aAt := x.advance(time.Second)
	x.drain(a.ID, "m")
	ds := x.claimAll(b.ID, "m")
	bAt := x.advance(time.Second)
	x.nack(storage.DeliveriesNackParams{SubscriptionID: b.ID, Member: "m", Refs: RefsOf(ds[:1]), ToDLQ: true})
	x.advance(storage.DefaultHeartbeatTimeout)
	x.heartbeat(a.ID)
	deadAt := x.advance(time.Second)
	requireIDs(t, x.maintain(0).Dead, []int64{b.ID}, "DEAD")
	x.heartbeat(b.ID) // back: skips 1 and 2, completed by a while it was away
	check := func(what string) {
		t.Helper()
		t.Log(what)
		x.requireCompletion("rc", 0, true, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionDeadLettered, bAt})
		x.requireCompletion("rc", 2, true, want{a.ID, storage.CompletionAcked, aAt}, want{b.ID, storage.CompletionRemoved, deadAt})
	}
	check("before the restart")
	x.restart()
	check("after the restart")
}

// testRefcountOutOfOrder: messages completed out of order (above a live ack floor) are complete
// too: a joining group, new or back from DEAD, is added to the pending message below them only.
func testRefcountOutOfOrder(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromNow)
	b := x.subscribe("rc", "b", fromNow)
	x.publishN("rc", 0, 4)
	requireOffsets(t, x.claimAll(a.ID, "m"), []int64{0, 1, 2, 3}, "a")
	x.advance(storage.DefaultHeartbeatTimeout)
	x.heartbeat(a.ID)
	deadAt := x.advance(time.Second)
	requireIDs(t, x.maintain(0).Dead, []int64{b.ID}, "DEAD")
	at := x.advance(time.Second)
	x.ack(a.ID, "m", storage.DeliveryRef{Partition: 0, Offset: 1}, storage.DeliveryRef{Partition: 0, Offset: 3})

	// b comes back: added to 0 and 2 (a has not done them), not to 1 and 3.
	x.heartbeat(b.ID)
	requireOffsets(t, x.claimAll(b.ID, "m"), []int64{0, 2}, "claims of the group back from DEAD")
	x.requireCompletion("rc", 1, true, want{a.ID, storage.CompletionAcked, at}, want{b.ID, storage.CompletionRemoved, deadAt})
	x.requireCompletion("rc", 2, false, want{a.ID, storage.CompletionPending, time.Time{}}, want{b.ID, storage.CompletionPending, time.Time{}})
	// c joins FROM_BEGINNING: the same.
	c := x.subscribe("rc", "c", fromBeginning)
	requireOffsets(t, x.claimAll(c.ID, "m"), []int64{0, 2}, "claims of the new group")
	x.requireCompletion("rc", 3, true, want{a.ID, storage.CompletionAcked, at}, want{b.ID, storage.CompletionRemoved, deadAt})
	x.requireCompletion("rc", 0, false, want{a.ID, storage.CompletionPending, time.Time{}},
		want{b.ID, storage.CompletionPending, time.Time{}}, want{c.ID, storage.CompletionPending, time.Time{}})
	if x.caps.Restart {
		x.restart()
		x.requireCompletion("rc", 3, true, want{a.ID, storage.CompletionAcked, at}, want{b.ID, storage.CompletionRemoved, deadAt})
		// Once the leases expired (and their backoff elapsed), 0 and 2 come again; 1 and 3 stay
		// skipped.
		x.advance(2 * time.Minute)
		requireOffsets(t, x.claimAll(c.ID, "m"), []int64{0, 2}, "claims of the new group after a restart")
		requireOffsets(t, x.claimAll(b.ID, "m"), []int64{0, 2}, "claims of the group back from DEAD after a restart")
	}
}

// testRefcountToQueue: the queue subscription that PUB_SUB to QUEUE creates (no live group left)
// joins like any group: added to the message nobody completed, not to the one the DEAD group did.
func testRefcountToQueue(t *testing.T, x *env) {
	x.createTopic("rc", refcountTopic(1))
	a := x.subscribe("rc", "a", fromNow)
	x.publishN("rc", 0, 2)
	ds := x.claim(a.ID, "m", 1)
	x.ack(a.ID, "m", RefsOf(ds)...)
	x.advance(storage.DefaultHeartbeatTimeout + time.Second)
	requireIDs(t, x.maintain(0).Dead, []int64{a.ID}, "DEAD")
	cfg := refcountTopic(1)
	cfg.Semantics = storage.Queue
	x.updateTopic(storage.TopicUpdateParams{Name: "rc", Config: cfg})
	q := x.queueSub("rc")
	requireOffsets(t, x.claimAll(q.ID, "m"), []int64{1}, "claims of the new queue subscription")
}

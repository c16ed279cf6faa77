package storagetest

import (
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func notifyCases() []testCase {
	return []testCase{
		{name: "register_unregister", fn: testNotify},
		{name: "subscription_changes", fn: testNotifySubscription},
	}
}

func retentionCases() []testCase {
	cases := []testCase{
		{name: "keeps_what_subscriptions_need", fn: testRetentionKeeps},
		{name: "zero_subscription_retention_keeps", fn: testRetentionZeroSubscriptions},
		{name: "max_retention_removes_everything_old", fn: testRetentionMaxStrict},
		{name: "max_retention_keeps_younger", fn: testRetentionMaxKeepsYounger},
		{name: "backlog_zero_after_healthy_runs", fn: testRetentionBacklogZero},
	}
	cases = append(cases, zombieCases()...)
	cases = append(cases, sizeCases()...)
	return append(cases, shortRetentionCases()...)
}

// notifyRecorder collects notifications; its callback never blocks.
type notifyRecorder struct {
	ch chan storage.Notification

	mu  sync.Mutex
	got []storage.Notification
}

func newNotifyRecorder() *notifyRecorder {
	return &notifyRecorder{ch: make(chan storage.Notification, 4096)}
}

func (r *notifyRecorder) fn(n storage.Notification) {
	r.mu.Lock()
	r.got = append(r.got, n)
	r.mu.Unlock()
	select {
	case r.ch <- n:
	default:
	}
}

func (r *notifyRecorder) sawTopic(topic string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.got {
		if n.Topic == topic {
			return true
		}
	}
	return false
}

// await waits (up to 10 s: notifications may be asynchronous, on PostgreSQL they travel through
// the database) for a notification of kind about topic, skipping others (they may be spurious or
// coalesced).
func (r *notifyRecorder) await(t *testing.T, kind storage.NotificationKind, topic, what string) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		select {
		case n := <-r.ch:
			if n.Kind == kind && n.Topic == topic {
				return
			}
		case <-timer.C:
			t.Fatalf("%s: no notification {kind %d, topic %q} within 10 s", what, kind, topic)
		}
	}
}

func testNotify(t *testing.T, x *env) {
	r1 := newNotifyRecorder()
	unregister1 := x.e.NotifyRegister(r1.fn)
	x.createTopic("n.first", pubSub(1))
	r1.await(t, storage.NotifyTopicCreated, "n.first", "TopicCreate")
	x.publish("n.first", msg("a"))
	r1.await(t, storage.NotifyMessages, "n.first", "MessagesAppend")
	x.createTopic("n.queue", storage.TopicConfig{})
	r1.await(t, storage.NotifyTopicCreated, "n.queue", "TopicCreate of a QUEUE topic")
	x.publish("n.queue", msg("b"), msg("c"))
	r1.await(t, storage.NotifyMessages, "n.queue", "MessagesAppend of a batch")

	r2 := newNotifyRecorder()
	unregister2 := x.e.NotifyRegister(r2.fn)
	defer unregister2()
	unregister1()
	x.createTopic("n.after", pubSub(1))
	r2.await(t, storage.NotifyTopicCreated, "n.after", "TopicCreate seen by the second callback")
	x.publish("n.after", msg("d"))
	r2.await(t, storage.NotifyMessages, "n.after", "MessagesAppend seen by the second callback")
	x.publish("n.first", msg("e"))
	r2.await(t, storage.NotifyMessages, "n.first", "MessagesAppend to the first topic seen by the second callback")
	isTrue(t, !r1.sawTopic("n.after"), "an unregistered callback was called for a topic created after unregister")
}

// awaitSub waits (as await) for a NotifySubscription of subscription id of topic.
func (r *notifyRecorder) awaitSub(t *testing.T, topic string, id int64, what string) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		select {
		case n := <-r.ch:
			if n.Kind == storage.NotifySubscription && n.Topic == topic && n.SubscriptionID == id {
				return
			}
		case <-timer.C:
			t.Fatalf("%s: no notification of subscription %d of %q within 10 s", what, id, topic)
		}
	}
}

// subNotifications counts the NotifySubscription notifications received for subscription id.
func (r *notifyRecorder) subNotifications(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.got {
		if x.Kind == storage.NotifySubscription && x.SubscriptionID == id {
			n++
		}
	}
	return n
}

// testNotifySubscription: every change of a subscription's state (SubscriptionUpdate,
// SubscriptionsHeartbeat resurrecting it, SubscriptionsMaintain making it DEAD,
// SubscriptionDelete) and the rename of a semantics change notify NotifySubscription with its
// topic and id, once per change: never for deliveries, nor for a heartbeat that changes nothing.
func testNotifySubscription(t *testing.T, x *env) {
	r := newNotifyRecorder()
	defer x.e.NotifyRegister(r.fn)()
	x.createTopic("ns.t", pubSub(1))
	s := x.subscribe("ns.t", "g", storage.StartPosition{})
	changes := 0
	for _, st := range []storage.SubscriptionState{storage.Paused, storage.Active, storage.Dead} {
		x.setState(s.ID, st)
		r.awaitSub(t, "ns.t", s.ID, "SubscriptionUpdate to "+string(st))
		changes++
	}
	beat := func() *storage.SubscriptionsHeartbeatResult {
		t.Helper()
		res, err := x.e.SubscriptionsHeartbeat(x.ctx, &storage.SubscriptionsHeartbeatParams{IDs: []int64{s.ID}})
		noErr(t, err, "SubscriptionsHeartbeat")
		return res
	}
	equal(t, len(beat().Resurrected), 1, "subscriptions the heartbeat resurrected")
	r.awaitSub(t, "ns.t", s.ID, "SubscriptionsHeartbeat resurrecting it")
	changes++
	// Deliveries and a heartbeat of an ACTIVE subscription change no state: nothing is sent.
	x.publish("ns.t", msg("a"))
	for _, d := range x.claim(s.ID, "m", 10) {
		_, err := x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: s.ID, Member: "m", Refs: []storage.DeliveryRef{d.Ref()}})
		noErr(t, err, "DeliveriesAck")
	}
	equal(t, len(beat().Resurrected), 0, "subscriptions a heartbeat of an ACTIVE one resurrected")
	x.advance(storage.DefaultHeartbeatTimeout + time.Second)
	res := x.maintain(0)
	isTrue(t, len(res.Dead) == 1 && res.Dead[0].ID == s.ID, "SubscriptionsMaintain made %+v DEAD, want subscription %d", res.Dead, s.ID)
	r.awaitSub(t, "ns.t", s.ID, "SubscriptionsMaintain making it DEAD")
	changes++
	x.setState(s.ID, storage.Cancelled)
	r.awaitSub(t, "ns.t", s.ID, "SubscriptionUpdate to CANCELLED")
	changes++
	noErr(t, x.e.SubscriptionDelete(x.ctx, s.ID), "SubscriptionDelete")
	r.awaitSub(t, "ns.t", s.ID, "SubscriptionDelete")
	changes++
	equal(t, r.subNotifications(s.ID), changes, "notifications of subscription %d", s.ID)

	x.createTopic("ns.q", storage.TopicConfig{Semantics: storage.Queue})
	q := x.queueSub("ns.q")
	x.updateTopic(storage.TopicUpdateParams{Name: "ns.q", Config: pubSub(1), QueueToGroup: "h"})
	r.awaitSub(t, "ns.q", q.ID, "TopicUpdate renaming the queue subscription")
	equal(t, r.subNotifications(q.ID), 1, "notifications of subscription %d", q.ID)
}

// retention runs RetentionApply and checks that its counts match the change of the low offsets of
// every topic in the store: what was removed was counted, and nothing else. It returns the result
// and the number of messages removed from the named topic.
func (x *env) retention(topic string) (*storage.RetentionResult, int64) {
	x.t.Helper()
	all, err := x.e.TopicList(x.ctx)
	noErr(x.t, err, "TopicList")
	before := map[string][]int64{}
	for _, tp := range all {
		before[tp.Name] = x.lowOffsets(tp.Name)
	}
	res, err := x.e.RetentionApply(x.ctx)
	noErr(x.t, err, "RetentionApply")
	isTrue(x.t, res.MessagesDeleted >= 0 && res.MessagesExpired >= 0 && res.DLQEntriesExpired >= 0 && res.BytesDeleted >= 0 && res.Backlog >= 0,
		"negative retention counts: %+v", *res)
	var removed, removedHere int64
	for name, low := range before {
		after := x.lowOffsets(name)
		for p := range after {
			isTrue(x.t, after[p] >= low[p], "topic %q partition %d: low offset went back from %d to %d", name, p, low[p], after[p])
			removed += after[p] - low[p]
			if name == topic {
				removedHere += after[p] - low[p]
			}
		}
	}
	equal(x.t, res.MessagesDeleted+res.MessagesExpired, removed, "deleted + expired messages = messages removed from the logs (%+v)", *res)
	x.checkExpired(res)
	if removed > 0 {
		isTrue(x.t, res.BytesDeleted > 0, "messages removed but BytesDeleted is %d", res.BytesDeleted)
	}
	x.t.Logf("RetentionApply at %s: %+v", fmtTime(x.now()), *res)
	return res, removedHere
}

func (x *env) lowOffsets(topic string) []int64 {
	x.t.Helper()
	st := x.topicStats(topic)
	low := make([]int64, len(st.Partitions))
	for _, p := range st.Partitions {
		low[p.Partition] = p.LowOffset
	}
	return low
}

// testRetentionKeeps: RetentionApply may delete completed messages older than message_retention
// (engines delete whole segments, so they may keep more), but never one that a subscription holding
// retention (ACTIVE or PAUSED) has not completed, within max_retention.
func testRetentionKeeps(t *testing.T, x *env) {
	x.createTopic("ret", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Hour, MaxRetention: 48 * time.Hour})
	a := x.subscribe("ret", "a", fromBeginning)
	b := x.subscribe("ret", "b", fromBeginning)
	for range 10 {
		x.publishN("ret", 0, 20)
		x.advance(time.Second)
	}
	acked := func(s *storage.Subscription, n int) {
		x.t.Helper()
		ds := x.claimAll(s.ID, "m")
		equal(t, len(ds), 200, "claimed")
		var refs []storage.DeliveryRef
		for _, d := range ds[:n] {
			refs = append(refs, d.Ref())
		}
		equal(t, x.ack(s.ID, "m", refs...).Acked, n, "acked")
	}
	acked(a, 150)
	acked(b, 60)
	x.setState(b.ID, storage.Paused)

	x.advance(2 * time.Hour)
	res, _ := x.retention("ret")
	equal(t, res.MessagesExpired, int64(0), "nothing is past max_retention")
	low := x.lowOffsets("ret")[0]
	isTrue(t, low <= 60, "low offset %d: messages paused subscription b has not acked (60..199) must be kept", low)
	deepEqual(t, msgOffsets(x.read("ret", 0, 60)), span(60, 200), "messages from b's floor on are readable")
	requireOffsets(t, x.claimAll(a.ID, "m"), span(150, 200), "a gets its unacked messages again")
	x.setState(b.ID, storage.Active)
	requireOffsets(t, x.claimAll(b.ID, "m"), span(60, 200), "b gets its unacked messages again")

	// Once b is cancelled and a completed everything, all of it may go (but need not).
	x.setState(b.ID, storage.Cancelled)
	x.ack(a.ID, "m", refSpan(0, 150, 200)...)
	x.advance(2 * time.Hour)
	res, _ = x.retention("ret")
	equal(t, res.MessagesExpired, int64(0), "completed messages are deleted, not expired")
	x.publishN("ret", 0, 1)
	requireOffsets(t, x.claimAll(a.ID, "m"), []int64{200}, "offsets continue after retention")
}

// testRetentionBacklogZero: RetentionResult.Backlog (what a run found removable and left stored)
// is 0 after runs whose removals all succeed: with messages spread over hours (several segments
// or buckets), with a partition held by a subscription (not removable: not backlog), after a
// topic was deleted, and once everything is completed. A backlog above 0 needs a removal that
// fails or is blocked: each engine's own tests show it (wal: a segment that cannot be sealed;
// pgstore: a bucket drop blocked by the bucket lock).
func testRetentionBacklogZero(t *testing.T, x *env) {
	x.createTopic("bl", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MessageRetention: time.Minute, MaxRetention: 48 * time.Hour})
	x.createTopic("bl.gone", storage.TopicConfig{Semantics: storage.PubSub, ZeroSubscriptionRetention: 48 * time.Hour})
	a := x.subscribe("bl", "a", fromBeginning)
	x.publishN("bl.gone", 0, 5)
	for range 4 {
		x.publishN("bl", 0, 10)
		x.publishN("bl", 1, 10)
		x.advance(time.Hour)
	}
	res, _ := x.retention("bl")
	equal(t, res.Backlog, int64(0), "backlog with nothing completed")

	var p0, p1 []storage.DeliveryRef
	for _, d := range x.claimAll(a.ID, "m") {
		if d.Partition == 0 {
			p0 = append(p0, d.Ref())
		} else {
			p1 = append(p1, d.Ref())
		}
	}
	equal(t, len(p0)+len(p1), 80, "claimed")
	x.ack(a.ID, "m", p0...)
	x.advance(2 * time.Hour)
	res, removed := x.retention("bl")
	isTrue(t, removed > 0, "nothing removed of partition 0, completed and older than message_retention")
	equal(t, res.Backlog, int64(0), "backlog with partition 1 held by a")
	equal(t, x.lowOffsets("bl")[1], int64(0), "partition 1's low offset")

	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "bl.gone", Force: true}), "TopicDelete")
	x.ack(a.ID, "m", p1...)
	x.advance(2 * time.Hour)
	res, _ = x.retention("bl")
	equal(t, res.Backlog, int64(0), "backlog after a topic was deleted and everything completed")
	deepEqual(t, x.lowOffsets("bl"), []int64{40, 40}, "everything completed is gone")
	x.advance(2 * time.Hour)
	res, _ = x.retention("bl")
	equal(t, res.Backlog, int64(0), "backlog of a run with nothing to remove")
}

// testRetentionZeroSubscriptions: a PUB_SUB topic without subscriptions keeps its messages for
// zero_subscription_retention, so a group subscribing FROM_BEGINNING within that time gets them.
func testRetentionZeroSubscriptions(t *testing.T, x *env) {
	x.createTopic("zero", storage.TopicConfig{Semantics: storage.PubSub, ZeroSubscriptionRetention: time.Hour, MessageRetention: 2 * time.Hour})
	x.publishN("zero", 0, 10)
	x.advance(30 * time.Minute)
	res, removed := x.retention("zero")
	equal(t, removed, int64(0), "messages removed within zero_subscription_retention")
	equal(t, res.MessagesExpired, int64(0), "expired")
	s := x.subscribe("zero", "late", fromBeginning)
	requireOffsets(t, x.drain(s.ID, "m"), span(0, 10), "a late group gets everything")
}

// testRetentionMaxStrict: when every message of a topic is older than max_retention, RetentionApply
// removes all of them (an engine that deletes whole segments must seal its active segment to do
// so), counts every one a holding subscription had not completed as expired, and moves every
// subscription past them; DLQ entries older than max_retention are removed and counted. Offsets
// continue where they were.
func testRetentionMaxStrict(t *testing.T, x *env) {
	x.createTopic("cap", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MessageRetention: time.Hour, MaxRetention: 2 * time.Hour})
	a := x.subscribe("cap", "a", fromBeginning)
	p := x.subscribe("cap", "p", fromBeginning)
	x.publishN("cap", 0, 12)
	x.publishN("cap", 1, 8)
	ds := x.claimAll(a.ID, "m")
	equal(t, len(ds), 20, "a claimed everything")
	x.ack(a.ID, "m", refSpan(0, 0, 5)...)
	x.nack(storage.DeliveriesNackParams{SubscriptionID: a.ID, Member: "m", Refs: []storage.DeliveryRef{ref(1, 0)}, ToDLQ: true, Reason: "old"})
	x.setState(p.ID, storage.Paused)
	equal(t, len(x.dlq(a.ID)), 1, "a's DLQ entry")

	x.advance(2*time.Hour + time.Second)
	res, removed := x.retention("cap")
	equal(t, removed, int64(20), "every message older than max_retention is removed")
	equal(t, res.MessagesExpired, int64(20), "every message was needed by paused subscription p: all count as expired")
	deepEqual(t, res.Expired, []storage.ExpiredCount{{Topic: "cap", Reason: storage.ExpiredMaxRetention, Messages: 20}}, "expired by topic and reason")
	equal(t, res.DLQEntriesExpired, int64(1), "DLQ entries older than max_retention")
	deepEqual(t, x.lowOffsets("cap"), []int64{12, 8}, "low offsets")
	deepEqual(t, x.highWaters("cap"), []int64{12, 8}, "high waters unchanged")
	equal(t, x.topicStats("cap").Messages, int64(0), "messages")
	equal(t, len(x.read("cap", 0, 0)), 0, "partition 0 is empty")
	equal(t, len(x.dlq(a.ID)), 0, "a's DLQ after max_retention")
	for _, s := range []*storage.Subscription{a, p} {
		st := x.requireStats(s.ID, wantStats{}, "removed messages are no longer pending")
		equal(t, partStats(t, st, 0).AckFloor, int64(12), "ack floor of partition 0")
		equal(t, partStats(t, st, 1).AckFloor, int64(8), "ack floor of partition 1")
	}
	equal(t, len(x.claimAll(a.ID, "m")), 0, "nothing left to deliver")
	x.publish("cap", toPartition(0, "new"))
	ds = x.claimAll(a.ID, "m")
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(0, 12)}, "offsets continue")
	requireAttempts(t, ds, 1, "the new message")
}

// testRetentionMaxKeepsYounger: max_retention removes only what is older; messages younger than it
// are kept for the subscriptions that need them, whatever the engine's segment granularity.
func testRetentionMaxKeepsYounger(t *testing.T, x *env) {
	x.createTopic("capy", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Hour, MaxRetention: 2 * time.Hour})
	s := x.subscribe("capy", "s", fromBeginning)
	x.publishN("capy", 0, 50)
	x.advance(time.Hour)
	x.publishN("capy", 0, 50)
	x.advance(time.Hour + time.Second)
	res, removed := x.retention("capy")
	isTrue(t, removed <= 50, "removed %d messages, only the 50 older than max_retention may go", removed)
	equal(t, res.MessagesExpired, removed, "everything removed was needed by s: counted as expired")
	deepEqual(t, msgOffsets(x.read("capy", 0, 50)), span(50, 100), "younger messages are readable")
	low := x.lowOffsets("capy")[0]
	ds := x.claimAll(s.ID, "m")
	requireOffsets(t, ds, span(low, 100), "s gets every retained message from the low offset %d", low)
}

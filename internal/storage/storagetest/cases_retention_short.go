package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// shortRetentionCases hold every retention setting to durations of seconds: an engine that deletes
// whole segments must not wait for a segment to fill or age before it removes what the settings
// allow (it seals the active segment), and every removal of a message a subscription had not
// completed is counted with its topic and reason.
func shortRetentionCases() []testCase {
	return []testCase{
		{name: "message_retention_seconds", fn: testRetentionMessageShort},
		{name: "zero_subscription_retention_seconds", fn: testRetentionZeroShort},
		{name: "max_retention_seconds", fn: testRetentionMaxShort},
		{name: "expired_counts_exactly_what_was_needed", fn: testRetentionExpiredExact},
		{name: "expired_reason_by_age", fn: testRetentionExpiredByAge},
	}
}

// checkExpired checks the breakdown of res.MessagesExpired: entries with a known reason and a
// positive count, no (topic, reason) twice, and a sum equal to MessagesExpired.
func (x *env) checkExpired(res *storage.RetentionResult) {
	x.t.Helper()
	type key struct {
		topic  string
		reason storage.ExpiryReason
	}
	seen := map[key]bool{}
	var sum int64
	for _, e := range res.Expired {
		switch e.Reason {
		case storage.ExpiredMaxRetention, storage.ExpiredZeroSubscription, storage.ExpiredDeadSubscription, storage.ExpiredSize:
		default:
			x.t.Fatalf("expired entry %+v: unknown reason", e)
		}
		isTrue(x.t, e.Messages > 0, "expired entry %+v: count must be positive", e)
		k := key{e.Topic, e.Reason}
		isTrue(x.t, !seen[k], "expired entry %+v listed twice", e)
		seen[k] = true
		sum += e.Messages
	}
	equal(x.t, sum, res.MessagesExpired, "sum of Expired %+v = MessagesExpired", res.Expired)
}

// testRetentionMessageShort: message_retention of 3 s removes completed messages once they are
// older than that, at the first run after, and never the ones a subscription has not completed.
func testRetentionMessageShort(t *testing.T, x *env) {
	x.createTopic("ms", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: 3 * time.Second, MaxRetention: time.Hour})
	a := x.subscribe("ms", "a", fromBeginning)
	x.publishN("ms", 0, 10)
	equal(t, x.ack(a.ID, "m", RefsOf(x.claimAll(a.ID, "m"))...).Acked, 10, "acked")
	x.advance(2 * time.Second)
	_, removed := x.retention("ms")
	equal(t, removed, int64(0), "completed messages younger than message_retention removed")
	x.advance(2 * time.Second)
	res, removed := x.retention("ms")
	equal(t, removed, int64(10), "completed messages older than message_retention (3s) must go")
	equal(t, res.MessagesExpired, int64(0), "completed messages are deleted, not expired")
	equal(t, res.MessagesDeleted, int64(10), "deleted")

	// Half acked: only completed messages may go, and the rest go at the first run after their ack.
	x.publishN("ms", 0, 10)
	ds := x.claimAll(a.ID, "m")
	requireOffsets(t, ds, span(10, 20), "new messages")
	x.ack(a.ID, "m", RefsOf(ds[:5])...)
	x.advance(4 * time.Second)
	res, removed = x.retention("ms")
	isTrue(t, removed <= 5, "removed %d: the 5 messages a has not acked must stay", removed)
	equal(t, res.MessagesExpired, int64(0), "expired")
	deepEqual(t, msgOffsets(x.read("ms", 0, 15)), span(15, 20), "unacked messages are readable")
	x.ack(a.ID, "m", RefsOf(ds[5:])...)
	res, _ = x.retention("ms")
	equal(t, res.MessagesExpired, int64(0), "expired")
	deepEqual(t, x.lowOffsets("ms"), []int64{20}, "everything completed and older than 3s is gone")
	x.publishN("ms", 0, 1)
	requireOffsets(t, x.claimAll(a.ID, "m"), []int64{20}, "offsets continue")
}

// testRetentionZeroShort: zero_subscription_retention of 3 s removes the messages of a topic
// without a subscription that holds retention once they are older than that. Messages no
// subscription needed are deleted; those a DEAD subscription had not completed are expired with
// reason zero_subscription, on PUB_SUB topics and on QUEUE topics whose queue subscription is
// DEAD.
func testRetentionZeroShort(t *testing.T, x *env) {
	x.createTopic("zs", storage.TopicConfig{Semantics: storage.PubSub, ZeroSubscriptionRetention: 3 * time.Second})
	x.publishN("zs", 0, 10)
	x.advance(2 * time.Second)
	_, removed := x.retention("zs")
	equal(t, removed, int64(0), "removed within zero_subscription_retention")
	x.advance(2 * time.Second)
	res, removed := x.retention("zs")
	equal(t, removed, int64(10), "messages older than zero_subscription_retention (3s) must go")
	equal(t, res.MessagesExpired, int64(0), "no subscription needed them: deleted, not expired")

	d := x.subscribe("zs", "d", fromBeginning)
	x.publishN("zs", 0, 10)
	x.ack(d.ID, "m", RefsOf(x.claim(d.ID, "m", 3))...)
	x.setState(d.ID, storage.Dead)
	x.createTopic("zq", storage.TopicConfig{ZeroSubscriptionRetention: 3 * time.Second})
	q := x.queueSub("zq")
	x.publishN("zq", 0, 6)
	x.setState(q.ID, storage.Dead)
	x.advance(2 * time.Second)
	_, removed = x.retention("zs")
	equal(t, removed, int64(0), "removed within zero_subscription_retention")
	x.advance(2 * time.Second)
	res, removed = x.retention("zs")
	equal(t, removed, int64(10), "messages of a topic with only a DEAD subscription, older than 3s")
	equal(t, res.MessagesDeleted, int64(3), "the 3 messages d completed are deleted")
	deepEqual(t, res.Expired, []storage.ExpiredCount{
		{Topic: "zq", Reason: storage.ExpiredZeroSubscription, Messages: 6},
		{Topic: "zs", Reason: storage.ExpiredZeroSubscription, Messages: 7},
	}, "expired by topic and reason")
	deepEqual(t, x.lowOffsets("zq"), []int64{6}, "the QUEUE topic with a DEAD queue subscription")
	equal(t, partStats(t, x.stats(d.ID), 0).AckFloor, int64(20), "d's floor moves past what was removed")
}

// testRetentionMaxShort: max_retention of 3 s removes what an ACTIVE subscription has not
// completed once it is older than that, counted with reason max_retention; younger messages stay.
func testRetentionMaxShort(t *testing.T, x *env) {
	x.createTopic("mx", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Second, MaxRetention: 3 * time.Second})
	s := x.subscribe("mx", "s", fromBeginning)
	x.publishN("mx", 0, 10)
	x.advance(2 * time.Second)
	x.publishN("mx", 0, 10)
	x.advance(2 * time.Second)
	res, removed := x.retention("mx")
	isTrue(t, removed <= 10, "removed %d: only the 10 messages older than max_retention may go", removed)
	equal(t, res.MessagesExpired, removed, "s needed everything removed")
	deepEqual(t, msgOffsets(x.read("mx", 0, 10)), span(10, 20), "messages younger than 3s are readable")
	x.advance(2 * time.Second)
	res2, removed2 := x.retention("mx")
	equal(t, removed+removed2, int64(20), "every message older than max_retention (3s) must go")
	equal(t, res2.MessagesExpired, removed2, "s needed everything removed")
	exp := map[storage.ExpiredCount]int64{}
	for _, r := range []*storage.RetentionResult{res, res2} {
		for _, e := range r.Expired {
			exp[storage.ExpiredCount{Topic: e.Topic, Reason: e.Reason}] += e.Messages
		}
	}
	deepEqual(t, exp, map[storage.ExpiredCount]int64{{Topic: "mx", Reason: storage.ExpiredMaxRetention}: 20}, "expired by topic and reason")
	equal(t, len(x.claimAll(s.ID, "m")), 0, "nothing left to deliver")
	x.requireStats(s.ID, wantStats{}, "removed messages are no longer pending")
}

// testRetentionExpiredExact: in one run over several topics, MessagesExpired and Expired count
// exactly the removed messages some subscription with state had not completed: completed ones
// removed by message_retention are deleted, not expired, and the reason is the rule that removed
// them.
func testRetentionExpiredExact(t *testing.T, x *env) {
	// a completed all 20, DEAD d only 5: message_retention removes all 20 (DEAD subscriptions do
	// not hold retention), 15 of them needed by d.
	x.createTopic("ex.dead", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: 2 * time.Second, MaxRetention: time.Hour})
	a := x.subscribe("ex.dead", "a", fromBeginning)
	d := x.subscribe("ex.dead", "d", fromBeginning)
	x.publishN("ex.dead", 0, 20)
	x.ack(a.ID, "m", RefsOf(x.claimAll(a.ID, "m"))...)
	x.ack(d.ID, "m", RefsOf(x.claim(d.ID, "m", 5))...)
	x.setState(d.ID, storage.Dead)

	// b completed 4 of 10: max_retention removes all 10, 6 of them needed by b.
	x.createTopic("ex.max", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Second, MaxRetention: 3 * time.Second})
	b := x.subscribe("ex.max", "b", fromBeginning)
	x.publishN("ex.max", 0, 10)
	x.ack(b.ID, "m", RefsOf(x.claim(b.ID, "m", 4))...)

	// Everything completed: deleted, not expired.
	x.createTopic("ex.done", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Second, MaxRetention: 3 * time.Second})
	c := x.subscribe("ex.done", "c", fromBeginning)
	x.publishN("ex.done", 0, 7)
	x.ack(c.ID, "m", RefsOf(x.claimAll(c.ID, "m"))...)

	x.advance(4 * time.Second)
	res, _ := x.retention("")
	deepEqual(t, x.lowOffsets("ex.dead"), []int64{20}, "ex.dead: everything a completed and older than message_retention")
	deepEqual(t, x.lowOffsets("ex.max"), []int64{10}, "ex.max: everything older than max_retention")
	deepEqual(t, x.lowOffsets("ex.done"), []int64{7}, "ex.done: everything completed")
	deepEqual(t, res.Expired, []storage.ExpiredCount{
		{Topic: "ex.dead", Reason: storage.ExpiredDeadSubscription, Messages: 15},
		{Topic: "ex.max", Reason: storage.ExpiredMaxRetention, Messages: 6},
	}, "expired by topic and reason: only what a subscription had not completed")
	equal(t, res.MessagesExpired, int64(21), "expired")
	equal(t, res.MessagesDeleted, int64(5+4+7), "deleted: what every subscription had completed")
	equal(t, partStats(t, x.stats(d.ID), 0).AckFloor, int64(20), "d's floor moves past what was removed")
	equal(t, partStats(t, x.stats(b.ID), 0).AckFloor, int64(10), "b's floor moves past what was removed")
}

// testRetentionExpiredByAge: when one run removes messages a DEAD subscription needed, those
// older than max_retention count as max_retention and the younger ones as zero_subscription, the
// same on every engine, even one that removes all of them in one piece (a segment).
func testRetentionExpiredByAge(t *testing.T, x *env) {
	x.createTopic("age", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Second,
		ZeroSubscriptionRetention: 2 * time.Second, MaxRetention: 5 * time.Second})
	d := x.subscribe("age", "d", fromBeginning)
	x.setState(d.ID, storage.Dead)
	x.publishN("age", 0, 4)
	x.advance(4 * time.Second)
	x.publishN("age", 0, 3)
	x.advance(3 * time.Second)
	res, removed := x.retention("age")
	equal(t, removed, int64(7), "everything is older than zero_subscription_retention (2s)")
	deepEqual(t, res.Expired, []storage.ExpiredCount{
		{Topic: "age", Reason: storage.ExpiredMaxRetention, Messages: 4},
		{Topic: "age", Reason: storage.ExpiredZeroSubscription, Messages: 3},
	}, "expired by reason: the 4 older than max_retention (5s), the 3 younger")
}

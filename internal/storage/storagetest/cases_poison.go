package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Poison rules (storage.PoisonRules, seed 002 ACK-9): a nack records a failure while a rule is
// on, and a rule that fires dead-letters the message before max_deliveries, with the rule and
// the failures in its DLQ entry.
func poisonCases() []testCase {
	return []testCase{
		{name: "same_reason_multiple_members", fn: testPoisonSameReason},
		{name: "failures_in_window", fn: testPoisonWindow},
		{name: "off_by_default", fn: testPoisonOff},
		{name: "max_deliveries_keeps_failures", fn: testPoisonMaxDeliveries},
		{name: "config", fn: testPoisonConfig},
		{name: "restart_keeps_history", restart: true, fn: testPoisonRestart},
		{name: "replayed_copy", fn: testPoisonReplayed},
		{name: "per_message", fn: testPoisonPerMessage},
	}
}

// poisonTopic creates a QUEUE topic with poison rules and max_deliveries 10, publishes one
// message and returns its subscription.
func (x *env) poisonTopic(name string, rules storage.PoisonRules) *storage.Subscription {
	x.t.Helper()
	x.createTopic(name, storage.TopicConfig{MaxDeliveries: 10, PoisonRules: rules})
	x.publishN(name, 0, 1)
	return x.queueSub(name)
}

// failOnce claims the one message of sub as member and nacks it with reason (due again at
// once); it returns the nack's result.
func (x *env) failOnce(sub int64, member, reason string) *storage.DeliveriesNackResult {
	x.t.Helper()
	ds := x.claim(sub, member, 1)
	requireOffsets(x.t, ds, []int64{0}, "%s claims the message", member)
	return x.nack(storage.DeliveriesNackParams{SubscriptionID: sub, Member: member, Refs: []storage.DeliveryRef{ds[0].Ref()}, Reason: reason})
}

// requirePoisoned checks that the one DLQ entry of sub is the message, dead-lettered by rule
// with these failures (members and reasons, oldest first; times from the clock at each nack).
func (x *env) requirePoisoned(sub int64, reason storage.DLQReason, rule storage.PoisonRule, attempts int, want []storage.DeliveryFailure) {
	x.t.Helper()
	entries := x.dlq(sub)
	equal(x.t, len(entries), 1, "DLQ entries")
	en := entries[0]
	equal(x.t, en.Message.Offset, int64(0), "dead-lettered offset")
	equal(x.t, en.Reason, reason, "DLQ reason")
	equal(x.t, en.Rule, rule, "DLQ rule")
	equal(x.t, en.Attempts, attempts, "DLQ attempts")
	equal(x.t, len(en.Failures), len(want), "failures in the DLQ entry: %+v", en.Failures)
	for i := range min(len(want), len(en.Failures)) {
		f, w := en.Failures[i], want[i]
		isTrue(x.t, f.Member == w.Member && f.Reason == w.Reason && f.At.Equal(w.At), "failure %d: %+v, want %+v", i, f, w)
	}
}

func testPoisonSameReason(t *testing.T, x *env) {
	q := x.poisonTopic("psr", storage.PoisonRules{DistinctMembers: true})
	t0 := x.now()
	equal(t, x.failOnce(q.ID, "a", "bad json").Nacked, 1, "first failure")
	x.advance(time.Second)
	equal(t, x.failOnce(q.ID, "a", "bad json").Nacked, 1, "the same member repeating its reason is not poison")
	x.advance(time.Second)
	equal(t, x.failOnce(q.ID, "b", "timeout").Nacked, 1, "another member with another reason is not poison")
	x.advance(time.Second)
	res := x.failOnce(q.ID, "b", "bad json")
	equal(t, res.DeadLettered, 1, "a second member with the same reason: poison")
	equal(t, res.Nacked, 0, "nacked")
	x.requirePoisoned(q.ID, storage.DLQPoison, storage.RuleSameReason, 4, []storage.DeliveryFailure{
		{Member: "a", Reason: "bad json", At: t0}, {Member: "a", Reason: "bad json", At: t0.Add(time.Second)},
		{Member: "b", Reason: "timeout", At: t0.Add(2 * time.Second)}, {Member: "b", Reason: "bad json", At: t0.Add(3 * time.Second)},
	})
	equal(t, len(x.claim(q.ID, "c", 1)), 0, "nothing left to claim")
	x.requireStats(q.ID, wantStats{dead: 1}, "after the poison rule")
}

func testPoisonWindow(t *testing.T, x *env) {
	q := x.poisonTopic("pfw", storage.PoisonRules{MaxFailures: 3, Window: 30 * time.Second})
	t0 := x.now()
	// Failures at 0 s, 10 s, 41 s: never 3 within 30 s.
	for i, at := range []time.Duration{0, 10 * time.Second, 41 * time.Second} {
		x.clock.Set(t0.Add(at))
		equal(t, x.failOnce(q.ID, "a", "e").Nacked, 1, "failure %d at %s: the window passed", i, at)
	}
	// 45 s: 10 s fell out of the window (15 s..45 s), two failures in it.
	x.clock.Set(t0.Add(45 * time.Second))
	equal(t, x.failOnce(q.ID, "b", "e").Nacked, 1, "failure at 45 s")
	// 46 s: 41 s, 45 s, 46 s.
	x.clock.Set(t0.Add(46 * time.Second))
	equal(t, x.failOnce(q.ID, "c", "f").DeadLettered, 1, "the third failure within 30 s: poison")
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	x.requirePoisoned(q.ID, storage.DLQPoison, storage.RuleFailuresInWindow, 5, []storage.DeliveryFailure{
		{Member: "a", Reason: "e", At: at(0)}, {Member: "a", Reason: "e", At: at(10 * time.Second)}, {Member: "a", Reason: "e", At: at(41 * time.Second)},
		{Member: "b", Reason: "e", At: at(45 * time.Second)}, {Member: "c", Reason: "f", At: at(46 * time.Second)},
	})
}

func testPoisonOff(t *testing.T, x *env) {
	q := x.poisonTopic("poff", storage.PoisonRules{})
	for i, m := range []string{"a", "b", "c", "d"} {
		equal(t, x.failOnce(q.ID, m, "bad json").Nacked, 1, "failure %d with the rules off", i)
	}
	equal(t, len(x.dlq(q.ID)), 0, "DLQ with the rules off")
	// With the rules off, a dead-lettered entry has no rule and no failures.
	ds := x.claim(q.ID, "e", 1)
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "e", Refs: []storage.DeliveryRef{ds[0].Ref()}, ToDLQ: true, Reason: "bad json"})
	x.requirePoisoned(q.ID, storage.DLQRejected, "", 5, nil)
}

func testPoisonMaxDeliveries(t *testing.T, x *env) {
	x.createTopic("pmd", storage.TopicConfig{MaxDeliveries: 2, PoisonRules: storage.PoisonRules{DistinctMembers: true}})
	x.publishN("pmd", 0, 1)
	q := x.queueSub("pmd")
	t0 := x.now()
	equal(t, x.failOnce(q.ID, "a", "x").Nacked, 1, "first failure")
	equal(t, x.failOnce(q.ID, "b", "y").DeadLettered, 1, "the max_deliveries-th delivery")
	x.requirePoisoned(q.ID, storage.DLQMaxDeliveries, "", 2, []storage.DeliveryFailure{{Member: "a", Reason: "x", At: t0}, {Member: "b", Reason: "y", At: t0}})
}

func testPoisonConfig(t *testing.T, x *env) {
	rules := storage.PoisonRules{DistinctMembers: true, MaxFailures: 3}
	tp := x.createTopic("pcfg", storage.TopicConfig{PoisonRules: rules})
	equal(t, tp.Config.PoisonRules, storage.PoisonRules{DistinctMembers: true, MaxFailures: 3, Window: storage.DefaultPoisonWindow}, "created with the default window")
	equal(t, x.getTopic("pcfg").Config.PoisonRules, tp.Config.PoisonRules, "TopicGet")
	_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "pbad", Config: storage.TopicConfig{PoisonRules: storage.PoisonRules{MaxFailures: 9}}})
	errIs(t, err, storage.ErrInvalidArgument, "max_failures above the history")
	cfg := tp.Config
	cfg.PoisonRules = storage.PoisonRules{}
	equal(t, x.updateTopic(storage.TopicUpdateParams{Name: "pcfg", Config: cfg}).Config.PoisonRules, storage.PoisonRules{}, "turned off")
	equal(t, x.getTopic("pcfg").Config.PoisonRules.On(), false, "off after the update")
}

func testPoisonRestart(t *testing.T, x *env) {
	q := x.poisonTopic("prs", storage.PoisonRules{DistinctMembers: true, MaxFailures: 3, Window: time.Minute})
	t0 := x.now()
	equal(t, x.failOnce(q.ID, "a", "bad json").Nacked, 1, "first failure")
	x.restart()
	x.advance(time.Second)
	res := x.failOnce(q.ID, "b", "bad json")
	equal(t, res.DeadLettered, 1, "the history survived the restart: poison")
	want := []storage.DeliveryFailure{{Member: "a", Reason: "bad json", At: t0}, {Member: "b", Reason: "bad json", At: t0.Add(time.Second)}}
	x.requirePoisoned(q.ID, storage.DLQPoison, storage.RuleSameReason, 2, want)
	x.restart()
	x.requirePoisoned(q.ID, storage.DLQPoison, storage.RuleSameReason, 2, want)

	// The window rule over a restart, another message.
	x.publishN("prs", 0, 1)
	ds := x.claim(q.ID, "c", 1)
	requireOffsets(t, ds, []int64{1}, "c claims")
	nackOne := func(m string, d *storage.Delivery, reason string) *storage.DeliveriesNackResult {
		return x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: m, Refs: []storage.DeliveryRef{d.Ref()}, Reason: reason})
	}
	equal(t, nackOne("c", ds[0], "r1").Nacked, 1, "failure 1")
	ds = x.claim(q.ID, "c", 1)
	equal(t, nackOne("c", ds[0], "r2").Nacked, 1, "failure 2")
	x.restart()
	ds = x.claim(q.ID, "c", 1)
	requireOffsets(t, ds, []int64{1}, "c claims after the restart")
	equal(t, nackOne("c", ds[0], "r3").DeadLettered, 1, "failure 3 within the window, two of them before the restart")
	entries := x.dlq(q.ID)
	equal(t, len(entries), 2, "DLQ entries")
	equal(t, entries[1].Rule, storage.RuleFailuresInWindow, "rule of the second entry")
	equal(t, len(entries[1].Failures), 3, "failures of the second entry")
}

func testPoisonReplayed(t *testing.T, x *env) {
	q := x.poisonTopic("prp", storage.PoisonRules{DistinctMembers: true})
	equal(t, x.failOnce(q.ID, "a", "bad").Nacked, 1, "first failure")
	equal(t, x.failOnce(q.ID, "b", "bad").DeadLettered, 1, "poison")
	n, err := x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: q.ID})
	noErr(t, err, "DLQReplay")
	equal(t, n, 1, "replayed")
	// The replayed copy starts a fresh history: one failure is not poison again.
	t1 := x.now()
	equal(t, x.failOnce(q.ID, "a", "bad").Nacked, 1, "the replayed copy's first failure")
	equal(t, x.failOnce(q.ID, "b", "bad").DeadLettered, 1, "the replayed copy's second failure, by another member")
	x.requirePoisoned(q.ID, storage.DLQPoison, storage.RuleSameReason, 2, []storage.DeliveryFailure{{Member: "a", Reason: "bad", At: t1}, {Member: "b", Reason: "bad", At: t1}})
}

// testPoisonPerMessage: messages nacked together and then taken apart keep their own histories.
func testPoisonPerMessage(t *testing.T, x *env) {
	q := x.poisonTopic("ppm", storage.PoisonRules{DistinctMembers: true})
	x.publishN("ppm", 0, 2)
	ds := x.claim(q.ID, "a", 3)
	requireOffsets(t, ds, []int64{0, 1, 2}, "a claims")
	res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "a", Refs: []storage.DeliveryRef{ds[0].Ref(), ds[1].Ref(), ds[2].Ref()}, Reason: "bad"})
	equal(t, res.Nacked, 3, "nacked together")
	ds = x.claim(q.ID, "b", 1)
	requireOffsets(t, ds, []int64{0}, "b claims one")
	res = x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "b", Refs: []storage.DeliveryRef{ds[0].Ref()}, Reason: "bad"})
	equal(t, res.DeadLettered, 1, "b's nack of a message a nacked with the same reason")
	ds = x.claim(q.ID, "c", 1)
	requireOffsets(t, ds, []int64{1}, "c claims one")
	res = x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "c", Refs: []storage.DeliveryRef{ds[0].Ref()}, Reason: "other"})
	equal(t, res.Nacked, 1, "another reason")
	ds = x.claim(q.ID, "a", 2)
	requireOffsets(t, ds, []int64{1, 2}, "a claims the rest")
	res = x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "a", Refs: []storage.DeliveryRef{ds[0].Ref(), ds[1].Ref()}, Reason: "other"})
	equal(t, res.DeadLettered, 1, "offset 1: c said other before; offset 2 only ever failed for a")
	equal(t, res.Nacked, 1, "offset 2 stays")
	entries := x.dlq(q.ID)
	equal(t, len(entries), 2, "DLQ entries")
	equal(t, entries[1].Message.Offset, int64(1), "second entry")
	equal(t, len(entries[1].Failures), 3, "offset 1's failures: a, c, a")
}

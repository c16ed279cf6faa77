package storagetest

import (
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func claimCases() []testCase {
	return []testCase{
		{name: "max_order_attempt_lease", fn: testClaimBasics},
		{name: "lease_duration_override", fn: testClaimLeaseDuration},
		{name: "order_per_partition", fn: testClaimOrder},
		{name: "partitions_filter", fn: testClaimPartitions},
		{name: "invalid", fn: testClaimInvalid},
	}
}

func ackCases() []testCase {
	return []testCase{
		{name: "basics_idempotent_unknown", fn: testAckBasics},
		{name: "floor_over_out_of_order_acks", fn: testAckFloor},
		{name: "undelivered_message", fn: testAckUndelivered},
		{name: "after_lease_expired", fn: testAckAfterExpiry},
	}
}

func nackCases() []testCase {
	return []testCase{
		{name: "immediate", fn: testNackImmediate},
		{name: "avoid_member_and_redelivery_first", fn: testNackAvoidMember},
		{name: "delay", fn: testNackDelay},
		{name: "to_dlq", fn: testNackToDLQ},
		{name: "not_held", fn: testNackNotHeld},
		{name: "on_max_deliveries", fn: testNackMaxDeliveries},
		{name: "redelivery_oldest_due_first", fn: testNackOldestDueFirst},
		{name: "give_back_uncounted_and_skipped", fn: testNackGiveBack},
		{name: "give_back_addressed", fn: testGiveBackAddressed},
	}
}

func extendCases() []testCase {
	return []testCase{
		{name: "pushes_deadline", fn: testExtend},
		{name: "not_held", fn: testExtendNotHeld},
		{name: "hand_over", fn: testExtendHandOver},
	}
}

func expiryCases() []testCase {
	return []testCase{
		{name: "backoff_schedule", fn: testExpiryBackoff},
		{name: "max_deliveries_to_dlq", fn: testExpiryMaxDeliveries},
		{name: "release", fn: testRelease},
		{name: "release_at_max_deliveries", fn: testReleaseMaxDeliveries},
	}
}

// queueTopic creates a QUEUE topic with the given ack_wait and max_deliveries (0: defaults),
// publishes n messages to partition 0 and returns its subscription.
func (x *env) queueTopic(name string, ackWait time.Duration, maxDeliveries, n int) *storage.Subscription {
	x.t.Helper()
	x.createTopic(name, storage.TopicConfig{AckWait: ackWait, MaxDeliveries: maxDeliveries})
	if n > 0 {
		x.publishN(name, 0, n)
	}
	return x.queueSub(name)
}

func testClaimBasics(t *testing.T, x *env) {
	q := x.queueTopic("cb", 0, 0, 5)
	start := x.now()
	a := x.claim(q.ID, "m1", 2)
	requireOffsets(t, a, []int64{0, 1}, "first claim honours Max")
	for i, d := range a {
		equal(t, d.Attempt, 1, "attempt of %d", i)
		equal(t, d.Member, "m1", "member")
		equal(t, d.SubscriptionID, q.ID, "subscription")
		equal(t, d.Topic, "cb", "topic")
		equal(t, d.Partition, int32(0), "partition")
		timeEqual(t, d.LeaseDeadline, start.Add(30*time.Second), "lease deadline = now + ack_wait (30 s default)")
		timeEqual(t, d.PublishedAt, baseTime, "PublishedAt")
	}
	equal(t, string(a[0].Payload), "payload-1", "payload of offset 0")
	x.advance(time.Second)
	b := x.claim(q.ID, "m2", 10)
	requireOffsets(t, b, []int64{2, 3, 4}, "a second member gets the other messages")
	timeEqual(t, b[0].LeaseDeadline, x.now().Add(30*time.Second), "second member's lease")
	res := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m3", Max: 10})
	equal(t, len(res.Deliveries), 0, "nothing left")
	// Only leases are outstanding: the next thing is the first lease's expiry (then its backoff).
	first := start.Add(30 * time.Second)
	isTrue(t, !res.NextDue.Before(first) && !res.NextDue.After(first.Add(storage.RedeliveryBackoff(1))),
		"NextDue %s, want between the first lease deadline %s and its end of backoff", fmtTime(res.NextDue), fmtTime(first))
	t.Logf("NextDue with only leases outstanding: lease deadline %+v", res.NextDue.Sub(first))
	x.requireStats(q.ID, wantStats{pending: 5, inFlight: 5}, "all leased")
}

func testClaimLeaseDuration(t *testing.T, x *env) {
	q := x.queueTopic("ld", 0, 0, 2)
	res := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: 1, LeaseDuration: 5 * time.Second})
	equal(t, len(res.Deliveries), 1, "claimed")
	deadline := x.now().Add(5 * time.Second)
	timeEqual(t, res.Deliveries[0].LeaseDeadline, deadline, "LeaseDuration overrides ack_wait")
	x.clock.Set(deadline.Add(time.Second - time.Millisecond))
	requireOffsets(t, x.claim(q.ID, "m2", 1), []int64{1}, "the expired message waits for its backoff")
	x.clock.Set(deadline.Add(time.Second))
	ds := x.claim(q.ID, "m2", 1)
	requireOffsets(t, ds, []int64{0}, "redelivered after lease deadline + 1 s")
	equal(t, ds[0].Attempt, 2, "attempt")
	timeEqual(t, ds[0].LeaseDeadline, x.now().Add(30*time.Second), "a claim without LeaseDuration uses ack_wait")
}

func testClaimOrder(t *testing.T, x *env) {
	const parts = 3
	x.createTopic("ord", storage.TopicConfig{Partitions: parts})
	q := x.queueSub("ord")
	var msgs []storage.AppendMessage
	for i := range 30 {
		msgs = append(msgs, keyed(string(rune('a'+i%11)), x.payload()))
	}
	x.publish("ord", msgs...)
	next := map[int32]int64{}
	total := 0
	for i := 0; ; i++ {
		ds := x.claim(q.ID, []string{"m1", "m2"}[i%2], 4)
		if len(ds) == 0 {
			break
		}
		isTrue(t, len(ds) <= 4, "claim returned %d > Max", len(ds))
		for _, d := range ds {
			equal(t, d.Offset, next[d.Partition], "offset order in partition %d", d.Partition)
			next[d.Partition]++
			total++
		}
	}
	equal(t, total, 30, "every message delivered once")
	hw := x.highWaters("ord")
	for p := range int32(parts) {
		equal(t, next[p], hw[p], "partition %d delivered up to its high water", p)
	}
}

func testClaimPartitions(t *testing.T, x *env) {
	x.createTopic("filt", storage.TopicConfig{Partitions: 3})
	q := x.queueSub("filt")
	x.publish("filt", toPartition(0, "a"), toPartition(1, "b"), toPartition(2, "c"), toPartition(1, "d"))
	ds := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: 10, Partitions: []int32{1}}).Deliveries
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(1, 0), ref(1, 1)}, "claim limited to partition 1")
	ds = x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m2", Max: 10, Partitions: []int32{0, 2}}).Deliveries
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(0, 0), ref(2, 0)}, "claim limited to partitions 0 and 2")
}

func testClaimInvalid(t *testing.T, x *env) {
	q := x.queueTopic("inv", 0, 0, 1)
	for _, max := range []int{0, -1} {
		_, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: max})
		errIs(t, err, storage.ErrInvalidArgument, "claim with Max %d", max)
	}
	_, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID + 1000, Member: "m1", Max: 1})
	errIs(t, err, storage.ErrSubscriptionNotFound, "claim on an unknown subscription")
	x.requireStats(q.ID, wantStats{pending: 1, lag: 1}, "nothing leased by refused claims")
}

func testAckBasics(t *testing.T, x *env) {
	q := x.queueTopic("ack", 0, 0, 5)
	ds := x.claim(q.ID, "m1", 5)
	requireOffsets(t, ds, span(0, 5), "claimed")
	res := x.ack(q.ID, "m1", ref(0, 0), ref(0, 1))
	equal(t, res.Acked, 2, "Acked")
	equal(t, res.AlreadyDone, 0, "AlreadyDone")
	equal(t, len(res.Unknown), 0, "Unknown")
	res = x.ack(q.ID, "m1", ref(0, 1))
	equal(t, res.Acked, 0, "Acked of a second ack")
	equal(t, res.AlreadyDone, 1, "a second ack is idempotent")
	res = x.ack(q.ID, "m2", ref(0, 2))
	equal(t, res.Acked, 1, "any member of the subscription may ack")
	res = x.ack(q.ID, "m1", ref(0, 99), ref(5, 0), ref(0, 5), ref(0, 3))
	requireRefs(t, res.Unknown, []storage.DeliveryRef{ref(0, 99), ref(5, 0), ref(0, 5)}, "Unknown lists refs above the high water and in missing partitions")
	equal(t, res.Acked, 1, "the known ref in a mixed ack is acked")
	_, err := x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID + 1000, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 4)}})
	errIs(t, err, storage.ErrSubscriptionNotFound, "ack on an unknown subscription")

	x.advance(time.Hour)
	ds = x.claimAll(q.ID, "m3")
	requireOffsets(t, ds, []int64{4}, "only the unacked message is delivered again")
	equal(t, ds[0].Attempt, 2, "attempt")
	x.ack(q.ID, "m3", ref(0, 4))
	x.requireStats(q.ID, wantStats{}, "everything acked")
	x.requireFloor(q.ID, 0, 5, 5, "ack floor")
	x.advance(time.Hour)
	equal(t, len(x.claimAll(q.ID, "m1")), 0, "acked messages are never delivered again")
}

func testAckFloor(t *testing.T, x *env) {
	q := x.queueTopic("floor", 0, 0, 5)
	x.claim(q.ID, "m1", 5)
	steps := []struct {
		off            int64
		floor, pending int64
	}{{4, 0, 4}, {2, 0, 3}, {3, 0, 2}, {0, 1, 1}, {1, 5, 0}}
	for _, s := range steps {
		x.ack(q.ID, "m1", ref(0, s.off))
		st := x.stats(q.ID)
		equal(t, partStats(t, st, 0).AckFloor, s.floor, "ack floor after acking %d", s.off)
		equal(t, st.Pending, s.pending, "pending after acking %d", s.off)
		equal(t, st.InFlight, s.pending, "in flight after acking %d", s.off)
	}
}

func testAckUndelivered(t *testing.T, x *env) {
	q := x.queueTopic("undel", 0, 0, 5)
	requireOffsets(t, x.claim(q.ID, "m1", 2), []int64{0, 1}, "claimed")
	res := x.ack(q.ID, "m2", ref(0, 3))
	equal(t, res.Acked, 1, "acking a never-delivered message completes it")
	requireOffsets(t, x.claimAll(q.ID, "m1"), []int64{2, 4}, "the acked message is skipped")
	x.ack(q.ID, "m1", ref(0, 0), ref(0, 1), ref(0, 2), ref(0, 4))
	x.requireFloor(q.ID, 0, 5, 5, "floor after acking everything")
	x.requireStats(q.ID, wantStats{}, "stats after acking everything")
}

func testAckAfterExpiry(t *testing.T, x *env) {
	q := x.queueTopic("late", 10*time.Second, 0, 1)
	x.claim(q.ID, "m1", 1)
	x.advance(11 * time.Second)
	ds := x.claim(q.ID, "m2", 1)
	requireOffsets(t, ds, []int64{0}, "redelivered to m2 after m1's lease expired")
	equal(t, ds[0].Attempt, 2, "attempt")
	equal(t, x.ack(q.ID, "m1", ref(0, 0)).Acked, 1, "m1 finished anyway: its ack completes the message")
	res := x.ack(q.ID, "m2", ref(0, 0))
	equal(t, res.AlreadyDone, 1, "m2's ack finds it done")
	equal(t, res.Acked, 0, "m2's ack")
	nr := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m2", Refs: []storage.DeliveryRef{ref(0, 0)}})
	requireRefs(t, nr.NotHeld, []storage.DeliveryRef{ref(0, 0)}, "nack of a completed message")
	x.advance(time.Hour)
	equal(t, len(x.claimAll(q.ID, "m3")), 0, "nothing redelivered")
	x.requireStats(q.ID, wantStats{}, "stats")
}

func testNackImmediate(t *testing.T, x *env) {
	q := x.queueTopic("ni", 0, 0, 1)
	x.claim(q.ID, "m1", 1)
	x.advance(time.Second)
	res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}})
	equal(t, res.Nacked, 1, "Nacked")
	equal(t, res.DeadLettered, 0, "DeadLettered")
	equal(t, len(res.NotHeld), 0, "NotHeld")
	x.requireStats(q.ID, wantStats{pending: 1, redelivering: 1}, "after nack")
	ds := x.claim(q.ID, "m1", 1)
	requireOffsets(t, ds, []int64{0}, "a nack with delay 0 is claimable at once (also by the same member without AvoidMember)")
	equal(t, ds[0].Attempt, 2, "attempt")
	timeEqual(t, ds[0].LeaseDeadline, x.now().Add(30*time.Second), "lease")
}

func testNackAvoidMember(t *testing.T, x *env) {
	q := x.queueTopic("avoid", 0, 0, 3)
	requireOffsets(t, x.claim(q.ID, "m1", 1), []int64{0}, "m1 claims")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}})
	ds := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: 10, AvoidMember: true}).Deliveries
	requireOffsets(t, ds, []int64{1, 2}, "with AvoidMember m1 does not get its nacked message back")
	ds = x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m2", Max: 10, AvoidMember: true}).Deliveries
	requireOffsets(t, ds, []int64{0}, "another member gets it")
	equal(t, ds[0].Attempt, 2, "attempt")

	// Redelivery goes first: a due redelivery comes before newer messages.
	q2 := x.queueTopic("first", 0, 0, 3)
	requireOffsets(t, x.claim(q2.ID, "m1", 1), []int64{0}, "m1 claims")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q2.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}})
	ds = x.claim(q2.ID, "m2", 1)
	requireOffsets(t, ds, []int64{0}, "the redelivery comes before offsets 1 and 2")
	ds = x.claim(q2.ID, "m2", 10)
	requireOffsets(t, ds, []int64{1, 2}, "then the new messages")
}

func testNackDelay(t *testing.T, x *env) {
	q := x.queueTopic("nd", 0, 0, 1)
	x.claim(q.ID, "m1", 1)
	nackedAt := x.now()
	res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}, Delay: 10 * time.Second})
	equal(t, res.Nacked, 1, "Nacked")
	cr := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m2", Max: 10})
	equal(t, len(cr.Deliveries), 0, "not claimable during the delay")
	timeEqual(t, cr.NextDue, nackedAt.Add(10*time.Second), "NextDue is the end of the delay")
	x.requireStats(q.ID, wantStats{pending: 1, redelivering: 1}, "waiting for its delay")
	x.advance(10*time.Second - time.Millisecond)
	cr = x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m2", Max: 10})
	equal(t, len(cr.Deliveries), 0, "not claimable 1 ms before the delay ends")
	timeEqual(t, cr.NextDue, nackedAt.Add(10*time.Second), "NextDue still the end of the delay")
	x.advance(time.Millisecond)
	ds := x.claim(q.ID, "m2", 10)
	requireOffsets(t, ds, []int64{0}, "claimable when the delay ends")
	equal(t, ds[0].Attempt, 2, "attempt")
}

func testNackToDLQ(t *testing.T, x *env) {
	q := x.queueTopic("nq", 0, 0, 2)
	x.claim(q.ID, "m1", 2)
	x.advance(time.Second)
	res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}, ToDLQ: true, Reason: "poison pill"})
	equal(t, res.DeadLettered, 1, "DeadLettered")
	equal(t, res.Nacked, 0, "Nacked")
	entries := x.dlq(q.ID)
	equal(t, len(entries), 1, "DLQ entries")
	en := entries[0]
	isTrue(t, en.ID > 0, "DLQ entry ID %d", en.ID)
	equal(t, en.SubscriptionID, q.ID, "entry subscription")
	equal(t, en.Reason, storage.DLQRejected, "reason")
	equal(t, en.LastError, "poison pill", "last error")
	equal(t, en.Attempts, 1, "attempts")
	timeEqual(t, en.DeadAt, x.now(), "DeadAt")
	equal(t, en.Message.Offset, int64(0), "message offset")
	equal(t, en.Message.Topic, "nq", "message topic")
	equal(t, string(en.Message.Payload), "payload-1", "message payload")
	timeEqual(t, en.Message.PublishedAt, baseTime, "message PublishedAt")
	x.requireStats(q.ID, wantStats{pending: 1, inFlight: 1, dead: 1}, "after dead-lettering one")
	x.ack(q.ID, "m1", ref(0, 1))
	x.requireFloor(q.ID, 0, 2, 2, "a dead-lettered message counts as done for the ack floor")
	x.advance(time.Hour)
	equal(t, len(x.claimAll(q.ID, "m1")), 0, "a dead-lettered message is not redelivered")
	equal(t, x.ack(q.ID, "m1", ref(0, 0)).AlreadyDone, 1, "acking a dead-lettered message finds it done")
}

func testNackNotHeld(t *testing.T, x *env) {
	q := x.queueTopic("nh", 0, 0, 2)
	x.claim(q.ID, "m1", 1)
	res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m2", Refs: []storage.DeliveryRef{ref(0, 0), ref(0, 1), ref(0, 99)}})
	requireRefs(t, res.NotHeld, []storage.DeliveryRef{ref(0, 0), ref(0, 1), ref(0, 99)}, "NotHeld: held by another member, never delivered, above the high water")
	equal(t, res.Nacked, 0, "Nacked")
	equal(t, res.DeadLettered, 0, "DeadLettered")
	requireOffsets(t, x.claim(q.ID, "m2", 10), []int64{1}, "m1 still holds offset 0")
	equal(t, x.ack(q.ID, "m1", ref(0, 0)).Acked, 1, "m1's ack")
}

func testNackMaxDeliveries(t *testing.T, x *env) {
	q := x.queueTopic("nmax", 0, 2, 1)
	x.claim(q.ID, "m1", 1)
	res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}, Reason: "boom 1"})
	equal(t, res.Nacked, 1, "first nack")
	ds := x.claim(q.ID, "m1", 1)
	requireOffsets(t, ds, []int64{0}, "second delivery")
	equal(t, ds[0].Attempt, 2, "second delivery")
	res = x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}, Reason: "boom 2"})
	equal(t, res.DeadLettered, 1, "a nack on the max_deliveries-th delivery dead-letters")
	equal(t, res.Nacked, 0, "Nacked")
	entries := x.dlq(q.ID)
	equal(t, len(entries), 1, "DLQ entries")
	equal(t, entries[0].Reason, storage.DLQMaxDeliveries, "reason")
	equal(t, entries[0].Attempts, 2, "attempts")
	equal(t, entries[0].LastError, "boom 2", "last error")
	x.requireStats(q.ID, wantStats{dead: 1}, "stats")
}

// testNackOldestDueFirst: due redeliveries come oldest due first, whatever their offsets.
func testNackOldestDueFirst(t *testing.T, x *env) {
	q := x.queueTopic("due", 0, 0, 4)
	requireOffsets(t, x.claim(q.ID, "m1", 3), []int64{0, 1, 2}, "claimed")
	for _, n := range []struct {
		off   int64
		delay time.Duration
	}{{0, 5 * time.Second}, {1, 2 * time.Second}, {2, 3 * time.Second}} {
		x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, n.off)}, Delay: n.delay})
	}
	x.advance(5 * time.Second)
	var got []int64
	for range 4 {
		ds := x.claim(q.ID, "m2", 1)
		requireAttempts(t, ds, map[bool]int{true: 2, false: 1}[len(got) < 3], "claim")
		got = append(got, OffsetsOf(ds)...)
	}
	deepEqual(t, got, []int64{1, 2, 0, 3}, "redeliveries in due order (1 due at +2 s, 2 at +3 s, 0 at +5 s), then the new message")
}

func testExtend(t *testing.T, x *env) {
	q := x.queueTopic("ext", 0, 0, 1)
	t0 := x.now()
	x.claim(q.ID, "m1", 1)
	x.advance(20 * time.Second)
	res := x.extend(storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}})
	equal(t, res.Extended, 1, "Extended")
	equal(t, len(res.NotHeld), 0, "NotHeld")
	timeEqual(t, res.Deadline, t0.Add(50*time.Second), "Duration 0 extends by ack_wait from now")
	x.clock.Set(t0.Add(40 * time.Second))
	cr := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m2", Max: 1})
	equal(t, len(cr.Deliveries), 0, "no expiry at the old deadline")
	isTrue(t, !cr.NextDue.Before(t0.Add(50*time.Second)) && !cr.NextDue.After(t0.Add(51*time.Second)),
		"NextDue %s, want between the new deadline and its end of backoff", fmtTime(cr.NextDue))
	x.requireStats(q.ID, wantStats{pending: 1, inFlight: 1}, "still leased")
	res = x.extend(storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}, Duration: time.Minute})
	timeEqual(t, res.Deadline, t0.Add(100*time.Second), "explicit Duration from now")
	x.clock.Set(t0.Add(101*time.Second - time.Millisecond))
	equal(t, len(x.claim(q.ID, "m2", 1)), 0, "not claimable before the new deadline + 1 s")
	x.clock.Set(t0.Add(101 * time.Second))
	ds := x.claim(q.ID, "m2", 1)
	requireOffsets(t, ds, []int64{0}, "claimable after the extended lease expired and its backoff passed")
	equal(t, ds[0].Attempt, 2, "attempt")

	// The new deadline is now + Duration, also when that is earlier than the current deadline.
	res = x.extend(storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m2", Refs: []storage.DeliveryRef{ref(0, 0)}, Duration: 2 * time.Second})
	equal(t, res.Extended, 1, "Extended")
	timeEqual(t, res.Deadline, x.now().Add(2*time.Second), "a shorter Duration shortens the lease")
	x.advance(2*time.Second + storage.RedeliveryBackoff(2))
	ds = x.claim(q.ID, "m3", 1)
	requireOffsets(t, ds, []int64{0}, "claimable after the shortened lease and its backoff")
	equal(t, ds[0].Attempt, 3, "attempt")
}

func testExtendNotHeld(t *testing.T, x *env) {
	q := x.queueTopic("exn", 0, 0, 2)
	ds := x.claim(q.ID, "m1", 1)
	requireOffsets(t, ds, []int64{0}, "claimed")
	res := x.extend(storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m2", Refs: []storage.DeliveryRef{ref(0, 0), ref(0, 1)}})
	equal(t, res.Extended, 0, "Extended")
	requireRefs(t, res.NotHeld, []storage.DeliveryRef{ref(0, 0), ref(0, 1)}, "NotHeld")
	x.clock.Set(ds[0].LeaseDeadline.Add(time.Second))
	requireOffsets(t, x.claim(q.ID, "m2", 1), []int64{0}, "the lease was not extended by the refused extend")
}

// testExtendHandOver: DeliveriesExtendParams.NewMember moves held leases to another member (the
// broker routing a message claimed for one member to another whose filter matches): the new
// holder's nacks and releases apply to them, the old holder's do not; attempts are kept.
func testExtendHandOver(t *testing.T, x *env) {
	q := x.queueTopic("exh", 0, 0, 3)
	requireOffsets(t, x.claim(q.ID, "m1", 3), []int64{0, 1, 2}, "claimed by m1")
	res := x.extend(storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m1", NewMember: "m2",
		Refs: []storage.DeliveryRef{ref(0, 0), ref(0, 1)}, Duration: time.Minute})
	equal(t, res.Extended, 2, "Extended")
	timeEqual(t, res.Deadline, x.now().Add(time.Minute), "the handed-over leases run from now")
	res = x.extend(storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m1", NewMember: "m3", Refs: []storage.DeliveryRef{ref(0, 0)}})
	requireRefs(t, res.NotHeld, []storage.DeliveryRef{ref(0, 0)}, "m1 no longer holds what it handed over")
	nr := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}})
	requireRefs(t, nr.NotHeld, []storage.DeliveryRef{ref(0, 0)}, "m1's nack of a handed-over lease")
	nr = x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m2", Refs: []storage.DeliveryRef{ref(0, 0)}})
	equal(t, nr.Nacked, 1, "m2 nacks what it was handed")
	rel := x.release(q.ID, "m1")
	equal(t, rel.Released, 1, "m1's release gives back only offset 2")
	x.requireStats(q.ID, wantStats{pending: 3, inFlight: 1, redelivering: 2}, "offset 1 still leased to m2")
	ds := x.claim(q.ID, "m3", 10)
	requireOffsets(t, ds, []int64{0, 2}, "offset 1 stays with m2")
	requireAttempts(t, ds, 2, "attempts are kept across the hand-over")
	rel = x.release(q.ID, "m2")
	equal(t, rel.Released, 1, "m2's release gives back offset 1")

	o := x.orderedSub("exho", 1, 1, storage.TopicConfig{})
	a := x.assign(o.ID, 0, map[string][]int32{"m1": {0}})
	x.publishN("exho", 0, 1)
	requireOffsets(t, x.claimG(o.ID, "m1", a.Generation, 1).Deliveries, []int64{0}, "ordered claim")
	_, err := x.e.DeliveriesExtend(x.ctx, &storage.DeliveriesExtendParams{SubscriptionID: o.ID, Member: "m1", Generation: a.Generation,
		NewMember: "m2", Refs: []storage.DeliveryRef{ref(0, 0)}})
	errIs(t, err, storage.ErrInvalidArgument, "an ORDERED subscription refuses a hand-over")
}

func testExpiryBackoff(t *testing.T, x *env) {
	q := x.queueTopic("backoff", 10*time.Second, 10, 1)
	ds := x.claim(q.ID, "m1", 1)
	requireOffsets(t, ds, []int64{0}, "first delivery")
	// Attempt a expires at its deadline; it is claimable again at deadline + RedeliveryBackoff(a):
	// 1 s, 4 s, 16 s, 64 s, 256 s, then capped at 5 min.
	wantBackoff := []time.Duration{time.Second, 4 * time.Second, 16 * time.Second, 64 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute}
	for attempt := 1; attempt <= len(wantBackoff); attempt++ {
		equal(t, ds[0].Attempt, attempt, "attempt")
		equal(t, storage.RedeliveryBackoff(attempt), wantBackoff[attempt-1], "RedeliveryBackoff(%d)", attempt)
		due := ds[0].LeaseDeadline.Add(wantBackoff[attempt-1])
		x.clock.Set(ds[0].LeaseDeadline.Add(-time.Millisecond))
		equal(t, len(x.claim(q.ID, "m2", 1)), 0, "attempt %d: leased until its deadline", attempt)
		x.clock.Set(due.Add(-time.Millisecond))
		cr := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m2", Max: 1})
		equal(t, len(cr.Deliveries), 0, "attempt %d: not claimable 1 ms before deadline + backoff", attempt)
		timeEqual(t, cr.NextDue, due, "attempt %d: NextDue after the expiry was processed", attempt)
		st := x.stats(q.ID)
		equal(t, st.Redelivering, int64(1), "attempt %d: redelivering while in backoff", attempt)
		equal(t, st.InFlight, int64(0), "attempt %d: in flight while in backoff", attempt)
		x.clock.Set(due)
		ds = x.claim(q.ID, "m2", 1)
		requireOffsets(t, ds, []int64{0}, "attempt %d: claimable at deadline + backoff", attempt)
		timeEqual(t, ds[0].LeaseDeadline, due.Add(10*time.Second), "lease of the redelivery")
	}
	equal(t, ds[0].Attempt, len(wantBackoff)+1, "attempt count")
}

func testExpiryMaxDeliveries(t *testing.T, x *env) {
	q := x.queueTopic("exmax", 10*time.Second, 3, 2)
	ds := x.claim(q.ID, "m1", 2)
	requireOffsets(t, ds, []int64{0, 1}, "first deliveries")
	for attempt := 1; attempt < 3; attempt++ {
		x.clock.Set(ds[0].LeaseDeadline.Add(storage.RedeliveryBackoff(attempt)))
		ds = x.claim(q.ID, "m1", 2)
		requireOffsets(t, ds, []int64{0, 1}, "redelivery %d", attempt)
		requireAttempts(t, ds, attempt+1, "redelivery")
	}
	deadline := ds[0].LeaseDeadline
	x.clock.Set(deadline.Add(time.Hour))
	res := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: 10})
	equal(t, len(res.Deliveries), 0, "after the 3rd expiry (max_deliveries 3) nothing is redelivered")
	equal(t, res.DeadLettered, 2, "DeadLettered: the claim that processed the expiries")
	equal(t, x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: 10}).DeadLettered, 0,
		"DeadLettered of the next claim")
	entries := x.dlq(q.ID)
	equal(t, len(entries), 2, "both messages are in the DLQ")
	for i, en := range entries {
		equal(t, en.Reason, storage.DLQMaxDeliveries, "reason of entry %d", i)
		equal(t, en.Attempts, 3, "attempts of entry %d", i)
		isTrue(t, !en.DeadAt.Before(deadline) && !en.DeadAt.After(x.now()), "DeadAt %s between the last deadline and now", fmtTime(en.DeadAt))
	}
	isTrue(t, entries[0].Message.Offset != entries[1].Message.Offset, "two different messages in the DLQ")
	x.requireStats(q.ID, wantStats{dead: 2}, "dead-lettered messages are done")
	x.requireFloor(q.ID, 0, 2, 2, "the ack floor passes dead-lettered messages")
	x.publishN("exmax", 0, 1)
	requireOffsets(t, x.claimAll(q.ID, "m1"), []int64{2}, "new messages flow")
}

func testRelease(t *testing.T, x *env) {
	q := x.queueTopic("rel", 0, 0, 4)
	x.claim(q.ID, "m1", 3)
	requireOffsets(t, x.claim(q.ID, "m2", 1), []int64{3}, "m2's lease")
	res := x.release(q.ID, "m1")
	equal(t, res.Released, 3, "Released")
	equal(t, res.DeadLettered, 0, "DeadLettered")
	x.requireStats(q.ID, wantStats{pending: 4, inFlight: 1, redelivering: 3}, "after release")
	ds := x.claim(q.ID, "m3", 10)
	requireOffsets(t, ds, []int64{0, 1, 2}, "released messages are claimable at once by another member, m2's lease stays")
	requireAttempts(t, ds, 2, "attempts are kept (and counted)")
	timeEqual(t, ds[0].LeaseDeadline, x.now().Add(30*time.Second), "lease")
	res = x.release(q.ID, "m1")
	equal(t, res.Released, 0, "a second release finds nothing")
}

func testReleaseMaxDeliveries(t *testing.T, x *env) {
	q := x.queueTopic("relmax", 0, 2, 2)
	x.claim(q.ID, "m1", 1)
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 0)}})
	ds := x.claim(q.ID, "m1", 2)
	requireOffsets(t, ds, []int64{0, 1}, "the redelivery first, then the new message")
	equal(t, ds[0].Attempt, 2, "attempt of offset 0")
	res := x.release(q.ID, "m1")
	equal(t, res.Released, 1, "Released: offset 1")
	equal(t, res.DeadLettered, 1, "DeadLettered: offset 0 reached max_deliveries")
	entries := x.dlq(q.ID)
	equal(t, len(entries), 1, "DLQ")
	equal(t, entries[0].Message.Offset, int64(0), "dead-lettered offset")
	equal(t, entries[0].Reason, storage.DLQMaxDeliveries, "reason")
	equal(t, entries[0].Attempts, 2, "attempts")
	ds = x.claim(q.ID, "m2", 10)
	requireOffsets(t, ds, []int64{1}, "the released message")
	equal(t, ds[0].Attempt, 2, "attempt")
}

// testGiveBackAddressed: with three broker instances, a give-back addressed to C (its tag) is
// passed over by the claims of A and B (Skip is the tags' prefix, Take their own tag) for
// SkipFor, so it does not go from A to B and back while only C wants it; C takes it at once, and
// past SkipFor any instance takes it again.
func testGiveBackAddressed(t *testing.T, x *env) {
	q := x.queueTopic("giveback3", 0, 2, 2)
	claim := func(inst, member string) *storage.DeliveriesClaimResult {
		return x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: member, Max: 1,
			Skip: "gb:", Take: "gb:" + inst, SkipFor: 5 * time.Second})
	}
	give := func(member, tag string) {
		t.Helper()
		res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: member, Refs: []storage.DeliveryRef{ref(0, 0)}, GiveBack: tag})
		equal(t, res.Nacked, 1, "given back by %s", member)
	}
	requireOffsets(t, claim("A", "a1").Deliveries, []int64{0}, "A's first claim")
	give("a1", "gb:C")
	cr := claim("A", "a1")
	requireOffsets(t, cr.Deliveries, []int64{1}, "the giver A passes over the give-back to C")
	timeEqual(t, cr.NextDue, x.now().Add(5*time.Second), "NextDue of the give-back for A")
	cr = claim("B", "b1")
	requireOffsets(t, cr.Deliveries, nil, "B passes over the give-back to C too")
	timeEqual(t, cr.NextDue, x.now().Add(5*time.Second), "NextDue of the give-back for B")
	ds := claim("C", "c1").Deliveries
	requireOffsets(t, ds, []int64{0}, "C takes the give-back addressed to it at once")
	equal(t, ds[0].Attempt, 1, "attempt after the give-back")

	// C gives it back to itself (its member has no credit): past SkipFor, B decides again.
	give("c1", "gb:C")
	requireOffsets(t, claim("B", "b1").Deliveries, nil, "B within SkipFor")
	x.advance(5 * time.Second)
	requireOffsets(t, claim("B", "b1").Deliveries, []int64{0}, "B past SkipFor")
}

// testNackGiveBack: a give-back (DeliveriesNackParams.GiveBack, member filters on a shared
// engine) undoes the delivery's attempt, so any number of them never dead-letters; the claims
// that Skip its tag pass it over for SkipFor after it became due, other claims take it at once.
func testNackGiveBack(t *testing.T, x *env) {
	q := x.queueTopic("giveback", 0, 2, 2)
	give := func(member, tag string, refs ...storage.DeliveryRef) {
		t.Helper()
		res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: member, Refs: refs, GiveBack: tag})
		equal(t, res.Nacked, len(refs), "given back by %s", member)
		equal(t, res.DeadLettered, 0, "dead-lettered by a give-back")
	}
	skipA := func(member string) *storage.DeliveriesClaimResult {
		return x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: member, Max: 10, Skip: "inst-a", SkipFor: 5 * time.Second})
	}
	// Many more give-backs than max_deliveries (2): the attempt stays 1, nothing is dead-lettered.
	for i := range 5 {
		ds := x.claim(q.ID, "a1", 1)
		requireOffsets(t, ds, []int64{0}, "claim %d", i)
		equal(t, ds[0].Attempt, 1, "attempt after %d give-backs", i)
		give("a1", "inst-a", ref(0, 0))
	}
	x.requireStats(q.ID, wantStats{pending: 2, lag: 1, redelivering: 1}, "after the give-backs")

	// The instance that gave it back skips it for SkipFor (another of its members too), and
	// learns when it may take it; another instance's claim takes it at once.
	cr := skipA("a2")
	requireOffsets(t, cr.Deliveries, []int64{1}, "a claim skipping inst-a gets the new message only")
	timeEqual(t, cr.NextDue, x.now().Add(5*time.Second), "NextDue of the skipped give-back")
	give("a2", "inst-a", ref(0, 1))
	ds := x.claim(q.ID, "b1", 10)
	requireOffsets(t, ds, []int64{0, 1}, "another instance's member takes both give-backs")
	equal(t, ds[0].Attempt, 1, "attempt of 0")
	equal(t, ds[1].Attempt, 1, "attempt of 1")

	// A real nack still counts: b1's nack of offset 1 is its first failure, the next one its last.
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "b1", Refs: []storage.DeliveryRef{ref(0, 1)}})
	give("b1", "inst-b", ref(0, 0))
	ds = skipA("a1").Deliveries
	requireOffsets(t, ds, []int64{0, 1}, "inst-b's give-back and the nack are no give-backs of inst-a")
	equal(t, ds[0].Attempt, 1, "attempt of the give-back")
	equal(t, ds[1].Attempt, 2, "attempt of the nacked message")
	equal(t, x.ack(q.ID, "a1", ref(0, 1)).Acked, 1, "ack of 1")
	give("a1", "inst-a", ref(0, 0))
	x.advance(5 * time.Second)
	requireOffsets(t, skipA("a1").Deliveries, []int64{0}, "after SkipFor the skipping instance takes it")

	// Persisted: after a restart the attempts are those of before.
	give("a1", "inst-a", ref(0, 0))
	x.restart()
	ds = x.claim(q.ID, "a1", 10)
	requireOffsets(t, ds, []int64{0}, "after a restart")
	equal(t, ds[0].Attempt, 1, "attempt after a restart")

	// Bad parameters change nothing.
	for _, p := range []storage.DeliveriesNackParams{
		{SubscriptionID: q.ID, Member: "a1", Refs: []storage.DeliveryRef{ref(0, 0)}, GiveBack: "x", ToDLQ: true},
		{SubscriptionID: q.ID, Member: "a1", Refs: []storage.DeliveryRef{ref(0, 0)}, GiveBack: strings.Repeat("x", storage.MaxGroupNameLen+1)},
	} {
		_, err := x.e.DeliveriesNack(x.ctx, &p)
		errIs(t, err, storage.ErrInvalidArgument, "give-back %+v", p)
	}
	_, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "a1", Max: 1, Skip: "x", SkipFor: storage.MaxSkipFor + 1})
	errIs(t, err, storage.ErrInvalidArgument, "claim with SkipFor past the bound")
	x.requireStats(q.ID, wantStats{pending: 1, inFlight: 1}, "stats after the refused calls")
}

package storagetest

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Ordered groups (storage.ModeOrdered): the engine part of issue 17 item 3. The broker decides
// assignments; these cases make them by hand with SubscriptionAssign.

func orderedCases() []testCase {
	return []testCase{
		{name: "create_and_mode", ordered: true, fn: testOrderedCreate},
		{name: "assign_compare_and_set", ordered: true, fn: testOrderedAssignCAS},
		{name: "one_owner_offset_order", ordered: true, fn: testOrderedOneOwner},
		{name: "nack_blocks_partition", ordered: true, fn: testOrderedNackBlocks},
		{name: "expiry_blocks_partition", ordered: true, fn: testOrderedExpiryBlocks},
		{name: "max_in_flight_per_partition", ordered: true, fn: testOrderedMaxInFlight},
		{name: "dlq_moves_partition_on", ordered: true, fn: testOrderedDLQMovesOn},
		{name: "stale_generation_fenced", ordered: true, fn: testOrderedFencing},
		{name: "member_death_new_owner_at_floor", ordered: true, fn: testOrderedMemberDeath},
		{name: "rebalance_dead_letters_last_attempt", ordered: true, fn: testOrderedRebalanceDLQ},
		{name: "restart_keeps_order_and_generation", ordered: true, restart: true, fn: testOrderedRestart},
		{name: "randomized_joins_and_leaves", ordered: true, fn: testOrderedRandomized},
		{name: "member_liveness_expires", ordered: true, fn: testOrderedMemberLiveness},
		{name: "member_records_filters", ordered: true, fn: testMemberRecords},
	}
}

// orderedSub creates a PUB_SUB topic with the given partitions and an ordered subscription on it
// from the beginning.
func (x *env) orderedSub(topic string, partitions, maxInFlight int, cfg storage.TopicConfig) *storage.Subscription {
	x.t.Helper()
	cfg.Semantics = storage.PubSub
	cfg.Partitions = partitions
	x.createTopic(topic, cfg)
	s, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: "g",
		Start: storage.StartPosition{Kind: storage.FromBeginning}, Mode: storage.ModeOrdered, MaxInFlightPerPartition: maxInFlight})
	noErr(x.t, err, "SubscriptionCreate(ordered)")
	return s
}

// assign replaces the assignment, expecting generation gen to be current, and returns the new one.
func (x *env) assign(sub int64, gen int64, members map[string][]int32) *storage.Assignment {
	x.t.Helper()
	return x.assignR(sub, gen, members).Assignment
}

// assignR is assign returning the whole result.
func (x *env) assignR(sub int64, gen int64, members map[string][]int32) *storage.SubscriptionAssignResult {
	x.t.Helper()
	res, err := x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: sub, Generation: gen, Members: members})
	noErr(x.t, err, "SubscriptionAssign(%d, generation %d, %v)", sub, gen, members)
	equal(x.t, res.Assignment.Generation, gen+1, "generation after SubscriptionAssign")
	return res
}

// claimG claims for an ordered member with its generation.
func (x *env) claimG(sub int64, member string, gen int64, max int) *storage.DeliveriesClaimResult {
	x.t.Helper()
	return x.claimP(storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: max, Generation: gen})
}

func (x *env) ackG(sub int64, member string, gen int64, refs ...storage.DeliveryRef) (*storage.DeliveriesAckResult, error) {
	return x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Member: member, Generation: gen, Refs: refs})
}

func testOrderedCreate(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 0, storage.TopicConfig{})
	equal(t, s.Mode, storage.ModeOrdered, "mode")
	equal(t, s.MaxInFlightPerPartition, 1, "max_in_flight_per_partition default")
	equal(t, s.Strategy, storage.StrategyRoundRobin, "strategy default")
	got := x.getSub(s.ID)
	equal(t, got.Ordering(), s.Ordering(), "SubscriptionGet ordering")

	// The mode of an existing subscription cannot change.
	_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g"})
	errIs(t, err, storage.ErrModeConflict, "shared subscription over an ordered one")
	errIs(t, err, storage.ErrSubscriptionExists, "mode conflict is a SUBSCRIPTION_EXISTS")
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g", Mode: storage.ModeOrdered})
	isTrue(t, err != nil && !errors.Is(err, storage.ErrModeConflict), "same mode again: plain exists, got %v", err)
	errIs(t, err, storage.ErrSubscriptionExists, "same mode again")

	// Bad settings change nothing.
	for _, p := range []storage.SubscriptionCreateParams{
		{Topic: "t", Group: "h", Mode: "weird"},
		{Topic: "t", Group: "h", Mode: storage.ModeOrdered, MaxInFlightPerPartition: -1},
		{Topic: "t", Group: "h", Mode: storage.ModeOrdered, MaxInFlightPerPartition: storage.MaxInFlightPerPartitionLimit + 1},
		{Topic: "t", Group: "h", Mode: storage.ModeOrdered, Strategy: "random"},
		{Topic: "t", Group: "h", MaxInFlightPerPartition: 2},
		{Topic: "t", Ephemeral: true, Mode: storage.ModeOrdered},
	} {
		_, err := x.e.SubscriptionCreate(x.ctx, &p)
		errIs(t, err, storage.ErrInvalidArgument, "SubscriptionCreate(%+v)", p)
	}
	equal(t, len(x.listSubs("t")), 1, "subscriptions after refused creations")

	// A shared subscription has no assignment.
	x.createTopic("shared", pubSub(1))
	sh := x.subscribe("shared", "g", storage.StartPosition{})
	_, err = x.e.SubscriptionAssignment(x.ctx, sh.ID)
	errIs(t, err, storage.ErrInvalidArgument, "SubscriptionAssignment of a shared subscription")
	_, err = x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: sh.ID, Members: map[string][]int32{"a": {0}}})
	errIs(t, err, storage.ErrInvalidArgument, "SubscriptionAssign of a shared subscription")
}

func testOrderedAssignCAS(t *testing.T, x *env) {
	s := x.orderedSub("t", 3, 1, storage.TopicConfig{})
	a, err := x.e.SubscriptionAssignment(x.ctx, s.ID)
	noErr(t, err, "SubscriptionAssignment before any")
	equal(t, a.Generation, int64(0), "generation before any assignment")
	equal(t, len(a.Members), 0, "members before any assignment")

	// Refused assignments change nothing.
	for _, p := range []storage.SubscriptionAssignParams{
		{SubscriptionID: s.ID, Members: map[string][]int32{"a": {3}}},           // out of range
		{SubscriptionID: s.ID, Members: map[string][]int32{"a": {0}, "b": {0}}}, // twice
		{SubscriptionID: s.ID, Members: map[string][]int32{"a": {-1}}},
		{SubscriptionID: s.ID, Members: map[string][]int32{"": {0}}},
		{SubscriptionID: s.ID, Members: map[string][]int32{"a": {0}}, Strategy: "random"},
	} {
		_, err := x.e.SubscriptionAssign(x.ctx, &p)
		errIs(t, err, storage.ErrInvalidArgument, "SubscriptionAssign(%v)", p.Members)
	}
	_, err = x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: s.ID + 100, Members: map[string][]int32{"a": {0}}})
	errIs(t, err, storage.ErrSubscriptionNotFound, "SubscriptionAssign of an unknown subscription")

	a1 := x.assign(s.ID, 0, map[string][]int32{"a": {2, 0}, "b": {1}})
	deepEqual(t, a1.Members, map[string][]int32{"a": {0, 2}, "b": {1}}, "members of generation 1")
	deepEqual(t, a1.Since, []int64{1, 1, 1}, "since of generation 1")

	// Two rebalancers computed from generation 1: exactly one wins.
	a2 := x.assign(s.ID, 1, map[string][]int32{"a": {0}, "b": {1}, "c": {2}})
	_, err = x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: s.ID, Generation: 1,
		Members: map[string][]int32{"a": {0, 1, 2}}})
	errIs(t, err, storage.ErrStaleGeneration, "second assignment from generation 1")
	_, err = x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: s.ID, Generation: 7,
		Members: map[string][]int32{"a": {0, 1, 2}}})
	errIs(t, err, storage.ErrStaleGeneration, "assignment from a future generation")
	deepEqual(t, a2.Since, []int64{1, 1, 2}, "since keeps the generation of owners that kept their partition")
	got, err := x.e.SubscriptionAssignment(x.ctx, s.ID)
	noErr(t, err, "SubscriptionAssignment")
	deepEqual(t, got, a2, "assignment read back")

	// A strategy change is an assignment too.
	r3, err := x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: s.ID, Generation: 2,
		Members: a2.Members, Strategy: storage.StrategySticky})
	noErr(t, err, "SubscriptionAssign with a strategy")
	a3 := r3.Assignment
	equal(t, a3.Strategy, storage.StrategySticky, "strategy")
	equal(t, a3.Generation, int64(3), "generation")

	// A paused subscription may be rebalanced; a cancelled one has no delivery state left.
	x.setState(s.ID, storage.Paused)
	a4 := x.assign(s.ID, 3, map[string][]int32{"a": {0, 1, 2}})
	x.setState(s.ID, storage.Cancelled)
	_, err = x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: s.ID, Generation: a4.Generation,
		Members: map[string][]int32{"b": {0}}})
	errIs(t, err, storage.ErrSubscriptionNotActive, "SubscriptionAssign of a cancelled subscription")
}

// testOrderedOneOwner: each member gets only the partitions it owns, one message at a time, in
// offset order.
func testOrderedOneOwner(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 1, storage.TopicConfig{})
	x.publishN("t", 0, 5)
	x.publishN("t", 1, 5)
	// Before any assignment nothing is delivered.
	equal(t, len(x.claimG(s.ID, "a", 0, 10).Deliveries), 0, "claim before an assignment")
	a := x.assign(s.ID, 0, map[string][]int32{"a": {0}, "b": {1}})
	for want := int64(0); want < 5; want++ {
		for _, m := range []string{"a", "b"} {
			ds := x.claimG(s.ID, m, a.Generation, 10).Deliveries
			equal(t, len(ds), 1, "%s claims offset %d: one in flight", m, want)
			d := ds[0]
			equal(t, d.Partition, a.Members[m][0], "%s gets its own partition", m)
			equal(t, d.Offset, want, "%s gets the next offset", m)
			equal(t, d.Generation, a.Generation, "delivery generation")
			equal(t, len(x.claimG(s.ID, m, a.Generation, 10).Deliveries), 0, "%s: nothing more while %d is in flight", m, want)
			res, err := x.ackG(s.ID, m, a.Generation, d.Ref())
			noErr(t, err, "ack")
			equal(t, res.Acked, 1, "acked")
		}
	}
	equal(t, len(x.claimG(s.ID, "a", a.Generation, 10).Deliveries), 0, "drained")
	// A member that owns nothing gets nothing.
	a = x.assign(s.ID, a.Generation, map[string][]int32{"a": {0, 1}, "c": nil})
	x.publishN("t", 1, 1)
	equal(t, len(x.claimG(s.ID, "c", a.Generation, 10).Deliveries), 0, "member without partitions")
	ds := x.claimG(s.ID, "a", a.Generation, 10).Deliveries
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(1, 5)}, "a after taking partition 1")
}

func testOrderedNackBlocks(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 1, storage.TopicConfig{})
	x.publishN("t", 0, 3)
	a := x.assign(s.ID, 0, map[string][]int32{"a": {0}})
	d := x.claimG(s.ID, "a", 1, 10).Deliveries[0]
	equal(t, d.Offset, int64(0), "first")
	res, err := x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: a.Generation,
		Refs: []storage.DeliveryRef{d.Ref()}, Delay: 5 * time.Second})
	noErr(t, err, "nack")
	equal(t, res.Nacked, 1, "nacked")
	// The partition is blocked behind offset 0 until its delay ends.
	cr := x.claimG(s.ID, "a", 1, 10)
	equal(t, len(cr.Deliveries), 0, "no later offset before the nacked one")
	timeEqual(t, cr.NextDue, x.now().Add(5*time.Second), "NextDue is the nacked message's")
	x.advance(5 * time.Second)
	ds := x.claimG(s.ID, "a", 1, 10).Deliveries
	requireOffsets(t, ds, []int64{0}, "redelivery first")
	equal(t, ds[0].Attempt, 2, "attempt")
	_, err = x.ackG(s.ID, "a", 1, ds[0].Ref())
	noErr(t, err, "ack")
	requireOffsets(t, x.claimG(s.ID, "a", 1, 10).Deliveries, []int64{1}, "then the next offset")
}

func testOrderedExpiryBlocks(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 2, storage.TopicConfig{AckWait: 10 * time.Second})
	x.publishN("t", 0, 4)
	x.assign(s.ID, 0, map[string][]int32{"a": {0}})
	ds := x.claimG(s.ID, "a", 1, 10).Deliveries
	requireOffsets(t, ds, []int64{0, 1}, "two in flight")
	_, err := x.ackG(s.ID, "a", 1, ref(0, 1))
	noErr(t, err, "ack 1")
	// Offset 0's lease expires: its backoff (1 s) blocks the partition.
	x.advance(10 * time.Second)
	cr := x.claimG(s.ID, "a", 1, 10)
	equal(t, len(cr.Deliveries), 0, "nothing during the backoff of offset 0")
	timeEqual(t, cr.NextDue, x.now().Add(storage.RedeliveryBackoff(1)), "NextDue")
	x.advance(storage.RedeliveryBackoff(1))
	ds = x.claimG(s.ID, "a", 1, 10).Deliveries
	requireOffsets(t, ds, []int64{0, 2}, "offset 0 again, then the next one")
	equal(t, ds[0].Attempt, 2, "attempt of the redelivery")
}

func testOrderedMaxInFlight(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 3, storage.TopicConfig{})
	x.publishN("t", 0, 10)
	x.publishN("t", 1, 10)
	x.assign(s.ID, 0, map[string][]int32{"a": {0, 1}})
	ds := x.claimG(s.ID, "a", 1, 100).Deliveries
	equal(t, len(ds), 6, "three per partition")
	for _, d := range ds {
		isTrue(t, d.Offset < 3, "offset %d:%d within the first three", d.Partition, d.Offset)
	}
	// Nack 0:1; ack 0:0: one slot free, offset 1 goes first.
	_, err := x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: 1, Refs: []storage.DeliveryRef{ref(0, 1)}})
	noErr(t, err, "nack")
	_, err = x.ackG(s.ID, "a", 1, ref(0, 0))
	noErr(t, err, "ack")
	ds = x.claimG(s.ID, "a", 1, 100).Deliveries
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(0, 1), ref(0, 3)}, "redelivery, then the next offset in the free slot")
}

func testOrderedDLQMovesOn(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 1, storage.TopicConfig{MaxDeliveries: 2, AckWait: time.Second})
	x.publishN("t", 0, 3)
	x.assign(s.ID, 0, map[string][]int32{"a": {0}})
	d := x.claimG(s.ID, "a", 1, 10).Deliveries[0]
	_, err := x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: 1, Refs: []storage.DeliveryRef{d.Ref()}})
	noErr(t, err, "nack")
	ds := x.claimG(s.ID, "a", 1, 10).Deliveries
	requireOffsets(t, ds, []int64{0}, "second delivery of offset 0")
	// The second (last) lease expires: offset 0 goes to the DLQ and the partition moves on.
	x.advance(time.Second)
	ds = x.claimG(s.ID, "a", 1, 10).Deliveries
	requireOffsets(t, ds, []int64{1}, "the partition moved on")
	dl := x.dlq(s.ID)
	equal(t, len(dl), 1, "DLQ entries")
	equal(t, dl[0].Message.Offset, int64(0), "dead-lettered offset")
	// A nack to the DLQ moves it on too.
	_, err = x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: 1, Refs: RefsOf(ds), ToDLQ: true})
	noErr(t, err, "nack to the DLQ")
	ds = x.claimG(s.ID, "a", 1, 10).Deliveries
	requireOffsets(t, ds, []int64{2}, "after a rejected message")
	_, err = x.ackG(s.ID, "a", 1, RefsOf(ds)...)
	noErr(t, err, "ack 2")
	// A DLQ replay puts the copies back in offset order, before any later offset.
	x.publishN("t", 0, 1)
	n, err := x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: s.ID})
	noErr(t, err, "DLQReplay")
	equal(t, n, 2, "replayed")
	for _, want := range []int64{0, 1, 3} {
		ds = x.claimG(s.ID, "a", 1, 10).Deliveries
		requireOffsets(t, ds, []int64{want}, "after the replay")
		_, err = x.ackG(s.ID, "a", 1, RefsOf(ds)...)
		noErr(t, err, "ack %d", want)
	}
	equal(t, x.stats(s.ID).Pending, int64(0), "pending at the end")
}

// testOrderedFencing: a member that lost a partition can no longer ack, nack or extend its
// messages, nor claim with its old generation; one that kept it can.
func testOrderedFencing(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 1, storage.TopicConfig{})
	x.publishN("t", 0, 3)
	x.publishN("t", 1, 3)
	g1 := x.assign(s.ID, 0, map[string][]int32{"a": {0, 1}})
	ds := x.claimG(s.ID, "a", g1.Generation, 10).Deliveries
	equal(t, len(ds), 2, "one per partition")
	slices.SortFunc(ds, func(p, q *storage.Delivery) int { return int(p.Partition - q.Partition) })

	// b joins: partition 1 moves to b, a keeps partition 0.
	g2 := x.assign(s.ID, g1.Generation, map[string][]int32{"a": {0}, "b": {1}})
	_, err := x.ackG(s.ID, "a", g1.Generation, ds[1].Ref())
	errIs(t, err, storage.ErrStaleGeneration, "ack of a lost partition")
	_, err = x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: g1.Generation, Refs: []storage.DeliveryRef{ds[1].Ref()}})
	errIs(t, err, storage.ErrStaleGeneration, "nack of a lost partition")
	_, err = x.e.DeliveriesExtend(x.ctx, &storage.DeliveriesExtendParams{SubscriptionID: s.ID, Member: "a", Generation: g1.Generation, Refs: []storage.DeliveryRef{ds[1].Ref()}})
	errIs(t, err, storage.ErrStaleGeneration, "extend of a lost partition")
	// A request that mixes a kept and a lost partition changes nothing.
	_, err = x.ackG(s.ID, "a", g1.Generation, ds[0].Ref(), ds[1].Ref())
	errIs(t, err, storage.ErrStaleGeneration, "ack of a kept and a lost partition")
	_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "a", Max: 10, Generation: g1.Generation})
	errIs(t, err, storage.ErrStaleGeneration, "claim with the old generation")
	_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "a", Max: 10, Generation: g2.Generation + 1})
	errIs(t, err, storage.ErrStaleGeneration, "claim with a future generation")

	// The kept partition's delivery of generation 1 is still a's to ack.
	res, err := x.ackG(s.ID, "a", g1.Generation, ds[0].Ref())
	noErr(t, err, "ack of a kept partition with the generation of its delivery")
	equal(t, res.Acked, 1, "acked")
	// b starts at partition 1's ack floor: offset 0, whose lease a lost, at once.
	bd := x.claimG(s.ID, "b", g2.Generation, 10).Deliveries
	requireRefs(t, RefsOf(bd), []storage.DeliveryRef{ref(1, 0)}, "b's first delivery")
	equal(t, bd[0].Attempt, 2, "attempt after the lost lease")
	_, err = x.ackG(s.ID, "b", g1.Generation, bd[0].Ref())
	errIs(t, err, storage.ErrStaleGeneration, "ack with a generation older than the ownership")
	_, err = x.ackG(s.ID, "a", g2.Generation, bd[0].Ref())
	errIs(t, err, storage.ErrStaleGeneration, "ack by a non-owner")
	res, err = x.ackG(s.ID, "b", g2.Generation, bd[0].Ref())
	noErr(t, err, "b acks")
	equal(t, res.Acked, 1, "b acked")
	requireRefs(t, RefsOf(x.claimG(s.ID, "b", g2.Generation, 10).Deliveries), []storage.DeliveryRef{ref(1, 1)}, "b goes on")
	requireRefs(t, RefsOf(x.claimG(s.ID, "a", g2.Generation, 10).Deliveries), []storage.DeliveryRef{ref(0, 1)}, "a goes on")
}

// testOrderedMemberDeath: a member dies holding a message (its lease is released or expires); the
// partition's new owner gets that message first, then the rest in order.
func testOrderedMemberDeath(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 2, storage.TopicConfig{AckWait: 30 * time.Second})
	x.publishN("t", 0, 5)
	g1 := x.assign(s.ID, 0, map[string][]int32{"a": {0}})
	ds := x.claimG(s.ID, "a", g1.Generation, 10).Deliveries
	requireOffsets(t, ds, []int64{0, 1}, "a's deliveries")
	_, err := x.ackG(s.ID, "a", g1.Generation, ref(0, 1))
	noErr(t, err, "a acks 1 but not 0")
	// a dies: the broker reassigns its partition to b (without releasing first).
	g2 := x.assign(s.ID, g1.Generation, map[string][]int32{"b": {0}})
	ds = x.claimG(s.ID, "b", g2.Generation, 10).Deliveries
	requireOffsets(t, ds, []int64{0, 2}, "b starts at the ack floor, skipping the acked offset")
	_, err = x.ackG(s.ID, "b", g2.Generation, RefsOf(ds)...)
	noErr(t, err, "b acks")
	// b dies holding 3 and 4 and is noticed only after their leases ran out (no claim processed
	// the expiry): the reassignment gives them to c at once, in order, with their attempts.
	ds = x.claimG(s.ID, "b", g2.Generation, 10).Deliveries
	requireOffsets(t, ds, []int64{3, 4}, "b's next")
	x.advance(30 * time.Second)
	g3 := x.assign(s.ID, g2.Generation, map[string][]int32{"c": {0}})
	ds = x.claimG(s.ID, "c", g3.Generation, 10).Deliveries
	requireOffsets(t, ds, []int64{3, 4}, "c gets them in order")
	requireAttempts(t, ds, 2, "c's deliveries")
	_, err = x.ackG(s.ID, "c", g3.Generation, RefsOf(ds)...)
	noErr(t, err, "c acks")
	// c's connection dies: the broker releases its leases, then rebalances to d.
	x.publishN("t", 0, 3)
	requireOffsets(t, x.claimG(s.ID, "c", g3.Generation, 10).Deliveries, []int64{5, 6}, "c's next")
	x.release(s.ID, "c")
	g4 := x.assign(s.ID, g3.Generation, map[string][]int32{"d": {0}})
	ds = x.claimG(s.ID, "d", g4.Generation, 10).Deliveries
	requireOffsets(t, ds, []int64{5, 6}, "d gets the released messages first, in order")
	requireAttempts(t, ds, 2, "d's deliveries")
}

// testOrderedRebalanceDLQ: a rebalance that moves a partition dead-letters its leases on their
// max_deliveries-th delivery (a message's and a replayed DLQ copy's) and counts them in its
// result; a lease in a partition that keeps its owner stays and is not counted.
func testOrderedRebalanceDLQ(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 1, storage.TopicConfig{MaxDeliveries: 1, AckWait: time.Minute})
	x.publishN("t", 0, 2)
	x.publishN("t", 1, 1)
	g1 := x.assign(s.ID, 0, map[string][]int32{"a": {0, 1}})
	ds := x.claimG(s.ID, "a", g1.Generation, 10).Deliveries
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(0, 0), ref(1, 0)}, "a's deliveries, each on its last attempt")
	// Partition 0 moves to b, partition 1 stays with a.
	r2 := x.assignR(s.ID, g1.Generation, map[string][]int32{"a": {1}, "b": {0}})
	equal(t, r2.DeadLettered, 1, "DeadLettered of the rebalance that moved partition 0")
	dl := x.dlq(s.ID)
	equal(t, len(dl), 1, "DLQ entries after the rebalance")
	equal(t, dl[0].Message.Partition, int32(0), "dead-lettered partition")
	equal(t, dl[0].Message.Offset, int64(0), "dead-lettered offset")
	equal(t, dl[0].Reason, storage.DLQMaxDeliveries, "reason")
	g2 := r2.Assignment
	ds = x.claimG(s.ID, "b", g2.Generation, 10).Deliveries
	requireOffsets(t, ds, []int64{1}, "b starts after the dead-lettered offset")
	_, err := x.ackG(s.ID, "b", g2.Generation, RefsOf(ds)...)
	noErr(t, err, "b acks")
	_, err = x.ackG(s.ID, "a", g2.Generation, ref(1, 0))
	noErr(t, err, "a acks the lease it kept")

	// A replayed copy leased on its last attempt goes back to the DLQ when its partition moves.
	n, err := x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: s.ID})
	noErr(t, err, "DLQReplay")
	equal(t, n, 1, "replayed")
	ds = x.claimG(s.ID, "b", g2.Generation, 10).Deliveries
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(0, 0)}, "b gets the replayed copy")
	r3 := x.assignR(s.ID, g2.Generation, map[string][]int32{"a": {1}, "c": {0}})
	equal(t, r3.DeadLettered, 1, "DeadLettered of the rebalance that moved the replayed copy")
	equal(t, len(x.dlq(s.ID)), 1, "DLQ entries after the second rebalance")
	equal(t, len(x.claimG(s.ID, "c", r3.Assignment.Generation, 10).Deliveries), 0, "c has nothing to get")

	// A rebalance that moves no lease dead-letters nothing.
	r4 := x.assignR(s.ID, r3.Assignment.Generation, map[string][]int32{"a": {0, 1}})
	equal(t, r4.DeadLettered, 0, "DeadLettered of a rebalance without leases")
}

func testOrderedRestart(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 1, storage.TopicConfig{})
	x.publishN("t", 0, 3)
	x.publishN("t", 1, 3)
	g1 := x.assign(s.ID, 0, map[string][]int32{"a": {0}, "b": {1}})
	g2 := x.assign(s.ID, g1.Generation, map[string][]int32{"a": {0}, "b": {1}, "c": nil})
	da := x.claimG(s.ID, "a", g2.Generation, 10).Deliveries
	requireOffsets(t, da, []int64{0}, "a")
	db := x.claimG(s.ID, "b", g2.Generation, 10).Deliveries
	requireOffsets(t, db, []int64{0}, "b")
	_, err := x.ackG(s.ID, "b", g2.Generation, db[0].Ref())
	noErr(t, err, "b acks")
	_, err = x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: g2.Generation,
		Refs: []storage.DeliveryRef{da[0].Ref()}, Delay: time.Minute})
	noErr(t, err, "a nacks")

	x.restart()
	got := x.getSub(s.ID)
	equal(t, got.Ordering(), s.Ordering(), "ordering after restart")
	a, err := x.e.SubscriptionAssignment(x.ctx, s.ID)
	noErr(t, err, "SubscriptionAssignment after restart")
	deepEqual(t, a, g2, "assignment after restart")
	_, err = x.e.SubscriptionAssign(x.ctx, &storage.SubscriptionAssignParams{SubscriptionID: s.ID, Generation: g1.Generation, Members: g1.Members})
	errIs(t, err, storage.ErrStaleGeneration, "assignment from generation 1 after restart")
	_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "a", Max: 10, Generation: g1.Generation})
	errIs(t, err, storage.ErrStaleGeneration, "claim with generation 1 after restart")

	// Partition 0 is still blocked behind the nacked offset 0; partition 1 goes on at 1.
	equal(t, len(x.claimG(s.ID, "a", g2.Generation, 10).Deliveries), 0, "a: offset 0 still waits")
	requireOffsets(t, x.claimG(s.ID, "b", g2.Generation, 10).Deliveries, []int64{1}, "b after restart")
	x.advance(time.Minute)
	requireOffsets(t, x.claimG(s.ID, "a", g2.Generation, 10).Deliveries, []int64{0}, "a after the delay")

	// A restart with a lease out: the lease is lost, the message comes back first.
	x.restart()
	g3 := x.assign(s.ID, g2.Generation, map[string][]int32{"c": {0, 1}})
	equal(t, g3.Generation, int64(3), "generation continues after restarts")
	ds := x.claimG(s.ID, "c", g3.Generation, 10).Deliveries
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(0, 0), ref(1, 1)}, "c starts at the ack floors")
}

// testOrderedRandomized drives an ordered group through random joins, leaves, claims, acks,
// nacks, expiries and (engine permitting) restarts, and checks after every claim that each
// delivery went to its partition's owner and was the partition's lowest offset not yet acked
// (max_in_flight_per_partition 1), and in the end that every message was acked exactly once.
func testOrderedRandomized(t *testing.T, x *env) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const parts, perPart = 4, 30
	s := x.orderedSub("t", parts, 1, storage.TopicConfig{AckWait: 10 * time.Second, MaxDeliveries: 1000})
	for p := range int32(parts) {
		x.publishN("t", p, perPart)
	}
	pool := []string{"m0", "m1", "m2", "m3", "m4"}
	members := []string{}
	var cur *storage.Assignment
	acked := make([][]bool, parts)
	for p := range acked {
		acked[p] = make([]bool, perPart)
	}
	lowest := func(p int32) int64 {
		for o, done := range acked[p] {
			if !done {
				return int64(o)
			}
		}
		return perPart
	}
	type held struct {
		d   *storage.Delivery
		gen int64
	}
	holding := map[string][]held{}
	done, stale, rebalances, restarts := 0, 0, 0, 0
	rebalance := func() {
		// Round-robin over the sorted members, from the current generation.
		slices.Sort(members)
		m := map[string][]int32{}
		for _, id := range members {
			m[id] = nil
		}
		if len(members) > 0 {
			for p := range int32(parts) {
				id := members[(int(p)+rng.IntN(2))%len(members)]
				m[id] = append(m[id], p)
			}
		}
		gen := int64(0)
		if cur != nil {
			gen = cur.Generation
		}
		cur = x.assign(s.ID, gen, m)
		rebalances++
	}
	owner := func(p int32) string { return cur.Owner(p) }
	for step := 0; step < 3000 && done < parts*perPart; step++ {
		switch r := rng.IntN(100); {
		case r < 8: // join
			if len(members) < len(pool) {
				for _, id := range pool {
					if !slices.Contains(members, id) {
						members = append(members, id)
						break
					}
				}
				rebalance()
			}
		case r < 14: // leave (or death): the broker rebalances without it
			if len(members) > 1 {
				i := rng.IntN(len(members))
				members = slices.Delete(members, i, i+1)
				rebalance()
			}
		case r < 18: // time passes: leases expire
			x.advance(time.Duration(rng.IntN(15)) * time.Second)
		case r < 20 && x.caps.Restart:
			x.restart()
			restarts++
			holding = map[string][]held{} // their leases are gone
		case r < 60: // a member claims
			if cur == nil || len(members) == 0 {
				continue
			}
			m := members[rng.IntN(len(members))]
			ds := x.claimG(s.ID, m, cur.Generation, 1+rng.IntN(4)).Deliveries
			perPartition := map[int32]int{}
			for _, d := range ds {
				isTrue(t, owner(d.Partition) == m, "step %d: %d:%d delivered to %q, owner %q", step, d.Partition, d.Offset, m, owner(d.Partition))
				equal(t, d.Offset, lowest(d.Partition), "step %d: offset delivered from partition %d", step, d.Partition)
				perPartition[d.Partition]++
				isTrue(t, perPartition[d.Partition] == 1, "step %d: two deliveries of partition %d in one claim", step, d.Partition)
				holding[m] = append(holding[m], held{d, cur.Generation})
			}
		default: // a member acks or nacks one of its deliveries
			if len(members) == 0 {
				continue
			}
			m := members[rng.IntN(len(members))]
			hs := holding[m]
			if len(hs) == 0 {
				continue
			}
			i := rng.IntN(len(hs))
			h := hs[i]
			holding[m] = slices.Delete(hs, i, i+1)
			p := h.d.Partition
			fresh := owner(p) == m && h.gen >= cur.Since[p]
			if rng.IntN(4) == 0 {
				_, err := x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: m, Generation: h.gen,
					Refs: []storage.DeliveryRef{h.d.Ref()}})
				if !fresh {
					stale++
					errIs(t, err, storage.ErrStaleGeneration, "step %d: nack of %d:%d by %q (gen %d)", step, p, h.d.Offset, m, h.gen)
				} else {
					noErr(t, err, "step %d: nack", step)
				}
				continue
			}
			res, err := x.ackG(s.ID, m, h.gen, h.d.Ref())
			if !fresh {
				stale++
				errIs(t, err, storage.ErrStaleGeneration, "step %d: ack of %d:%d by %q (gen %d)", step, p, h.d.Offset, m, h.gen)
				continue
			}
			noErr(t, err, "step %d: ack", step)
			if res.Acked == 1 {
				isTrue(t, !acked[p][h.d.Offset], "step %d: %d:%d acked twice", step, p, h.d.Offset)
				acked[p][h.d.Offset] = true
				done++
			}
		}
	}
	t.Logf("random phase: %d of %d acked, %d rebalances, %d restarts, %d stale requests refused",
		done, parts*perPart, rebalances, restarts, stale)
	// Drain: one member takes everything; no message is lost.
	members = []string{"last"}
	rebalance()
	for range parts*perPart + 10 {
		ds := x.claimG(s.ID, "last", cur.Generation, parts).Deliveries
		if len(ds) == 0 {
			x.advance(10 * time.Minute) // backoffs of nacked or expired messages
			if done == parts*perPart {
				break
			}
			continue
		}
		for _, d := range ds {
			equal(t, d.Offset, lowest(d.Partition), "drain: offset delivered from partition %d", d.Partition)
			res, err := x.ackG(s.ID, "last", cur.Generation, d.Ref())
			noErr(t, err, "drain: ack")
			equal(t, res.Acked, 1, "drain: acked %d:%d", d.Partition, d.Offset)
			acked[d.Partition][d.Offset] = true
			done++
		}
	}
	equal(t, done, parts*perPart, "messages acked exactly once")
	st := x.stats(s.ID)
	equal(t, st.Pending, int64(0), "pending at the end")
}

// testOrderedMemberLiveness: SubscriptionMembersRenew keeps a member live for its TTL from the
// last renewal (any caller's: on PostgreSQL several broker instances renew their own members of
// one group), a member past it or never renewed is not live, and what is not a subscription in
// force is skipped.
func testOrderedMemberLiveness(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 1, storage.TopicConfig{})
	s2 := x.orderedSub("u", 1, 1, storage.TopicConfig{})
	x.createTopic("shared", pubSub(1))
	sh := x.subscribe("shared", "g", storage.StartPosition{})
	renew := func(ttl time.Duration, subs []int64, ms ...storage.MemberRef) map[int64][]string {
		t.Helper()
		res, err := x.e.SubscriptionMembersRenew(x.ctx, &storage.SubscriptionMembersRenewParams{Members: ms, Subscriptions: subs, TTL: ttl})
		noErr(t, err, "SubscriptionMembersRenew(%v, %v, %s)", ms, subs, ttl)
		return res.Live
	}
	m := func(sub int64, name string) storage.MemberRef {
		return storage.MemberRef{SubscriptionID: sub, Member: name}
	}

	// Bad input is refused and records nothing.
	many := make([]storage.MemberRef, storage.MaxRenewMembers+1)
	for i := range many {
		many[i] = m(s.ID, "x")
	}
	for _, p := range []storage.SubscriptionMembersRenewParams{
		{Members: []storage.MemberRef{m(s.ID, "x")}},
		{Members: []storage.MemberRef{m(s.ID, "x")}, TTL: storage.MaxMemberTTL + time.Second},
		{Members: []storage.MemberRef{m(s.ID, "")}, TTL: time.Minute},
		{Members: many, TTL: time.Minute},
	} {
		_, err := x.e.SubscriptionMembersRenew(x.ctx, &p)
		errIs(t, err, storage.ErrInvalidArgument, "SubscriptionMembersRenew(%d members, TTL %s)", len(p.Members), p.TTL)
	}
	_, err := x.e.SubscriptionMembersRenew(x.ctx, nil)
	errIs(t, err, storage.ErrInvalidArgument, "SubscriptionMembersRenew(nil)")
	deepEqual(t, renew(time.Minute, []int64{s.ID, s2.ID}), map[int64][]string{s.ID: {}, s2.ID: {}}, "live before any renewal")

	// Two callers (broker instances) renew their members with their own TTLs.
	deepEqual(t, renew(30*time.Second, nil, m(s.ID, "b"), m(s.ID, "a"), m(s.ID, "a")), map[int64][]string{s.ID: {"a", "b"}}, "live after the first renewal")
	deepEqual(t, renew(10*time.Second, nil, m(s.ID, "c")), map[int64][]string{s.ID: {"a", "b", "c"}}, "live after the second")
	// Unknown subscriptions are skipped, others not affected; shared ones have records too
	// (member filters).
	deepEqual(t, renew(time.Minute, []int64{s2.ID}, m(sh.ID, "x"), m(s.ID+100, "y")), map[int64][]string{s2.ID: {}, sh.ID: {"x"}}, "live of the other subscriptions")

	// c expires 10 s after its renewal (exactly then: an expiry is not live), a and b go on.
	x.advance(10 * time.Second)
	deepEqual(t, renew(time.Minute, []int64{s.ID}), map[int64][]string{s.ID: {"a", "b"}}, "live when c expired")
	// A renewal brings c back (its instance was only slow); a renewal extends from now.
	deepEqual(t, renew(10*time.Second, nil, m(s.ID, "c")), map[int64][]string{s.ID: {"a", "b", "c"}}, "c renewed")
	x.advance(15 * time.Second)
	deepEqual(t, renew(time.Minute, []int64{s.ID}), map[int64][]string{s.ID: {"a", "b"}}, "live at 25 s")
	deepEqual(t, renew(20*time.Second, nil, m(s.ID, "a")), map[int64][]string{s.ID: {"a", "b"}}, "a renewed at 25 s")
	x.advance(5 * time.Second)
	deepEqual(t, renew(time.Minute, []int64{s.ID}), map[int64][]string{s.ID: {"a"}}, "live at 30 s: b expired")
	x.advance(20 * time.Second)
	deepEqual(t, renew(time.Minute, []int64{s.ID}), map[int64][]string{s.ID: {}}, "live at 50 s: none")

	// A cancelled subscription is skipped.
	x.setState(s.ID, storage.Cancelled)
	deepEqual(t, renew(time.Minute, []int64{s2.ID}, m(s.ID, "a")), map[int64][]string{s2.ID: {}}, "live after the cancel")
}

// testMemberRecords: the liveness records of a shared subscription's members carry the renewing
// instance and the member's filter (member filters with several broker instances); a renewal
// by another instance takes a record over; Forget removes only the forgetting instance's
// records; an expired record is gone with its filter; bad input changes nothing.
func testMemberRecords(t *testing.T, x *env) {
	x.createTopic("f", pubSub(1))
	sh := x.subscribe("f", "g", storage.StartPosition{})
	renew := func(p storage.SubscriptionMembersRenewParams) []storage.MemberRecord {
		t.Helper()
		p.Subscriptions = []int64{sh.ID}
		if p.TTL == 0 {
			p.TTL = 10 * time.Second
		}
		res, err := x.e.SubscriptionMembersRenew(x.ctx, &p)
		noErr(t, err, "SubscriptionMembersRenew(%+v)", p)
		return res.Records[sh.ID]
	}
	m := func(name, filter string) storage.MemberRef {
		return storage.MemberRef{SubscriptionID: sh.ID, Member: name, Filter: filter}
	}
	rec := func(name, inst, filter string) storage.MemberRecord {
		return storage.MemberRecord{Member: name, Instance: inst, Filter: filter}
	}
	deepEqual(t, renew(storage.SubscriptionMembersRenewParams{}), []storage.MemberRecord{}, "no record yet")
	renew(storage.SubscriptionMembersRenewParams{Instance: "A", Members: []storage.MemberRef{m("a1", "region=eu"), m("a2", "")}})
	got := renew(storage.SubscriptionMembersRenewParams{Instance: "B", Members: []storage.MemberRef{m("b1", "region=us")}, TTL: 5 * time.Second})
	deepEqual(t, got, []storage.MemberRecord{rec("a1", "A", "region=eu"), rec("a2", "A", ""), rec("b1", "B", "region=us")}, "records of two instances")

	// B forgetting A's member changes nothing; A forgetting it removes it; a filter changes.
	renew(storage.SubscriptionMembersRenewParams{Instance: "B", Forget: []storage.MemberRef{m("a2", "")}})
	got = renew(storage.SubscriptionMembersRenewParams{Instance: "A", Forget: []storage.MemberRef{m("a2", "")}, Members: []storage.MemberRef{m("a1", "region in (eu, uk)")}})
	deepEqual(t, got, []storage.MemberRecord{rec("a1", "A", "region in (eu, uk)"), rec("b1", "B", "region=us")}, "after A forgot a2")

	// Member IDs are unique per instance only: B's a1 has its own record beside A's (neither
	// overwrites the other), is listed live once, and B forgetting it leaves A's.
	res, err := x.e.SubscriptionMembersRenew(x.ctx, &storage.SubscriptionMembersRenewParams{Instance: "B",
		Members: []storage.MemberRef{m("a1", "region=us")}, TTL: 5 * time.Second})
	noErr(t, err, "SubscriptionMembersRenew(B's a1)")
	deepEqual(t, res.Live[sh.ID], []string{"a1", "b1"}, "live members with one ID on two instances")
	deepEqual(t, res.Records[sh.ID], []storage.MemberRecord{rec("a1", "A", "region in (eu, uk)"), rec("a1", "B", "region=us"), rec("b1", "B", "region=us")},
		"records of one member ID on two instances")
	got = renew(storage.SubscriptionMembersRenewParams{Instance: "B", Forget: []storage.MemberRef{m("a1", "")}})
	deepEqual(t, got, []storage.MemberRecord{rec("a1", "A", "region in (eu, uk)"), rec("b1", "B", "region=us")}, "after B forgot its a1")

	// B stops renewing: past its TTL its record, filter included, is gone.
	x.advance(5 * time.Second)
	deepEqual(t, renew(storage.SubscriptionMembersRenewParams{}), []storage.MemberRecord{rec("a1", "A", "region in (eu, uk)")}, "after B expired")

	// Bad input is refused and records nothing.
	long := strings.Repeat("x", storage.MaxMemberFilterLen+1)
	for _, p := range []storage.SubscriptionMembersRenewParams{
		{Instance: "A", Members: []storage.MemberRef{m("z", long)}, TTL: time.Minute},
		{Instance: strings.Repeat("i", storage.MaxGroupNameLen+1), Members: []storage.MemberRef{m("z", "")}, TTL: time.Minute},
		{Instance: "A", Forget: make([]storage.MemberRef, storage.MaxRenewMembers+1), TTL: time.Minute},
	} {
		_, err := x.e.SubscriptionMembersRenew(x.ctx, &p)
		errIs(t, err, storage.ErrInvalidArgument, "SubscriptionMembersRenew with bad input")
	}
	deepEqual(t, renew(storage.SubscriptionMembersRenewParams{}), []storage.MemberRecord{rec("a1", "A", "region in (eu, uk)")}, "after the refused calls")
}

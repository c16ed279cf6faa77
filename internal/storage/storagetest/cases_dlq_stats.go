package storagetest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func dlqCases() []testCase {
	return []testCase{
		{name: "list_paging", fn: testDLQPaging},
		{name: "list_bounded_in_bytes", fn: testDLQListBoundedInBytes},
		{name: "replay_to_that_subscription_only", fn: testDLQReplay},
		{name: "replay_all", fn: testDLQReplayAll},
		{name: "purge", fn: testDLQPurge},
	}
}

func statsCases() []testCase {
	return []testCase{
		{name: "scenario", fn: testStatsScenario},
		{name: "partitions", fn: testStatsPartitions},
	}
}

// deadLetter claims n messages of a subscription and nacks them to the DLQ one by one, in offset
// order, with reasons "reason-<offset>".
func (x *env) deadLetter(sub int64, n int) {
	x.t.Helper()
	ds := x.claim(sub, "dl", n)
	equal(x.t, len(ds), n, "claimed for the DLQ")
	for _, d := range ds {
		res := x.nack(storage.DeliveriesNackParams{SubscriptionID: sub, Member: "dl", Refs: []storage.DeliveryRef{d.Ref()},
			ToDLQ: true, Reason: fmt.Sprintf("reason-%d", d.Offset)})
		equal(x.t, res.DeadLettered, 1, "dead-lettered %d", d.Offset)
		x.advance(time.Millisecond)
	}
}

func testDLQPaging(t *testing.T, x *env) {
	q := x.queueTopic("dlqp", 0, 0, 5)
	x.deadLetter(q.ID, 5)
	all, err := x.e.DLQList(x.ctx, &storage.DLQListParams{SubscriptionID: q.ID})
	noErr(t, err, "DLQList with Limit 0")
	equal(t, len(all), 5, "Limit 0 means 100")
	for i, en := range all {
		equal(t, en.Message.Offset, int64(i), "entry %d in ID order (dead-letter order)", i)
		equal(t, en.LastError, fmt.Sprintf("reason-%d", i), "last error of entry %d", i)
		if i > 0 {
			isTrue(t, en.ID > all[i-1].ID, "IDs increase: %d after %d", en.ID, all[i-1].ID)
		}
	}
	var got []int64
	var after int64
	for page := 0; ; page++ {
		entries, err := x.e.DLQList(x.ctx, &storage.DLQListParams{SubscriptionID: q.ID, AfterID: after, Limit: 2})
		noErr(t, err, "DLQList page %d", page)
		isTrue(t, len(entries) <= 2, "page %d has %d entries, Limit 2", page, len(entries))
		if len(entries) == 0 {
			break
		}
		for _, en := range entries {
			got = append(got, en.ID)
		}
		after = entries[len(entries)-1].ID
	}
	var want []int64
	for _, en := range all {
		want = append(want, en.ID)
	}
	deepEqual(t, got, want, "paging with AfterID and Limit visits every entry once, in order")
	_, err = x.e.DLQList(x.ctx, &storage.DLQListParams{SubscriptionID: q.ID + 1000})
	errIs(t, err, storage.ErrSubscriptionNotFound, "DLQList of an unknown subscription")
}

func testDLQReplay(t *testing.T, x *env) {
	x.createTopic("dlqr", pubSub(1))
	a := x.subscribe("dlqr", "a", fromBeginning)
	b := x.subscribe("dlqr", "b", fromBeginning)
	x.publishN("dlqr", 0, 2)
	ds := x.claim(a.ID, "ma", 2)
	requireOffsets(t, ds, []int64{0, 1}, "a claims")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: a.ID, Member: "ma", Refs: []storage.DeliveryRef{ds[0].Ref()}, ToDLQ: true, Reason: "bad"})
	x.ack(a.ID, "ma", ds[1].Ref())
	x.drain(b.ID, "mb")
	entries := x.dlq(a.ID)
	equal(t, len(entries), 1, "a's DLQ")
	equal(t, len(x.dlq(b.ID)), 0, "b's DLQ")
	x.publishN("dlqr", 0, 1)

	n, err := x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: a.ID, IDs: []int64{entries[0].ID}})
	noErr(t, err, "DLQReplay")
	equal(t, n, 1, "replayed")
	equal(t, len(x.dlq(a.ID)), 0, "a's DLQ after replay")
	x.requireStats(a.ID, wantStats{pending: 2, lag: 1, redelivering: 1}, "a after replay")
	ds = x.claim(a.ID, "ma", 1)
	requireOffsets(t, ds, []int64{0}, "the replayed message is due at once and goes before the new message")
	equal(t, ds[0].Attempt, 1, "a replayed message starts a fresh attempt count")
	equal(t, string(ds[0].Payload), "payload-1", "payload")
	requireOffsets(t, x.drain(b.ID, "mb"), []int64{2}, "group b does not get the replayed message again")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: a.ID, Member: "ma", Refs: []storage.DeliveryRef{ref(0, 0)}, ToDLQ: true, Reason: "still bad"})
	again := x.dlq(a.ID)
	equal(t, len(again), 1, "dead-lettered again")
	isTrue(t, again[0].ID > entries[0].ID, "a new DLQ entry ID: %d after %d", again[0].ID, entries[0].ID)
	equal(t, again[0].Attempts, 1, "attempts since the replay")
	n, err = x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: a.ID, IDs: []int64{entries[0].ID}})
	noErr(t, err, "DLQReplay of an ID no longer in the DLQ")
	equal(t, n, 0, "nothing replayed")
	x.drain(a.ID, "ma")
	x.requireStats(a.ID, wantStats{dead: 1}, "a at the end")
	x.requireStats(b.ID, wantStats{}, "b at the end")
}

func testDLQReplayAll(t *testing.T, x *env) {
	q := x.queueTopic("dlqra", 0, 0, 3)
	x.deadLetter(q.ID, 3)
	x.requireStats(q.ID, wantStats{dead: 3}, "before replay")
	n, err := x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: q.ID})
	noErr(t, err, "DLQReplay all")
	equal(t, n, 3, "replayed")
	x.requireStats(q.ID, wantStats{pending: 3, redelivering: 3}, "after replay")
	ds := x.claimAll(q.ID, "m1")
	requireRefs(t, RefsOf(ds), refSpan(0, 0, 3), "replayed messages")
	requireAttempts(t, ds, 1, "replayed messages")
	x.ack(q.ID, "m1", RefsOf(ds)...)
	x.requireStats(q.ID, wantStats{}, "after acking the replayed messages")
}

func testDLQPurge(t *testing.T, x *env) {
	q := x.queueTopic("dlqpu", 0, 0, 4)
	x.deadLetter(q.ID, 4)
	entries := x.dlq(q.ID)
	n, err := x.e.DLQPurge(x.ctx, &storage.DLQPurgeParams{SubscriptionID: q.ID, IDs: []int64{entries[1].ID, entries[3].ID}})
	noErr(t, err, "DLQPurge some")
	equal(t, n, 2, "purged")
	left := x.dlq(q.ID)
	equal(t, len(left), 2, "left")
	equal(t, left[0].ID, entries[0].ID, "first left")
	equal(t, left[1].ID, entries[2].ID, "second left")
	x.requireStats(q.ID, wantStats{dead: 2}, "after purging two")
	n, err = x.e.DLQPurge(x.ctx, &storage.DLQPurgeParams{SubscriptionID: q.ID, IDs: []int64{entries[1].ID + 1_000_000}})
	noErr(t, err, "DLQPurge of an unknown ID")
	equal(t, n, 0, "purged")
	n, err = x.e.DLQPurge(x.ctx, &storage.DLQPurgeParams{SubscriptionID: q.ID})
	noErr(t, err, "DLQPurge all")
	equal(t, n, 2, "purged")
	equal(t, len(x.dlq(q.ID)), 0, "DLQ after purging all")
	x.requireStats(q.ID, wantStats{}, "after purging all")
	x.requireFloor(q.ID, 0, 4, 4, "purged messages stay done")
	x.advance(time.Hour)
	equal(t, len(x.claimAll(q.ID, "m1")), 0, "purged messages are not redelivered")
}

func testStatsScenario(t *testing.T, x *env) {
	q := x.queueTopic("stats", 10*time.Second, 5, 10)
	floor := func(f, c int64, what string) { x.t.Helper(); x.requireFloor(q.ID, 0, f, c, what) }
	x.requireStats(q.ID, wantStats{pending: 10, lag: 10}, "S0 published 10")
	floor(0, 0, "S0")
	requireOffsets(t, x.claim(q.ID, "m1", 4), []int64{0, 1, 2, 3}, "claim 4")
	x.requireStats(q.ID, wantStats{pending: 10, lag: 6, inFlight: 4}, "S1 claimed 4")
	floor(0, 4, "S1")
	x.ack(q.ID, "m1", ref(0, 0))
	x.requireStats(q.ID, wantStats{pending: 9, lag: 6, inFlight: 3}, "S2 acked 0")
	floor(1, 4, "S2")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 1)}})
	x.requireStats(q.ID, wantStats{pending: 9, lag: 6, inFlight: 2, redelivering: 1}, "S3 nacked 1")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 2)}, ToDLQ: true})
	x.requireStats(q.ID, wantStats{pending: 8, lag: 6, inFlight: 1, redelivering: 1, dead: 1}, "S4 dead-lettered 2")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 3)}, Delay: time.Minute})
	x.requireStats(q.ID, wantStats{pending: 8, lag: 6, redelivering: 2, dead: 1}, "S5 nacked 3 with a delay")
	floor(1, 4, "S5")
	ds := x.claim(q.ID, "m2", 2)
	requireOffsets(t, ds, []int64{1, 4}, "the due redelivery first, then a new message")
	equal(t, ds[0].Attempt, 2, "attempt of the redelivery")
	x.requireStats(q.ID, wantStats{pending: 8, lag: 5, inFlight: 2, redelivering: 1, dead: 1}, "S6 claimed 1 and 4")
	x.ack(q.ID, "m2", ref(0, 1), ref(0, 4))
	x.requireStats(q.ID, wantStats{pending: 6, lag: 5, redelivering: 1, dead: 1}, "S7 acked 1 and 4")
	floor(3, 5, "S7: 0, 1, 2 done; 3 waits")
	x.advance(time.Minute)
	ds = x.claim(q.ID, "m1", 10)
	requireOffsets(t, ds, []int64{3, 5, 6, 7, 8, 9}, "the delayed redelivery, then the rest")
	x.requireStats(q.ID, wantStats{pending: 6, inFlight: 6, dead: 1}, "S8 everything leased")
	floor(3, 10, "S8")
	x.ack(q.ID, "m1", RefsOf(ds)...)
	x.requireStats(q.ID, wantStats{dead: 1}, "S9 everything done")
	floor(10, 10, "S9")
	x.publishN("stats", 0, 2)
	x.requireStats(q.ID, wantStats{pending: 2, lag: 2, dead: 1}, "S10 two more")
	equal(t, partStats(t, x.stats(q.ID), 0).HighWater, int64(12), "high water")
	equal(t, x.topicStats("stats").Messages, int64(12), "topic messages")
}

func testStatsPartitions(t *testing.T, x *env) {
	x.createTopic("sp", storage.TopicConfig{Partitions: 2})
	q := x.queueSub("sp")
	x.publish("sp", toPartition(0, "a"), toPartition(0, "b"), toPartition(0, "c"), toPartition(1, "d"), toPartition(1, "e"))
	ds := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: 10, Partitions: []int32{0}}).Deliveries
	requireOffsets(t, ds, []int64{0, 1, 2}, "partition 0")
	x.ack(q.ID, "m1", ds[0].Ref(), ds[1].Ref())
	st := x.requireStats(q.ID, wantStats{pending: 3, lag: 2, inFlight: 1}, "two partitions")
	equal(t, partStats(t, st, 0), storage.SubscriptionPartitionStats{Partition: 0, AckFloor: 2, Cursor: 3, HighWater: 3}, "partition 0")
	equal(t, partStats(t, st, 1), storage.SubscriptionPartitionStats{Partition: 1, AckFloor: 0, Cursor: 0, HighWater: 2}, "partition 1")
	_, err := x.e.SubscriptionStats(x.ctx, q.ID+1000)
	errIs(t, err, storage.ErrSubscriptionNotFound, "stats of an unknown subscription")
}

// testDLQListBoundedInBytes: a DLQ list stops before the entry whose message would take it past
// storage.ReadBatchBytes, whatever Limit asks, but returns at least one entry (one larger than
// the bound alone); listing on after the last entry returned continues.
func testDLQListBoundedInBytes(t *testing.T, x *env) {
	const mib = 1 << 20
	x.createTopic("dlqb", storage.TopicConfig{MaxMessageBytes: storage.MaxMessageBytesLimit})
	sizes := []int{mib, mib, mib, mib, mib, 5 * mib, 10, 10}
	for _, n := range sizes { // one at a time: a batch is bounded too
		x.publish("dlqb", storage.AppendMessage{Partition: 0, Payload: bytes.Repeat([]byte{'x'}, n)})
	}
	q := x.queueSub("dlqb")
	ds := x.claimAll(q.ID, "dl")
	equal(t, len(ds), len(sizes), "claimed for the DLQ")
	for _, d := range ds {
		res := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "dl", Refs: []storage.DeliveryRef{d.Ref()}, ToDLQ: true, Reason: "big"})
		equal(t, res.DeadLettered, 1, "dead-lettered %d", d.Offset)
	}
	list := func(after int64, limit int) (offsets, ids []int64) {
		t.Helper()
		entries, err := x.e.DLQList(x.ctx, &storage.DLQListParams{SubscriptionID: q.ID, AfterID: after, Limit: limit})
		noErr(t, err, "DLQList after %d, limit %d", after, limit)
		for _, en := range entries {
			equal(t, len(en.Message.Payload), sizes[en.Message.Offset], "payload of offset %d", en.Message.Offset)
			offsets = append(offsets, en.Message.Offset)
			ids = append(ids, en.ID)
		}
		return offsets, ids
	}
	// Four 1 MiB messages make the bound; then the fifth alone (the 5 MiB one would pass it);
	// the 5 MiB one alone; then the rest.
	var after int64
	for i, want := range [][]int64{{0, 1, 2, 3}, {4}, {5}, {6, 7}, nil} {
		offsets, ids := list(after, 1000)
		deepEqual(t, offsets, want, "page %d of a list with limit 1000", i)
		if len(ids) > 0 {
			after = ids[len(ids)-1]
		}
	}
	offsets, _ := list(0, 2)
	deepEqual(t, offsets, []int64{0, 1}, "a limit below the bound")
}

package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Per-key transactional batches (issue 17 item 4, storage/batches.go): batch claims of ordered
// members, their extension past batch_size to the end of a publish's run of a key, and batch
// acks and nacks as a unit.

func batchCases() []testCase {
	return []testCase{
		{name: "contents_and_boundaries", ordered: true, fn: testBatchBoundaries},
		{name: "never_split_across_a_publish_run", ordered: true, fn: testBatchNeverSplit},
		{name: "one_batch_in_flight_and_params", ordered: true, fn: testBatchInFlight},
		{name: "ack_and_nack_as_a_unit", ordered: true, fn: testBatchUnit},
		{name: "nack_redelivers_whole_batch_first", ordered: true, fn: testBatchNackFirst},
		{name: "dlq_at_max_deliveries", ordered: true, fn: testBatchDLQ},
	}
}

// checkBatches checks the deliveries of a batch claim p: the deliveries of a partition are
// together, in offset order, and carry one BatchID (their first offset and count); a batch has
// at most storage.MaxBatchMessages messages and at most p.Max batches start.
func checkBatches(p *storage.DeliveriesClaimParams, ds []*storage.Delivery, violation func(string, ...any)) {
	batches := 0
	for i := 0; i < len(ds); {
		j := i
		for j < len(ds) && ds[j].Partition == ds[i].Partition {
			if j > i && ds[j].Offset <= ds[j-1].Offset {
				violation("batch of partition %d not in offset order at %d", ds[i].Partition, ds[j].Offset)
			}
			j++
		}
		want := storage.BatchID{Offset: ds[i].Offset, Len: j - i}
		for k := i; k < j; k++ {
			if ds[k].Batch != want {
				violation("delivery %d:%d has batch %+v, want %+v", ds[k].Partition, ds[k].Offset, ds[k].Batch, want)
			}
		}
		if want.Len > storage.MaxBatchMessages {
			violation("batch of %d messages, at most %d", want.Len, storage.MaxBatchMessages)
		}
		batches++
		i = j
	}
	if batches > p.Max {
		violation("batch claim with Max %d started %d batches", p.Max, batches)
	}
	seen := map[int32]bool{}
	for i, d := range ds {
		if seen[d.Partition] && ds[i-1].Partition != d.Partition {
			violation("two batches of partition %d in one claim", d.Partition)
		}
		seen[d.Partition] = true
	}
}

// claimB makes a batch claim for an ordered member.
func (x *env) claimB(sub int64, member string, gen int64, max, batchSize int) []*storage.Delivery {
	x.t.Helper()
	return x.claimP(storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: max, Generation: gen, BatchSize: batchSize}).Deliveries
}

// ackB acks ds as a batch.
func (x *env) ackB(sub int64, member string, gen int64, ds []*storage.Delivery) {
	x.t.Helper()
	res, err := x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Member: member, Generation: gen, Refs: RefsOf(ds), Batch: true})
	noErr(x.t, err, "batch ack of %v", RefsOf(ds))
	equal(x.t, res.Acked, len(ds), "acked")
}

// keyedIn returns messages for partition p with the given keys (one each).
func keyedIn(p int32, keys ...string) []storage.AppendMessage {
	out := make([]storage.AppendMessage, len(keys))
	for i, k := range keys {
		out[i] = storage.AppendMessage{Partition: p, Key: []byte(k), Payload: []byte(k)}
	}
	return out
}

func requireLinked(t testing.TB, ds []*storage.Delivery, want []bool, what string) {
	t.Helper()
	got := make([]bool, len(ds))
	for i, d := range ds {
		got[i] = d.Linked
	}
	deepEqual(t, got, want, "%s: Linked bits", what)
}

func testBatchBoundaries(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 1, storage.TopicConfig{})
	g := x.assign(s.ID, 0, map[string][]int32{"a": {0, 1}}).Generation
	// Separate publishes link nothing: batches are cut at batch_size.
	for _, k := range []string{"A", "A", "A", "A", "B"} {
		x.publish("t", keyedIn(0, k)...)
	}
	ds := x.claimB(s.ID, "a", g, 10, 3)
	requireOffsets(t, ds, []int64{0, 1, 2}, "first batch")
	equal(t, ds[0].Batch, storage.BatchID{Offset: 0, Len: 3}, "batch id")
	requireLinked(t, ds, []bool{false, false, false}, "separate publishes")
	x.ackB(s.ID, "a", g, ds)
	ds = x.claimB(s.ID, "a", g, 10, 3)
	requireOffsets(t, ds, []int64{3, 4}, "the rest")
	x.ackB(s.ID, "a", g, ds)

	// One publish of five messages of one key is one batch, past batch_size 3.
	x.publish("t", keyedIn(0, "K", "K", "K", "K", "K")...)
	x.publish("t", keyedIn(0, "X")...)
	ds = x.claimB(s.ID, "a", g, 10, 3)
	requireOffsets(t, ds, []int64{5, 6, 7, 8, 9}, "extended batch")
	equal(t, ds[0].Batch, storage.BatchID{Offset: 5, Len: 5}, "extended batch id")
	requireLinked(t, ds, []bool{true, true, true, true, false}, "one key's run")
	x.ackB(s.ID, "a", g, ds)
	ds = x.claimB(s.ID, "a", g, 10, 3)
	requireOffsets(t, ds, []int64{10}, "after the extended batch")
	x.ackB(s.ID, "a", g, ds)

	// Keys interleaved in one publish: a batch may end only where no key of the run so far
	// comes again. P Q P | R R | S with batch_size 1.
	x.publish("t", keyedIn(0, "P", "Q", "P", "R", "R", "S")...)
	for _, want := range [][]int64{{11, 12, 13}, {14, 15}, {16}} {
		ds = x.claimB(s.ID, "a", g, 10, 1)
		requireOffsets(t, ds, want, "interleaved keys")
		x.ackB(s.ID, "a", g, ds)
	}

	// One publish over two partitions: links are per partition, one batch per partition.
	x.publish("t", append(keyedIn(0, "A", "B", "A"), keyedIn(1, "C", "D")...)...)
	ds = x.claimB(s.ID, "a", g, 10, 1)
	equal(t, len(ds), 4, "two batches")
	byPart := map[int32][]*storage.Delivery{}
	for _, d := range ds {
		byPart[d.Partition] = append(byPart[d.Partition], d)
	}
	requireOffsets(t, byPart[0], []int64{17, 18, 19}, "partition 0's batch")
	requireOffsets(t, byPart[1], []int64{0}, "partition 1's batch: its keys do not come again")
	equal(t, byPart[1][0].Batch, storage.BatchID{Offset: 0, Len: 1}, "partition 1's batch id")
	x.ackB(s.ID, "a", g, byPart[0])
	x.ackB(s.ID, "a", g, byPart[1])
	requireOffsets(t, x.claimB(s.ID, "a", g, 10, 1), []int64{1}, "partition 1 goes on")
}

// testBatchNeverSplit: the claim's Max bounds where batches start, never their length; a
// duplicate (not stored) does not break a run's link.
func testBatchNeverSplit(t *testing.T, x *env) {
	s := x.orderedSub("t", 2, 1, storage.TopicConfig{})
	g := x.assign(s.ID, 0, map[string][]int32{"a": {0, 1}}).Generation
	x.publish("t", keyedIn(0, "K", "K", "K", "K")...)
	x.publish("t", keyedIn(1, "L", "L", "L")...)
	runLen := []int{4, 3}
	ds := x.claimB(s.ID, "a", g, 1, 2)
	p := ds[0].Partition // the engine picks the partition read first
	equal(t, len(ds), runLen[p], "one batch, past Max 1 and batch_size 2")
	for _, d := range ds {
		equal(t, d.Partition, p, "one partition: Max 1 starts one batch")
	}
	x.ackB(s.ID, "a", g, ds)
	ds = x.claimB(s.ID, "a", g, 1, 2)
	equal(t, len(ds), runLen[1-p], "the other partition's batch")
	isTrue(t, ds[0].Partition != p, "the other partition")
	x.ackB(s.ID, "a", g, ds)

	// A message with a producer id already seen is not stored: the run's link goes over it.
	x.publish("t", storage.AppendMessage{Partition: 0, Key: []byte("D"), ProducerID: "dup"})
	ds = x.claimB(s.ID, "a", g, 10, 1)
	x.ackB(s.ID, "a", g, ds)
	run := keyedIn(0, "M", "M", "M")
	run[1].ProducerID = "dup"
	x.publish("t", run...)
	ds = x.claimB(s.ID, "a", g, 10, 1)
	requireOffsets(t, ds, []int64{5, 6}, "the stored messages of the run, one batch")
	requireLinked(t, ds, []bool{true, false}, "run without its duplicate")
}

func testBatchInFlight(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 5, storage.TopicConfig{})
	g := x.assign(s.ID, 0, map[string][]int32{"a": {0}}).Generation
	x.publishN("t", 0, 6)
	ds := x.claimB(s.ID, "a", g, 10, 2)
	requireOffsets(t, ds, []int64{0, 1}, "first batch")
	// max_in_flight_per_partition 5 does not apply: one batch in flight per partition.
	equal(t, len(x.claimB(s.ID, "a", g, 10, 2)), 0, "nothing while a batch is in flight")
	// A plain claim of the same member still follows max_in_flight_per_partition.
	requireOffsets(t, x.claimG(s.ID, "a", g, 10).Deliveries, []int64{2, 3, 4}, "plain claim beside the batch")
	equal(t, len(x.claimB(s.ID, "a", g, 10, 2)), 0, "nothing while messages are in flight")

	// Bad batch parameters change nothing.
	for _, bs := range []int{-1, storage.MaxBatchSize + 1} {
		_, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "a", Max: 10, Generation: g, BatchSize: bs})
		errIs(t, err, storage.ErrInvalidArgument, "batch_size %d", bs)
	}
	x.createTopic("shared", pubSub(1))
	sh := x.subscribe("shared", "g", storage.StartPosition{})
	_, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: sh.ID, Member: "a", Max: 10, BatchSize: 2})
	errIs(t, err, storage.ErrInvalidArgument, "batch claim of a shared subscription")
	equal(t, x.stats(s.ID).InFlight, int64(5), "in flight after refused claims")
}

func testBatchUnit(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 1, storage.TopicConfig{})
	g := x.assign(s.ID, 0, map[string][]int32{"a": {0}}).Generation
	x.publishN("t", 0, 4)
	ds := x.claimB(s.ID, "a", g, 10, 3)
	requireOffsets(t, ds, []int64{0, 1, 2}, "batch")
	// A subset is refused and changes nothing.
	_, err := x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: s.ID, Member: "a", Generation: g, Refs: RefsOf(ds[:2]), Batch: true})
	errIs(t, err, storage.ErrBatchSplit, "batch ack of a subset")
	errIs(t, err, storage.ErrInvalidArgument, "a split is an invalid argument")
	_, err = x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: g, Refs: RefsOf(ds[1:]), Batch: true})
	errIs(t, err, storage.ErrBatchSplit, "batch nack of a subset")
	st := x.stats(s.ID)
	equal(t, st.InFlight, int64(3), "in flight after the refused requests")
	equal(t, st.Redelivering, int64(0), "nothing given back")
	// The whole batch is one request.
	x.ackB(s.ID, "a", g, ds)
	ds = x.claimB(s.ID, "a", g, 10, 3)
	requireOffsets(t, ds, []int64{3}, "next batch")
	// An expired batch is no longer held: acking it is the member finishing late, allowed.
	x.advance(31 * time.Second)
	x.ackB(s.ID, "a", g, ds)
	equal(t, x.stats(s.ID).Pending, int64(0), "pending at the end")
}

func testBatchNackFirst(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 1, storage.TopicConfig{})
	g := x.assign(s.ID, 0, map[string][]int32{"a": {0}}).Generation
	x.publish("t", keyedIn(0, "K", "K", "K")...)
	x.publishN("t", 0, 2)
	ds := x.claimB(s.ID, "a", g, 10, 2)
	requireOffsets(t, ds, []int64{0, 1, 2}, "batch")
	res, err := x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: g,
		Refs: RefsOf(ds), Delay: 2 * time.Second, Batch: true})
	noErr(t, err, "batch nack")
	equal(t, res.Nacked, 3, "nacked")
	equal(t, len(x.claimB(s.ID, "a", g, 10, 2)), 0, "no later offset before the nacked batch")
	x.advance(2 * time.Second)
	ds = x.claimB(s.ID, "a", g, 10, 2)
	requireOffsets(t, ds, []int64{0, 1, 2}, "the whole batch again, first")
	requireAttempts(t, ds, 2, "redelivered batch")
	x.ackB(s.ID, "a", g, ds)
	requireOffsets(t, x.claimB(s.ID, "a", g, 10, 2), []int64{3, 4}, "then the later offsets")

	// A run that waited for its not-before time: its first message comes back as a redelivery
	// and the batch still extends over the rest of the run.
	s2 := x.orderedSub("t2", 1, 1, storage.TopicConfig{})
	g2 := x.assign(s2.ID, 0, map[string][]int32{"a": {0}}).Generation
	run := keyedIn(0, "D", "D", "D")
	for i := range run {
		run[i].NotBefore = x.now().Add(5 * time.Second)
	}
	x.publish("t2", run...)
	x.publishN("t2", 0, 1)
	equal(t, len(x.claimB(s2.ID, "a", g2, 10, 1)), 0, "nothing before the not-before time")
	x.advance(5 * time.Second)
	ds = x.claimB(s2.ID, "a", g2, 10, 1)
	requireOffsets(t, ds, []int64{0, 1, 2}, "the delayed run in one batch")
	x.ackB(s2.ID, "a", g2, ds)
	requireOffsets(t, x.claimB(s2.ID, "a", g2, 10, 1), []int64{3}, "after the run")
}

func testBatchDLQ(t *testing.T, x *env) {
	s := x.orderedSub("t", 1, 1, storage.TopicConfig{MaxDeliveries: 2, AckWait: 10 * time.Second})
	g := x.assign(s.ID, 0, map[string][]int32{"a": {0}}).Generation
	x.publish("t", keyedIn(0, "K", "K", "K")...)
	x.publish("t", keyedIn(0, "L", "L")...)
	x.publishN("t", 0, 1)
	// Nacked on its last delivery, the whole batch goes to the DLQ and the partition moves on.
	ds := x.claimB(s.ID, "a", g, 10, 1)
	requireOffsets(t, ds, []int64{0, 1, 2}, "first batch")
	nk := storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "a", Generation: g, Refs: RefsOf(ds), Batch: true}
	equal(t, x.nack(nk).Nacked, 3, "first nack")
	ds = x.claimB(s.ID, "a", g, 10, 1)
	requireOffsets(t, ds, []int64{0, 1, 2}, "second delivery")
	equal(t, x.nack(nk).DeadLettered, 3, "second nack dead-letters the batch")
	equal(t, len(x.dlq(s.ID)), 3, "DLQ entries")
	// Expired on its last delivery, likewise.
	ds = x.claimB(s.ID, "a", g, 10, 1)
	requireOffsets(t, ds, []int64{3, 4}, "second batch")
	x.advance(10 * time.Second)
	equal(t, len(x.claimB(s.ID, "a", g, 10, 1)), 0, "backoff after the expiry")
	x.advance(storage.RedeliveryBackoff(1))
	ds = x.claimB(s.ID, "a", g, 10, 1)
	requireOffsets(t, ds, []int64{3, 4}, "second batch again")
	requireAttempts(t, ds, 2, "second batch again")
	x.advance(10 * time.Second)
	ds = x.claimB(s.ID, "a", g, 10, 1)
	requireOffsets(t, ds, []int64{5}, "the partition moved on")
	dl := x.dlq(s.ID)
	equal(t, len(dl), 5, "DLQ entries")
	for i, en := range dl {
		equal(t, en.Message.Offset, int64(i), "dead-lettered offset")
		equal(t, en.Attempts, 2, "attempts")
	}
}

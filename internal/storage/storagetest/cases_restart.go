package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func restartCases() []testCase {
	return []testCase{
		{name: "everything_survives", restart: true, fn: testRestartFull},
		{name: "empty_store", restart: true, fn: testRestartEmpty},
		{name: "offsets_continue", restart: true, fn: testRestartOffsets},
		{name: "ephemeral_forgotten", restart: true, fn: testRestartEphemeral},
	}
}

func closeCases() []testCase {
	return []testCase{
		{name: "closed_engine_refuses", fn: testClose},
	}
}

// snapshot is what a restart must keep.
type snapshot struct {
	topics   []*storage.Topic
	subs     []*storage.Subscription
	bindings []*storage.Binding
	dlq      map[int64][]*storage.DLQEntry
	high     map[string][]int64
}

func (x *env) snapshot() *snapshot {
	x.t.Helper()
	s := &snapshot{dlq: map[int64][]*storage.DLQEntry{}, high: map[string][]int64{}}
	var err error
	s.topics, err = x.e.TopicList(x.ctx)
	noErr(x.t, err, "TopicList")
	s.subs, err = x.e.SubscriptionList(x.ctx, &storage.SubscriptionListParams{IncludeDeleted: true})
	noErr(x.t, err, "SubscriptionList")
	s.bindings, err = x.e.BindingList(x.ctx)
	noErr(x.t, err, "BindingList")
	for _, sub := range s.subs {
		if sub.State != storage.Deleted {
			s.dlq[sub.ID] = x.dlq(sub.ID)
		}
	}
	for _, tp := range s.topics {
		s.high[tp.Name] = x.highWaters(tp.Name)
	}
	return s
}

// requireSameState compares the state after a restart with the one before, ignoring ephemeral
// subscriptions (an engine restart forgets them).
func requireSameState(t *testing.T, got, want *snapshot) {
	t.Helper()
	equal(t, len(got.topics), len(want.topics), "topics after restart")
	for i, tp := range want.topics {
		g := got.topics[i]
		equal(t, g.Name, tp.Name, "topic %d name", i)
		deepEqual(t, g.Config, tp.Config, "topic %q config", tp.Name)
		timeEqual(t, g.CreatedAt, tp.CreatedAt, "topic %q CreatedAt", tp.Name)
		deepEqual(t, got.high[tp.Name], want.high[tp.Name], "topic %q high waters", tp.Name)
	}
	var durable []*storage.Subscription
	for _, s := range want.subs {
		if !s.Ephemeral {
			durable = append(durable, s)
		}
	}
	equal(t, len(got.subs), len(durable), "durable subscriptions after restart")
	for i, s := range durable {
		requireSameSub(t, got.subs[i], s, "subscription after restart")
		gd, wd := got.dlq[s.ID], want.dlq[s.ID]
		equal(t, len(gd), len(wd), "DLQ of subscription %d", s.ID)
		for j, en := range wd {
			g := gd[j]
			same := g.ID == en.ID && g.SubscriptionID == en.SubscriptionID && g.Reason == en.Reason &&
				g.Attempts == en.Attempts && g.LastError == en.LastError && g.DeadAt.Equal(en.DeadAt) &&
				g.Message.Partition == en.Message.Partition && g.Message.Offset == en.Message.Offset &&
				string(g.Message.Payload) == string(en.Message.Payload) && g.Message.PublishedAt.Equal(en.Message.PublishedAt)
			isTrue(t, same, "DLQ entry after restart:\n got: %+v\nwant: %+v", *g, *en)
		}
	}
	equal(t, len(got.bindings), len(want.bindings), "bindings after restart")
	for i, b := range want.bindings {
		g := got.bindings[i]
		isTrue(t, g.Group == b.Group && g.Pattern == b.Pattern && sameStart(g.Start, b.Start) && g.CreatedAt.Equal(b.CreatedAt),
			"binding after restart:\n got: %+v\nwant: %+v", *g, *b)
	}
}

func testRestartFull(t *testing.T, x *env) {
	_, err := x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g3", Pattern: "r.#", Start: fromBeginning})
	noErr(t, err, "BindingCreate r.#")
	_, err = x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g4", Pattern: "s.*"})
	noErr(t, err, "BindingCreate s.*")
	x.createTopic("r.queue", storage.TopicConfig{Partitions: 2, AckWait: 20 * time.Second, MaxDeliveries: 4, MessageRetention: 3 * time.Hour})
	x.createTopic("r.fan", pubSub(1))
	q := x.queueSub("r.queue")
	g1 := x.subscribe("r.fan", "g1", fromBeginning)
	g2 := x.subscribe("r.fan", "g2", fromBeginning)
	x.setState(g2.ID, storage.Paused)
	x.subscribe("r.fan", "g5", fromBeginning)
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "r.fan", Group: "eph", Ephemeral: true})
	noErr(t, err, "ephemeral SubscriptionCreate")
	g3, err := x.e.SubscriptionGetByGroup(x.ctx, "r.fan", "g3")
	noErr(t, err, "binding subscription")

	x.publishN("r.queue", 0, 10)
	x.publishN("r.queue", 1, 4)
	x.publishN("r.fan", 0, 3)
	onlyP0 := func(member string, max int) []*storage.Delivery {
		return x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: member, Max: max, Partitions: []int32{0}}).Deliveries
	}
	requireOffsets(t, onlyP0("m1", 8), span(0, 8), "claimed before restart")
	x.ack(q.ID, "m1", ref(0, 0), ref(0, 1), ref(0, 2))
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 3)}})
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 4)}, ToDLQ: true, Reason: "bad"})
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 5)}, Delay: time.Hour})
	ds := onlyP0("m2", 1)
	requireOffsets(t, ds, []int64{3}, "nacked message redelivered before restart")
	equal(t, ds[0].Attempt, 2, "attempt before restart")
	fan := x.claimAll(g1.ID, "f1")
	requireOffsets(t, fan, []int64{0, 1, 2}, "g1 claims")
	x.ack(g1.ID, "f1", fan[0].Ref())
	before := x.snapshot()
	attempts := map[storage.DeliveryRef]int{ref(0, 3): 2, ref(0, 5): 1, ref(0, 6): 1, ref(0, 7): 1}

	x.advance(time.Minute)
	x.restart()
	requireSameState(t, x.snapshot(), before)

	// Leases may or may not survive a restart; after every lease, backoff and delay has passed,
	// every message not done is delivered again, with an attempt above its last one.
	x.advance(2 * time.Hour)
	ds = x.claimAll(q.ID, "m3")
	want := []storage.DeliveryRef{ref(0, 3), ref(0, 5), ref(0, 6), ref(0, 7), ref(0, 8), ref(0, 9), ref(1, 0), ref(1, 1), ref(1, 2), ref(1, 3)}
	requireRefs(t, RefsOf(ds), want, "redelivered after restart: everything not acked or dead-lettered")
	for _, d := range ds {
		if prev, ok := attempts[d.Ref()]; ok {
			isTrue(t, d.Attempt > prev, "%d:%d: attempt %d after restart, was %d before", d.Partition, d.Offset, d.Attempt, prev)
		} else {
			equal(t, d.Attempt, 1, "attempt of %d:%d, never delivered before", d.Partition, d.Offset)
		}
	}
	x.ack(q.ID, "m3", RefsOf(ds)...)
	ds = x.claimAll(g1.ID, "f1")
	requireOffsets(t, ds, []int64{1, 2}, "g1 gets its unacked messages again")
	for _, d := range ds {
		isTrue(t, d.Attempt > 1, "g1: attempt %d of offset %d after restart, was 1 before", d.Attempt, d.Offset)
	}
	x.ack(g1.ID, "f1", RefsOf(ds)...)
	requireOffsets(t, x.drain(g3.ID, "f3"), []int64{0, 1, 2}, "the binding's subscription")

	// Offsets continue; new subscriptions get new IDs; bindings still subscribe new topics.
	pos := x.publish("r.queue", toPartition(0, "after"), toPartition(1, "after"))
	equal(t, pos[0].Offset, int64(10), "partition 0 continues")
	equal(t, pos[1].Offset, int64(4), "partition 1 continues")
	x.createTopic("s.new", pubSub(1))
	g4, err := x.e.SubscriptionGetByGroup(x.ctx, "s.new", "g4")
	noErr(t, err, "binding g4 subscribes a topic created after the restart")
	for _, s := range before.subs {
		isTrue(t, g4.ID > s.ID, "subscription ID %d reused or going back (had %d)", g4.ID, s.ID)
	}
	n, err := x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: q.ID})
	noErr(t, err, "DLQReplay after restart")
	equal(t, n, 1, "replayed")
	x.drain(q.ID, "m3")

	// Acks are durable: after another restart nothing comes back.
	x.restart()
	x.advance(2 * time.Hour)
	equal(t, len(x.claimAll(q.ID, "m4")), 0, "acked messages are not delivered after a second restart")
	equal(t, len(x.claimAll(g1.ID, "f4")), 0, "g1 acked everything")
	x.requireStats(q.ID, wantStats{}, "queue subscription after the second restart")
	x.requireStats(g1.ID, wantStats{}, "g1 after the second restart")
	equal(t, x.getSub(g2.ID).State, storage.Paused, "g2 is still paused")
	x.requireStats(g2.ID, wantStats{pending: 3, lag: 3}, "paused g2 still holds its messages")
}

func testRestartEmpty(t *testing.T, x *env) {
	x.restart()
	topics, err := x.e.TopicList(x.ctx)
	noErr(t, err, "TopicList")
	equal(t, len(topics), 0, "topics")
	x.createTopic("e.t", storage.TopicConfig{})
	q := x.queueSub("e.t")
	x.restart()
	x.restart()
	requireSameSub(t, x.queueSub("e.t"), q, "queue subscription after two restarts")
	deepEqual(t, x.highWaters("e.t"), []int64{0}, "high water")
}

func testRestartOffsets(t *testing.T, x *env) {
	x.createTopic("o.t", storage.TopicConfig{Partitions: 3})
	for round := range 3 {
		for p := range int32(3) {
			pos := x.publishN("o.t", p, 5)
			equal(t, pos[0].Offset, int64(round*5), "round %d partition %d first offset", round, p)
		}
		x.restart()
	}
	deepEqual(t, x.highWaters("o.t"), []int64{15, 15, 15}, "high waters")
	for p := range int32(3) {
		ms := x.read("o.t", p, 0)
		deepEqual(t, msgOffsets(ms), span(0, 15), "partition %d offsets", p)
	}
}

func testRestartEphemeral(t *testing.T, x *env) {
	x.createTopic("eph.t", pubSub(1))
	eph, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "eph.t", Group: "eph-1", Ephemeral: true})
	noErr(t, err, "ephemeral SubscriptionCreate")
	durable := x.subscribe("eph.t", "durable", fromBeginning)
	x.publishN("eph.t", 0, 2)
	x.claim(eph.ID, "m", 1)
	x.restart()
	subs := x.listSubs("eph.t")
	equal(t, len(subs), 1, "only the durable subscription is left")
	equal(t, subs[0].ID, durable.ID, "the durable subscription")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "eph.t", "eph-1")
	errIs(t, err, storage.ErrSubscriptionNotFound, "ephemeral subscription after restart")
	_, err = x.e.SubscriptionGet(x.ctx, eph.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "ephemeral subscription by ID after restart")
	s := x.subscribe("eph.t", "eph-1", fromBeginning)
	isTrue(t, s.ID > durable.ID, "a new ID after restart: %d", s.ID)
}

func testClose(t *testing.T, x *env) {
	x.createTopic("c.t", storage.TopicConfig{})
	q := x.queueSub("c.t")
	noErr(t, x.e.Close(), "Close")
	x.closed = true
	noErr(t, x.e.Close(), "second Close")
	_, err := x.e.TopicList(x.ctx)
	errIs(t, err, storage.ErrClosed, "TopicList after Close")
	_, err = x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "c.u"})
	errIs(t, err, storage.ErrClosed, "TopicCreate after Close")
	_, err = x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "c.t", Messages: []storage.AppendMessage{msg("x")}})
	errIs(t, err, storage.ErrClosed, "MessagesAppend after Close")
	_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1})
	errIs(t, err, storage.ErrClosed, "DeliveriesClaim after Close")
	_, err = x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID, Member: "m", Refs: []storage.DeliveryRef{ref(0, 0)}})
	errIs(t, err, storage.ErrClosed, "DeliveriesAck after Close")
	_, err = x.e.RetentionApply(x.ctx)
	errIs(t, err, storage.ErrClosed, "RetentionApply after Close")
	_, err = x.e.SubscriptionStats(x.ctx, q.ID)
	errIs(t, err, storage.ErrClosed, "SubscriptionStats after Close")
}

package storagetest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// baseTime is where every case's FakeClock starts: whole seconds, so that every engine (PostgreSQL
// keeps microseconds) stores the times the suite compares exactly.
var baseTime = time.Date(2031, time.March, 14, 9, 26, 53, 0, time.UTC)

// env is a case's setup and bundle (STYLE.md C22): the engine (through the recorder), its clock and
// its store.
type env struct {
	t     *testing.T
	ctx   context.Context
	clock *FakeClock
	caps  Capabilities
	open  OpenFunc
	rec   *recorder
	// e is the engine under test, seen through the recorder.
	e      storage.Engine
	closed bool
	seq    atomic.Int64 // payload counter
}

func (s *suite) setup(t *testing.T) *env {
	t.Helper()
	open := s.newStore(t)
	clock := NewFakeClock(baseTime)
	eng, err := open(clock)
	noErr(t, err, "open engine")
	x := &env{t: t, ctx: t.Context(), clock: clock, caps: s.caps, open: open}
	x.rec = newRecorder(t, clock, eng)
	x.e = x.rec
	// Cleanups run last-in first-out: the checker sees the engine before it is closed.
	t.Cleanup(func() {
		if !x.closed {
			if err := x.rec.engine().Close(); err != nil {
				t.Errorf("close engine: %v", err)
			}
		}
	})
	t.Cleanup(x.checkInvariants)
	return x
}

// restart closes the engine and opens the same store again with the same clock.
func (x *env) restart() {
	x.t.Helper()
	if !x.closed {
		noErr(x.t, x.rec.engine().Close(), "close engine for restart")
	}
	eng, err := x.open(x.clock)
	noErr(x.t, err, "reopen engine")
	x.rec.swap(eng)
	x.closed = false
}

func (x *env) now() time.Time                    { return x.clock.Now() }
func (x *env) advance(d time.Duration) time.Time { return x.clock.Advance(d) }

func (x *env) createTopic(name string, cfg storage.TopicConfig) *storage.Topic {
	x.t.Helper()
	tp, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: name, Config: cfg})
	noErr(x.t, err, "TopicCreate(%q)", name)
	return tp
}

func (x *env) getTopic(name string) *storage.Topic {
	x.t.Helper()
	tp, err := x.e.TopicGet(x.ctx, name)
	noErr(x.t, err, "TopicGet(%q)", name)
	return tp
}

func (x *env) updateTopic(p storage.TopicUpdateParams) *storage.Topic {
	x.t.Helper()
	tp, err := x.e.TopicUpdate(x.ctx, &p)
	noErr(x.t, err, "TopicUpdate(%q)", p.Name)
	return tp
}

func (x *env) topicStats(name string) *storage.TopicStats {
	x.t.Helper()
	st, err := x.e.TopicStats(x.ctx, name)
	noErr(x.t, err, "TopicStats(%q)", name)
	return st
}

// highWaters returns the topic's high-water mark per partition.
func (x *env) highWaters(name string) []int64 {
	x.t.Helper()
	st := x.topicStats(name)
	hw := make([]int64, len(st.Partitions))
	for _, p := range st.Partitions {
		isTrue(x.t, int(p.Partition) < len(hw), "TopicStats(%q) lists partition %d of %d", name, p.Partition, len(hw))
		hw[p.Partition] = p.HighWater
	}
	return hw
}

func (x *env) queueSub(topic string) *storage.Subscription {
	x.t.Helper()
	s, err := x.e.SubscriptionGetByGroup(x.ctx, topic, storage.QueueGroup)
	noErr(x.t, err, "SubscriptionGetByGroup(%q, %q)", topic, storage.QueueGroup)
	return s
}

func (x *env) subscribe(topic, group string, start storage.StartPosition) *storage.Subscription {
	x.t.Helper()
	s, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: group, Start: start})
	noErr(x.t, err, "SubscriptionCreate(%q, %q)", topic, group)
	return s
}

func (x *env) getSub(id int64) *storage.Subscription {
	x.t.Helper()
	s, err := x.e.SubscriptionGet(x.ctx, id)
	noErr(x.t, err, "SubscriptionGet(%d)", id)
	return s
}

func (x *env) setState(id int64, state storage.SubscriptionState) *storage.Subscription {
	x.t.Helper()
	s, err := x.e.SubscriptionUpdate(x.ctx, &storage.SubscriptionUpdateParams{ID: id, State: state})
	noErr(x.t, err, "SubscriptionUpdate(%d, %s)", id, state)
	equal(x.t, s.State, state, "state after SubscriptionUpdate(%d)", id)
	return s
}

// subState returns a subscription's state, DELETED included (SubscriptionGet does not return a
// DELETED subscription).
func (x *env) subState(id int64) storage.SubscriptionState {
	x.t.Helper()
	subs, err := x.e.SubscriptionList(x.ctx, &storage.SubscriptionListParams{IncludeDeleted: true})
	noErr(x.t, err, "SubscriptionList IncludeDeleted")
	for _, s := range subs {
		if s.ID == id {
			return s.State
		}
	}
	x.t.Fatalf("subscription %d is not listed with IncludeDeleted", id)
	return ""
}

func (x *env) listSubs(topic string) []*storage.Subscription {
	x.t.Helper()
	subs, err := x.e.SubscriptionList(x.ctx, &storage.SubscriptionListParams{Topic: topic})
	noErr(x.t, err, "SubscriptionList(%q)", topic)
	return subs
}

// payload returns a payload unique inside the case.
func (x *env) payload() string { return fmt.Sprintf("payload-%d", x.seq.Add(1)) }

func msg(payload string) storage.AppendMessage {
	return storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte(payload)}
}

func keyed(key, payload string) storage.AppendMessage {
	return storage.AppendMessage{Partition: storage.PartitionAuto, Key: []byte(key), Payload: []byte(payload)}
}

func toPartition(p int32, payload string) storage.AppendMessage {
	return storage.AppendMessage{Partition: p, Payload: []byte(payload)}
}

func (x *env) publish(topic string, msgs ...storage.AppendMessage) []storage.MessagePosition {
	x.t.Helper()
	res, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: topic, Messages: msgs})
	noErr(x.t, err, "MessagesAppend(%q, %d messages)", topic, len(msgs))
	equal(x.t, len(res.Positions), len(msgs), "MessagesAppend(%q) positions", topic)
	return res.Positions
}

// publishN appends n messages with unique payloads to one partition (or PartitionAuto), one batch.
func (x *env) publishN(topic string, partition int32, n int) []storage.MessagePosition {
	x.t.Helper()
	msgs := make([]storage.AppendMessage, n)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: partition, Payload: []byte(x.payload())}
	}
	return x.publish(topic, msgs...)
}

func (x *env) claimP(p storage.DeliveriesClaimParams) *storage.DeliveriesClaimResult {
	x.t.Helper()
	res, err := x.e.DeliveriesClaim(x.ctx, &p)
	noErr(x.t, err, "DeliveriesClaim(subscription %d, member %q)", p.SubscriptionID, p.Member)
	return res
}

func (x *env) claim(sub int64, member string, max int) []*storage.Delivery {
	x.t.Helper()
	return x.claimP(storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: max}).Deliveries
}

// claimAll claims until a claim returns nothing and returns everything claimed. The clock does not
// move meanwhile, so a message returned twice is a message leased twice: that fails at once.
func (x *env) claimAll(sub int64, member string) []*storage.Delivery {
	x.t.Helper()
	var all []*storage.Delivery
	seen := map[storage.DeliveryRef]bool{}
	for range 1000 {
		ds := x.claim(sub, member, 100)
		if len(ds) == 0 {
			return all
		}
		for _, d := range ds {
			if seen[d.Ref()] {
				x.t.Fatalf("claimAll(subscription %d): %d:%d returned again while its lease runs", sub, d.Partition, d.Offset)
			}
			seen[d.Ref()] = true
		}
		all = append(all, ds...)
	}
	x.t.Fatalf("claimAll(subscription %d): claims never ran dry", sub)
	return nil
}

// drain claims and acks everything claimable now.
func (x *env) drain(sub int64, member string) []*storage.Delivery {
	x.t.Helper()
	ds := x.claimAll(sub, member)
	if len(ds) > 0 {
		res := x.ack(sub, member, RefsOf(ds)...)
		equal(x.t, res.Acked, len(ds), "drain: acked")
	}
	return ds
}

func (x *env) ack(sub int64, member string, refs ...storage.DeliveryRef) *storage.DeliveriesAckResult {
	x.t.Helper()
	res, err := x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Member: member, Refs: refs})
	noErr(x.t, err, "DeliveriesAck(subscription %d, %v)", sub, refs)
	return res
}

func (x *env) nack(p storage.DeliveriesNackParams) *storage.DeliveriesNackResult {
	x.t.Helper()
	res, err := x.e.DeliveriesNack(x.ctx, &p)
	noErr(x.t, err, "DeliveriesNack(subscription %d, %v)", p.SubscriptionID, p.Refs)
	return res
}

func (x *env) extend(p storage.DeliveriesExtendParams) *storage.DeliveriesExtendResult {
	x.t.Helper()
	res, err := x.e.DeliveriesExtend(x.ctx, &p)
	noErr(x.t, err, "DeliveriesExtend(subscription %d, %v)", p.SubscriptionID, p.Refs)
	return res
}

func (x *env) release(sub int64, member string) *storage.DeliveriesReleaseResult {
	x.t.Helper()
	res, err := x.e.DeliveriesRelease(x.ctx, &storage.DeliveriesReleaseParams{SubscriptionID: sub, Member: member})
	noErr(x.t, err, "DeliveriesRelease(subscription %d, %q)", sub, member)
	return res
}

func (x *env) stats(sub int64) *storage.SubscriptionStats {
	x.t.Helper()
	st, err := x.e.SubscriptionStats(x.ctx, sub)
	noErr(x.t, err, "SubscriptionStats(%d)", sub)
	return st
}

// wantStats are the expected figures of a subscription.
type wantStats struct {
	pending, lag, inFlight, redelivering, dead int64
}

func (x *env) requireStats(sub int64, want wantStats, what string) *storage.SubscriptionStats {
	x.t.Helper()
	st := x.stats(sub)
	got := wantStats{st.Pending, st.Lag, st.InFlight, st.Redelivering, st.DeadLettered}
	if got != want {
		x.t.Fatalf("%s: stats of subscription %d:\n got: pending %d lag %d in_flight %d redelivering %d dead_lettered %d\nwant: pending %d lag %d in_flight %d redelivering %d dead_lettered %d",
			what, sub, got.pending, got.lag, got.inFlight, got.redelivering, got.dead,
			want.pending, want.lag, want.inFlight, want.redelivering, want.dead)
	}
	return st
}

// partStats returns a subscription's figures for one partition.
func partStats(t testing.TB, st *storage.SubscriptionStats, p int32) storage.SubscriptionPartitionStats {
	t.Helper()
	for _, ps := range st.Partitions {
		if ps.Partition == p {
			return ps
		}
	}
	t.Fatalf("subscription %d stats have no partition %d: %+v", st.SubscriptionID, p, st.Partitions)
	return storage.SubscriptionPartitionStats{}
}

// requireFloor checks a subscription's ack floor and cursor in one partition.
func (x *env) requireFloor(sub int64, p int32, floor, cursor int64, what string) {
	x.t.Helper()
	ps := partStats(x.t, x.stats(sub), p)
	if ps.AckFloor != floor || ps.Cursor != cursor {
		x.t.Fatalf("%s: subscription %d partition %d: ack floor %d cursor %d, want ack floor %d cursor %d",
			what, sub, p, ps.AckFloor, ps.Cursor, floor, cursor)
	}
}

// dlq lists a subscription's whole DLQ.
func (x *env) dlq(sub int64) []*storage.DLQEntry {
	x.t.Helper()
	var all []*storage.DLQEntry
	var after int64
	for {
		page, err := x.e.DLQList(x.ctx, &storage.DLQListParams{SubscriptionID: sub, AfterID: after, Limit: 50})
		noErr(x.t, err, "DLQList(%d)", sub)
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].ID
	}
}

// read reads a partition from offset to its end.
func (x *env) read(topic string, partition int32, from int64) []*storage.Message {
	x.t.Helper()
	var all []*storage.Message
	for {
		page, err := x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: topic, Partition: partition, Offset: from, Limit: 100})
		noErr(x.t, err, "MessagesRead(%q, %d, %d)", topic, partition, from)
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		from = page[len(page)-1].Offset + 1
	}
}

func ref(p int32, o int64) storage.DeliveryRef { return storage.DeliveryRef{Partition: p, Offset: o} }

// RefsOf returns the delivery references of ds, in order.
func RefsOf(ds []*storage.Delivery) []storage.DeliveryRef {
	out := make([]storage.DeliveryRef, len(ds))
	for i, d := range ds {
		out[i] = d.Ref()
	}
	return out
}

// OffsetsOf returns the offsets of ds, in order.
func OffsetsOf(ds []*storage.Delivery) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.Offset
	}
	return out
}

func msgOffsets(ms []*storage.Message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.Offset
	}
	return out
}

func sortRefs(refs []storage.DeliveryRef) []storage.DeliveryRef {
	out := slices.Clone(refs)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Partition != out[j].Partition {
			return out[i].Partition < out[j].Partition
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// requireRefs checks that two ref lists hold the same refs, in any order.
func requireRefs(t testing.TB, got, want []storage.DeliveryRef, what string, args ...any) {
	t.Helper()
	g, w := sortRefs(got), sortRefs(want)
	if len(g) == 0 && len(w) == 0 {
		return
	}
	deepEqual(t, g, w, what, args...)
}

// requireOffsets checks the offsets of deliveries, in order.
func requireOffsets(t testing.TB, ds []*storage.Delivery, want []int64, what string, args ...any) {
	t.Helper()
	got := OffsetsOf(ds)
	if len(got) == 0 && len(want) == 0 {
		return
	}
	deepEqual(t, got, want, what, args...)
}

// requireAttempts checks that every delivery has the given attempt.
func requireAttempts(t testing.TB, ds []*storage.Delivery, attempt int, what string) {
	t.Helper()
	for _, d := range ds {
		if d.Attempt != attempt {
			t.Fatalf("%s: %d:%d has attempt %d, want %d", what, d.Partition, d.Offset, d.Attempt, attempt)
		}
	}
}

func span(from, to int64) []int64 {
	var out []int64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func refSpan(p int32, from, to int64) []storage.DeliveryRef {
	var out []storage.DeliveryRef
	for i := from; i < to; i++ {
		out = append(out, ref(p, i))
	}
	return out
}

// requireMessage compares a stored message with what was appended.
func requireMessage(t testing.TB, got *storage.Message, want storage.AppendMessage, what string) {
	t.Helper()
	if string(got.Key) != string(want.Key) {
		t.Fatalf("%s: key %q, want %q", what, got.Key, want.Key)
	}
	if string(got.Payload) != string(want.Payload) {
		t.Fatalf("%s: payload %q, want %q", what, got.Payload, want.Payload)
	}
	if len(got.Headers) != 0 || len(want.Headers) != 0 {
		deepEqual(t, got.Headers, want.Headers, "%s: headers", what)
	}
	equal(t, got.ProducerID, want.ProducerID, "%s: producer id", what)
	timeEqual(t, got.NotBefore, want.NotBefore, "%s: not_before", what)
	timeEqual(t, got.ExpiresAt, want.ExpiresAt, "%s: expires_at", what)
}

// pubSub is a PUB_SUB topic config with the given partitions.
func pubSub(partitions int) storage.TopicConfig {
	return storage.TopicConfig{Semantics: storage.PubSub, Partitions: partitions}
}

var fromBeginning = storage.StartPosition{Kind: storage.FromBeginning}

// requireSameSub compares two subscriptions field by field (times with Equal).
func requireSameSub(t testing.TB, got, want *storage.Subscription, what string) {
	t.Helper()
	same := got.ID == want.ID && got.Topic == want.Topic && got.Group == want.Group && got.Pattern == want.Pattern &&
		got.Ephemeral == want.Ephemeral && got.State == want.State && sameStart(got.Start, want.Start) &&
		got.CreatedAt.Equal(want.CreatedAt) && got.UpdatedAt.Equal(want.UpdatedAt)
	if !same {
		t.Fatalf("%s:\n got: %+v\nwant: %+v", what, *got, *want)
	}
}

func sameStart(a, b storage.StartPosition) bool {
	return a.Kind == b.Kind && a.Time.Equal(b.Time) && a.Partition == b.Partition && a.Offset == b.Offset
}

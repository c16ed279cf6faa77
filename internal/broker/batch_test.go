package broker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// publishRun publishes n messages of key to partition p in one publish ("<prefix>-<i>"): the
// engine links them, so a batch never splits them.
func (e *env) publishRun(topic, prefix string, p int32, key string, n int) {
	e.t.Helper()
	msgs := make([]storage.AppendMessage, n)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: p, Key: []byte(key), Payload: fmt.Appendf(nil, "%s-%d", prefix, i)}
	}
	if _, err := e.b.Publish(e.ctx(), topic, msgs); err != nil {
		e.t.Fatalf("Publish: %v", err)
	}
}

// batchMember is a batch member and its Notify channel (its deliveries channel may be replaced
// by a larger one for a batch past its credit: it is read with Take).
type batchMember struct {
	*Member
	notify chan struct{}
}

func (e *env) subscribeBatch(topic, group, id string, batchSize, maxInFlight int) batchMember {
	e.t.Helper()
	notify := make(chan struct{}, 1)
	m := e.subscribe(SubscribeParams{Pattern: topic, Group: group, MemberID: id, Mode: storage.ModeOrdered,
		Start: storage.StartPosition{Kind: storage.FromBeginning}, BatchSize: batchSize, MaxInFlight: maxInFlight,
		Notify: notify})
	return batchMember{m, notify}
}

// take receives n deliveries from m with Take.
func (m batchMember) take(t *testing.T, n int) []*storage.Delivery {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	var out []*storage.Delivery
	for {
		out, _ = m.Take(out)
		if len(out) >= n {
			if len(out) > n {
				t.Fatalf("member %s: got %d deliveries, want %d", m.ID(), len(out), n)
			}
			return out
		}
		select {
		case <-m.notify:
		case <-timer.C:
			t.Fatalf("member %s: got %d of %d deliveries within %s", m.ID(), len(out), n, waitTimeout)
		}
	}
}

// checkBatch checks that ds is one whole batch of partition p from offset from, in order.
func checkBatch(t *testing.T, ds []*storage.Delivery, p int32, from int64) {
	t.Helper()
	for i, d := range ds {
		want := storage.BatchID{Offset: from, Len: len(ds)}
		if d.Partition != p || d.Offset != from+int64(i) || d.Batch != want {
			t.Fatalf("delivery %d: %d:%d batch %+v, want %d:%d batch %+v", i, d.Partition, d.Offset, d.Batch, p, from+int64(i), want)
		}
	}
}

// TestBatchMemberGetsWholeRunsPastItsCredit: a batch member with credit 2 and batch size 3 gets a
// publish's run of 5 messages of one key as one batch (past both), holds 5 with credit 0 (not
// negative, nothing reserved) until it acks the batch as a unit, then gets the next batch. A
// partial ack or nack is refused with ErrBatchSplit and changes nothing.
func TestBatchMemberGetsWholeRunsPastItsCredit(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("b", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 1})
	e.publishRun("b", "x", 0, "k", 5)
	e.publishRun("b", "y", 0, "j", 2)
	m := e.subscribeBatch("b", "g", "a", 3, 2)
	e.waitAssignment("b", "g", "a")

	first := m.take(t, 5)
	checkBatch(t, first, 0, 0)
	e.waitIdle()
	m.mu.Lock()
	held, reserved, credit := len(m.inflight), m.reserved, m.creditLocked(e.b.clock.Now())
	m.mu.Unlock()
	if held != 5 || reserved != 0 || credit != 0 {
		t.Fatalf("after a batch past the credit: held %d reserved %d credit %d, want 5 0 0", held, reserved, credit)
	}

	sub := first[0].SubscriptionID
	if err := m.Ack(e.ctx(), sub, first[0].Ref(), first[1].Ref()); !errors.Is(err, storage.ErrBatchSplit) {
		t.Fatalf("ack of 2 of a batch of 5: %v, want ErrBatchSplit", err)
	}
	if _, err := m.NackBatch(e.ctx(), sub, []storage.DeliveryRef{first[4].Ref()}, NackOptions{}); !errors.Is(err, storage.ErrBatchSplit) {
		t.Fatalf("nack of 1 of a batch of 5: %v, want ErrBatchSplit", err)
	}
	if n := m.InFlight(); n != 5 {
		t.Fatalf("in flight after refused settles %d, want 5", n)
	}
	refs := make([]storage.DeliveryRef, len(first))
	for i, d := range first {
		refs[i] = d.Ref()
	}
	if err := m.Ack(e.ctx(), sub, refs...); err != nil {
		t.Fatalf("ack of the whole batch: %v", err)
	}
	second := m.take(t, 2)
	checkBatch(t, second, 0, 5)
}

// TestBatchMemberWaitsForCreditOfABatch: a batch member claims only when its free credit holds
// batch_size, so its holdings exceed its credit by at most one batch's extension: with credit 4
// and batch size 3 over four partitions with a run of 3 each, it holds one batch (3), not two
// (6), until it acks it.
func TestBatchMemberWaitsForCreditOfABatch(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("b", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 4})
	for p := range int32(4) {
		e.publishRun("b", fmt.Sprint("p", p), p, "k", 3)
	}
	m := e.subscribeBatch("b", "g", "a", 3, 4)
	e.waitAssignment("b", "g", "a")
	seen := map[int32]bool{}
	for range 4 {
		ds := m.take(t, 3)
		e.waitIdle()
		if n := m.InFlight(); n != 3 {
			t.Fatalf("holds %d with credit 4 and batch size 3, want one batch (3)", n)
		}
		checkBatch(t, ds, ds[0].Partition, 0)
		if seen[ds[0].Partition] {
			t.Fatalf("partition %d delivered twice", ds[0].Partition)
		}
		seen[ds[0].Partition] = true
		refs := make([]storage.DeliveryRef, len(ds))
		for i, d := range ds {
			refs[i] = d.Ref()
		}
		if err := m.Ack(e.ctx(), ds[0].SubscriptionID, refs...); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
}

// TestBatchNackRedeliversWholeBatchFirst: a nacked batch comes back whole before later offsets,
// with its attempt count raised, and the member's credit goes back to it in between.
func TestBatchNackRedeliversWholeBatchFirst(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("b", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	e.publishRun("b", "x", 1, "k", 4)
	e.publishRun("b", "y", 1, "j", 3)
	m := e.subscribeBatch("b", "g", "a", 2, 10)
	e.waitAssignment("b", "g", "a")
	first := m.take(t, 4)
	checkBatch(t, first, 1, 0)
	refs := make([]storage.DeliveryRef, len(first))
	for i, d := range first {
		refs[i] = d.Ref()
	}
	if err := m.Nack(e.ctx(), first[0].SubscriptionID, refs, NackOptions{}); err != nil {
		t.Fatalf("nack of the whole batch: %v", err)
	}
	again := m.take(t, 4)
	checkBatch(t, again, 1, 0)
	for _, d := range again {
		if d.Attempt != 2 {
			t.Fatalf("redelivered %d:%d attempt %d, want 2", d.Partition, d.Offset, d.Attempt)
		}
	}
	if err := m.Ack(e.ctx(), again[0].SubscriptionID, refs...); err != nil {
		t.Fatalf("ack: %v", err)
	}
	checkBatch(t, m.take(t, 3), 1, 4)
}

// TestBatchSizeOnlyForOrderedMembers: batch_size is refused for a shared member and outside
// 0..storage.MaxBatchSize, with a message naming it.
func TestBatchSizeOnlyForOrderedMembers(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("b", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 1})
	for _, p := range []SubscribeParams{
		{Pattern: "b", Group: "s", BatchSize: 5},
		{Pattern: "b", Group: "g", Mode: storage.ModeOrdered, BatchSize: storage.MaxBatchSize + 1},
		{Pattern: "b", Group: "g", Mode: storage.ModeOrdered, BatchSize: -1},
	} {
		if _, err := e.b.Subscribe(e.ctx(), p); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Fatalf("Subscribe(%+v): %v, want ErrInvalidArgument", p, err)
		}
	}
}

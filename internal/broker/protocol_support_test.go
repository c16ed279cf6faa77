package broker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Tests of what the wire protocol needs from the broker: per-member lease duration, credit raised
// at runtime, batch results of ack/nack/extend, the Notify wake-up, ended subscriptions, the number
// of leases a leaving member released, and fair round robin of new messages.

func TestLeaseDurationOverridesAckWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("lease", queueCfg)
	long := e.subscribe(SubscribeParams{Pattern: "lease", LeaseDuration: 24 * time.Hour})
	e.publishN("lease", "m", 1)
	d := recv(t, long, 1)[0]
	if want := e.clock.Now().Add(24 * time.Hour); !d.LeaseDeadline.Equal(want) {
		t.Fatalf("lease deadline %s, want %s", d.LeaseDeadline, want)
	}
	if long.LeaseDuration() != 24*time.Hour {
		t.Fatalf("LeaseDuration() = %s", long.LeaseDuration())
	}
	for _, bad := range []time.Duration{-time.Second, MaxLeaseDuration + time.Second} {
		if _, err := e.b.Subscribe(e.ctx(), SubscribeParams{Pattern: "lease", LeaseDuration: bad}); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Fatalf("LeaseDuration %s: %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestSetMaxInFlightGrowsTheChannel: raising the credit above the channel's capacity replaces the
// channel, moving what it held; the member then receives up to the new credit.
// TestTake: a connection drains a member with Take after a Notify signal, in order, also across a
// SetMaxInFlight that replaced the channel, and learns from it that the member closed.
func TestTake(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("take", queueCfg)
	notify := make(chan struct{}, 1)
	m := e.subscribe(SubscribeParams{Pattern: "take", MaxInFlight: 2, Notify: notify})
	e.publishN("take", "t", 5)
	var got []*storage.Delivery
	take := func(want int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d deliveries taken", want), func() error {
			var open bool
			got, open = m.Take(got)
			if !open {
				t.Fatal("Take: member closed")
			}
			if len(got) != want {
				return fmt.Errorf("%d taken", len(got))
			}
			return nil
		})
	}
	take(2)
	if m.Waiting() != 0 || m.InFlight() != 2 {
		t.Fatalf("after Take: %d waiting, %d in flight; want 0, 2", m.Waiting(), m.InFlight())
	}
	if err := m.SetMaxInFlight(5); err != nil { // replaces the channel
		t.Fatal(err)
	}
	take(5)
	for i, d := range got {
		if d.Offset != int64(i) {
			t.Fatalf("delivery %d has offset %d", i, d.Offset)
		}
	}
	if err := m.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if ds, open := m.Take(nil); open || len(ds) != 0 {
		t.Fatalf("Take after Close = %d deliveries, open %v; want 0, false", len(ds), open)
	}
}

func TestSetMaxInFlightGrowsTheChannel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("credit", queueCfg)
	notify := make(chan struct{}, 1)
	m := e.subscribe(SubscribeParams{Pattern: "credit", MaxInFlight: 2, Notify: notify})
	e.publishN("credit", "m", 5)
	eventually(t, "two deliveries in the channel", func() error {
		if n := len(m.Deliveries()); n != 2 {
			return fmt.Errorf("%d in the channel", n)
		}
		return nil
	})
	<-notify
	old := m.Deliveries()
	if err := m.SetMaxInFlight(5); err != nil {
		t.Fatal(err)
	}
	if m.Deliveries() == old || m.MaxInFlight() != 5 {
		t.Fatal("channel not replaced")
	}
	if len(old) != 0 {
		t.Fatalf("old channel still holds %d", len(old))
	}
	ds := recv(t, m, 5)
	for i, d := range ds {
		if d.Offset != int64(i) {
			t.Fatalf("delivery %d has offset %d: order lost when moving the channel", i, d.Offset)
		}
	}
	if err := m.SetMaxInFlight(MaxInFlightLimit + 1); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("over the limit: %v", err)
	}
	// 0 keeps the leases and stops deliveries.
	if err := m.SetMaxInFlight(0); err != nil {
		t.Fatal(err)
	}
	res, err := e.b.AckBatch(e.ctx(), ds[0].SubscriptionID, m.ID(), []storage.DeliveryRef{ds[0].Ref()})
	if err != nil || res.Acked != 1 {
		t.Fatalf("AckBatch = %+v, %v", res, err)
	}
	e.publishN("credit", "n", 1)
	e.waitIdle()
	if n := len(m.Deliveries()); n != 0 {
		t.Fatalf("member with credit 0 received %d", n)
	}
	if err := m.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if err := m.SetMaxInFlight(3); !errors.Is(err, ErrMemberClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestBatchResults: AckBatch, NackBatch and ExtendBatch report counts and the refs they could not
// act on instead of failing; AckBatch gives the credit back to the member that held the deliveries.
func TestBatchResults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("batch", queueCfg)
	m := e.subscribe(SubscribeParams{Pattern: "batch", MaxInFlight: 2})
	e.publishN("batch", "m", 4)
	ds := recv(t, m, 2)
	sub := ds[0].SubscriptionID
	if !m.AttachedTo(sub) || m.AttachedTo(sub+100) {
		t.Fatal("AttachedTo")
	}
	if a := m.Subscriptions(); len(a) != 1 || a[0].SubscriptionID != sub || a[0].Topic != "batch" {
		t.Fatalf("Subscriptions() = %+v", a)
	}
	unknown := storage.DeliveryRef{Offset: 99}
	res, err := e.b.AckBatch(e.ctx(), sub, "someone-else", []storage.DeliveryRef{ds[0].Ref(), unknown})
	if err != nil || res.Acked != 1 || len(res.Unknown) != 1 {
		t.Fatalf("AckBatch = %+v, %v", res, err)
	}
	// The credit came back to m (it held ds[0]) although another member id acked.
	d2 := recv(t, m, 1)[0]
	if d2.Offset != 2 {
		t.Fatalf("next delivery offset %d", d2.Offset)
	}
	ext, err := m.ExtendBatch(e.ctx(), sub, []storage.DeliveryRef{ds[1].Ref(), unknown}, time.Hour)
	if err != nil || ext.Extended != 1 || len(ext.NotHeld) != 1 || !ext.Deadline.Equal(e.clock.Now().Add(time.Hour)) {
		t.Fatalf("ExtendBatch = %+v, %v", ext, err)
	}
	// A lease longer than MaxLeaseDuration is refused and changes nothing.
	if _, err := m.ExtendBatch(e.ctx(), sub, []storage.DeliveryRef{ds[1].Ref()}, MaxLeaseDuration+time.Millisecond); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("ExtendBatch over MaxLeaseDuration: %v, want ErrInvalidArgument", err)
	}
	nack, err := m.NackBatch(e.ctx(), sub, []storage.DeliveryRef{ds[1].Ref(), unknown}, NackOptions{ToDLQ: true})
	if err != nil || nack.DeadLettered != 1 || len(nack.NotHeld) != 1 {
		t.Fatalf("NackBatch = %+v, %v", nack, err)
	}
	if _, err := e.b.AckBatch(e.ctx(), sub, "x", []storage.DeliveryRef{{Offset: -1}}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("negative offset: %v", err)
	}
	if d3 := recv(t, m, 1)[0]; d3.Offset != 3 { // the nack gave credit back
		t.Fatalf("next delivery offset %d", d3.Offset)
	}
	released, err := m.Leave(e.ctx())
	if err != nil || released != 2 { // offsets 2 and 3
		t.Fatalf("Leave = %d, %v; want 2 released (%s)", released, err, memberState(m))
	}
	if again, err := m.Leave(e.ctx()); again != 0 || err != nil {
		t.Fatalf("second Leave = %d, %v", again, err)
	}
}

// TestEndedSubscriptions: cancelling a group or deleting a topic detaches the members and tells
// them which subscription ended and why; the member keeps its other subscriptions.
func TestEndedSubscriptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("end.a", pubSubCfg)
	e.createTopic("end.b", pubSubCfg)
	e.createTopic("end.c", pubSubCfg)
	notify := make(chan struct{}, 1)
	m := e.subscribe(SubscribeParams{Pattern: "end.*", Group: "g", Notify: notify})
	if n := len(m.Subscriptions()); n != 3 {
		t.Fatalf("attached to %d", n)
	}
	if _, err := e.b.CancelGroup(e.ctx(), "end.a", "g"); err != nil {
		t.Fatal(err)
	}
	<-notify
	if err := e.b.DeleteTopic(e.ctx(), "end.b", true); err != nil {
		t.Fatal(err)
	}
	var ended []EndedSubscription
	eventually(t, "two ended subscriptions", func() error {
		ended = append(ended, m.TakeEnded()...)
		if len(ended) != 2 {
			return fmt.Errorf("%d ended", len(ended))
		}
		return nil
	})
	byTopic := map[string]error{}
	for _, x := range ended {
		byTopic[x.Topic] = x.Err
	}
	if !errors.Is(byTopic["end.a"], storage.ErrSubscriptionNotActive) || !errors.Is(byTopic["end.b"], storage.ErrTopicNotFound) {
		t.Fatalf("ended: %+v", ended)
	}
	if a := m.Subscriptions(); len(a) != 1 || a[0].Topic != "end.c" {
		t.Fatalf("still attached to %+v", a)
	}
	e.publishN("end.c", "c", 1)
	if d := recv(t, m, 1)[0]; d.Topic != "end.c" {
		t.Fatalf("got %+v", d)
	}
}

// TestRoundRobinNewMessages: messages published one at a time go to the members in turn (seed
// 002's M2-1 expects a 5/5 split of ten messages between two consumers).
func TestRoundRobinNewMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("rr", queueCfg)
	a := e.subscribe(SubscribeParams{Pattern: "rr", Group: "g", MemberID: "a", MaxInFlight: 100})
	b := e.subscribe(SubscribeParams{Pattern: "rr", Group: "g", MemberID: "b", MaxInFlight: 100})
	for i := range 10 {
		e.waitIdle()
		e.publishN("rr", fmt.Sprint(i), 1)
		eventually(t, "delivered", func() error {
			if got := len(a.Deliveries()) + len(b.Deliveries()); got != i+1 {
				return fmt.Errorf("%d delivered", got)
			}
			return nil
		})
	}
	if na, nb := len(a.Deliveries()), len(b.Deliveries()); na != 5 || nb != 5 {
		t.Fatalf("split %d/%d, want 5/5", na, nb)
	}
}

// TestTopicPartitions: the cheap partition count used for message ids.
func TestTopicPartitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("parts.three", storage.TopicConfig{Partitions: 3})
	if n, err := e.b.TopicPartitions(e.ctx(), "parts.three"); err != nil || n != 3 {
		t.Fatalf("TopicPartitions = %d, %v; want 3", n, err)
	}
	if _, err := e.b.TopicPartitions(e.ctx(), "parts.missing"); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("missing topic: %v", err)
	}
	if _, err := e.b.TopicPartitions(e.ctx(), "bad..name"); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
}

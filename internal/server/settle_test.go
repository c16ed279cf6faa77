package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/protocol"
)

// An Ack, Nack or Extend may carry refs of several subscriptions of the connection (the Go client
// coalesces the acks of all its subscriptions into one Ack): each subscription's refs are settled
// on their own, and one that is gone or whose refs fail never keeps the others' from being
// settled; a failure of the storage itself stops the request (docs/protocol.md section 8.4).

// settleEnv is a connection holding deliveries of two subscriptions of group g: a of topic
// "s.a" and, in order, bs of topic "s.b".
type settleEnv struct {
	*env
	c      *bclient
	member string // the member of c's handle
	a      protocol.Delivery
	bs     []protocol.Delivery
	subA   int64
}

func newSettleEnv(t *testing.T, nb int) *settleEnv {
	eng, err := wal.Open(t.TempDir(), wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return newSettleEnvEngine(t, eng, nb)
}

// newSettleEnvEngine is newSettleEnv over the engine eng, which the env closes.
func newSettleEnvEngine(t *testing.T, eng storage.Engine, nb int) *settleEnv {
	e := newEnvEngine(t, eng, nil, nil)
	for _, topic := range []string{"s.a", "s.b"} {
		if _, err := e.b.CreateTopic(context.Background(), topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
			t.Fatal(err)
		}
	}
	c := e.dial(nil)
	member := c.subscribe(&protocol.Subscribe{Topic: "s.*", Group: "g", MaxInFlight: 10}).MemberID
	c.publish("s.a", "a")
	payloads := make([]string, nb)
	for i := range payloads {
		payloads[i] = fmt.Sprint("b", i)
	}
	c.publish("s.b", payloads...)
	s := &settleEnv{env: e, c: c, member: member}
	for _, d := range c.deliveriesN(1 + nb) {
		if d.Topic == "s.a" {
			s.a, s.subA = d, d.SubscriptionID
		} else {
			s.bs = append(s.bs, d)
		}
	}
	if s.subA == 0 || len(s.bs) != nb {
		t.Fatalf("deliveries: a %+v, b %+v", s.a, s.bs)
	}
	return s
}

// acked fails unless d's message is done for its subscription: acking it again finds it done (it
// will not come back after its lease).
func (s *settleEnv) acked(what string, d protocol.Delivery) {
	s.t.Helper()
	if ack := expectOK[*protocol.AckOK](s.c, &protocol.Ack{Refs: refs(d)}); ack.AlreadyDone != 1 {
		s.t.Fatalf("%s: message %s %d not acked: a second Ack answers %+v", what, d.Topic, d.Offset, ack)
	}
}

// notAcked fails unless d's message is still to be acked.
func (s *settleEnv) notAcked(what string, d protocol.Delivery) {
	s.t.Helper()
	if ack := expectOK[*protocol.AckOK](s.c, &protocol.Ack{Refs: refs(d)}); ack.Acked != 1 {
		s.t.Fatalf("%s: message %s %d was acked already: its Ack answers %+v", what, d.Topic, d.Offset, ack)
	}
}

// TestAckAcrossGoneSubscription: one Ack with refs of a subscription whose group was cancelled,
// or whose topic was deleted, after the delivery, and of a live one: the live one's message is
// acked and counted, the gone one's ref is unknown, in either order of the refs.
func TestAckAcrossGoneSubscription(t *testing.T) {
	t.Parallel()
	for _, gone := range []string{"cancelled", "topic deleted"} {
		for _, goneFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, first %v", gone, goneFirst), func(t *testing.T) {
				t.Parallel()
				s := newSettleEnv(t, 1)
				ctx := context.Background()
				if gone == "cancelled" {
					if _, err := s.b.CancelGroup(ctx, "s.a", "g"); err != nil {
						t.Fatal(err)
					}
				} else if err := s.b.DeleteTopic(ctx, "s.a", true); err != nil {
					t.Fatal(err)
				}
				rs := refs(s.a, s.bs[0])
				if !goneFirst {
					slices.Reverse(rs)
				}
				ack := expectOK[*protocol.AckOK](s.c, &protocol.Ack{Refs: rs})
				if ack.Acked != 1 || ack.AlreadyDone != 0 || !slices.Equal(ack.Unknown, refs(s.a)) {
					t.Fatalf("AckOK %+v, want 1 acked and unknown %v", ack, refs(s.a))
				}
				s.acked("the live subscription's message", s.bs[0])
			})
		}
	}
}

// TestSettleAcrossSubscriptionCancelledElsewhere: a subscription cancelled in the engine (as when
// another broker instance on the same database cancels the group) fails its own refs only,
// whether its member is still attached here or its owner found the cancel and ended it already.
// In an Extend and a Nack they are not held and the other subscription's are extended and
// nacked; in an Ack they are unknown and the other's are acked. Then the handle is told that the
// subscription ended, as for a cancel through this broker.
func TestSettleAcrossSubscriptionCancelledElsewhere(t *testing.T) {
	t.Parallel()
	s := newSettleEnv(t, 3)
	ctx := context.Background()
	if _, err := s.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: s.subA, State: storage.Cancelled}); err != nil {
		t.Fatal(err)
	}

	ext := expectOK[*protocol.ExtendOK](s.c, &protocol.Extend{Duration: broker.MaxLeaseDuration, Refs: refs(s.a, s.bs[0])})
	if ext.Extended != 1 || !slices.Equal(ext.NotHeld, refs(s.a)) {
		t.Fatalf("ExtendOK %+v, want 1 extended and not held %v", ext, refs(s.a))
	}
	nack := expectOK[*protocol.NackOK](s.c, &protocol.Nack{Delay: broker.MaxLeaseDuration, Refs: refs(s.a, s.bs[1])})
	if nack.Nacked != 1 || !slices.Equal(nack.NotHeld, refs(s.a)) {
		t.Fatalf("NackOK %+v, want 1 nacked and not held %v", nack, refs(s.a))
	}
	ack := expectOK[*protocol.AckOK](s.c, &protocol.Ack{Refs: refs(s.a, s.bs[2])})
	if ack.Acked != 1 || !slices.Equal(ack.Unknown, refs(s.a)) {
		t.Fatalf("AckOK %+v, want 1 acked and unknown %v", ack, refs(s.a))
	}
	s.acked("the live subscription's acked message", s.bs[2])
	// The owner finds the cancel (its claims are refused) and ends the member's subscription.
	for len(s.c.ended) == 0 {
		s.c.keep(s.c.read())
	}
	if se := s.c.ended[0]; se.SubscriptionID != s.subA || se.Code != protocol.CodeSubNotActive {
		t.Fatalf("SubscriptionEnded %+v, want subscription %d SUBSCRIPTION_NOT_ACTIVE", se, s.subA)
	}
	if info, err := s.memberInfo(s.member); err != nil || slices.Contains(info.Subscriptions, s.subA) {
		t.Fatalf("member %+v, %v: want it detached from subscription %d", info, err, s.subA)
	}
	// The nacked message waits for its delay: nothing of s.b is leased but the extended one.
	if st := s.groupStats("s.b", "g"); st.InFlight != 1 || st.Pending != 2 {
		t.Fatalf("s.b stats %+v, want 1 in flight (extended) of 2 pending (and the nacked one)", st)
	}
}

// TestAckAcrossFailingSubscription: a subscription whose refs fail for another reason (here a
// batch member's Ack that leaves out part of its batch: INVALID_ARGUMENT) makes the answer an
// Error, but the request's other subscriptions' refs are acked all the same.
func TestAckAcrossFailingSubscription(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(c *broker.Config) { c.RebalanceDelay = -1 })
	ctx := context.Background()
	for _, topic := range []string{"o", "s"} {
		if _, err := e.b.CreateTopic(ctx, topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
			t.Fatal(err)
		}
	}
	c := e.dial(nil)
	c.subscribe(&protocol.Subscribe{Topic: "o", Group: "g", MemberID: "a", Mode: protocol.GroupOrdered, MaxInFlight: 2,
		BatchSize: 2, Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	c.subscribe(&protocol.Subscribe{Topic: "s", Group: "g", MaxInFlight: 1, Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	c.publish("s", "s0")
	expectOK[*protocol.PublishOK](c, &protocol.Publish{Topic: "o", Messages: []protocol.PublishMessage{
		{Key: []byte("k"), Payload: []byte("o0")}, {Key: []byte("k"), Payload: []byte("o1")},
	}})
	var batch []protocol.Delivery
	var other protocol.Delivery
	for _, d := range c.deliveriesN(3) {
		if d.Topic == "o" {
			batch = append(batch, d)
		} else {
			other = d
		}
	}
	if len(batch) != 2 || batch[0].BatchLen != 2 || other.Topic != "s" {
		t.Fatalf("deliveries: batch %+v, other %+v", batch, other)
	}
	er := c.expectErr(&protocol.Ack{Refs: refs(batch[0], other)}, protocol.CodeInvalidArgument)
	if !strings.Contains(er.Message, "whole batch") {
		t.Fatalf("Ack of part of a batch answered %q: want it to name the batch", er.Message)
	}
	if ack := expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(other)}); ack.AlreadyDone != 1 {
		t.Fatalf("the other subscription's message was not acked: a second Ack answers %+v", ack)
	}
	// The batch was left as it was: acked whole, it is acked now.
	if ack := expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(batch...)}); ack.Acked != 2 {
		t.Fatalf("AckOK of the whole batch %+v, want 2 acked", ack)
	}
}

// TestSettleRefusesNegativeRefsFirst: a ref that can name no message (negative offset) is refused
// before anything is settled: INVALID_ARGUMENT changed nothing, also for the request's other
// subscriptions.
func TestSettleRefusesNegativeRefsFirst(t *testing.T) {
	t.Parallel()
	s := newSettleEnv(t, 1)
	bad := protocol.Ref{SubscriptionID: s.subA, Offset: -1}
	for _, m := range []protocol.Message{
		&protocol.Ack{Refs: append(refs(s.bs[0]), bad)},
		&protocol.Nack{Refs: append(refs(s.bs[0]), bad)},
		&protocol.Extend{Refs: append(refs(s.bs[0]), bad)},
	} {
		s.c.expectErr(m, protocol.CodeInvalidArgument)
	}
	ext := expectOK[*protocol.ExtendOK](s.c, &protocol.Extend{Refs: refs(s.bs[0])})
	if ext.Extended != 1 {
		t.Fatalf("ExtendOK %+v: the refused Nack gave the message back", ext)
	}
	s.notAcked("after the refused Ack", s.bs[0])
}

// failSettleEngine is the real engine whose acks, nacks and extends of one subscription fail
// with a storage failure, as a database that stopped answering would, and which counts those of
// the other subscriptions that reach it meanwhile (they would wait on the same storage).
type failSettleEngine struct {
	storage.Engine
	mu     sync.Mutex
	sub    int64 // 0: none fails
	err    error // nil: storage.ErrUnavailable
	others int
}

// fail makes the settles of sub fail with err (nil: unavailable); sub 0 ends the failure.
func (f *failSettleEngine) fail(sub int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sub, f.err, f.others = sub, err, 0
}

// othersCalled returns how many settles of other subscriptions reached the engine since fail.
func (f *failSettleEngine) othersCalled() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.others
}

// failing returns the injected failure of a settle of sub, counting one of another subscription.
func (f *failSettleEngine) failing(sub int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.sub == 0:
		return nil
	case sub != f.sub:
		f.others++
		return nil
	case f.err != nil:
		return f.err
	}
	return fmt.Errorf("%w: injected settle failure", storage.ErrUnavailable)
}

func (f *failSettleEngine) DeliveriesAck(ctx context.Context, p *storage.DeliveriesAckParams) (*storage.DeliveriesAckResult, error) {
	if err := f.failing(p.SubscriptionID); err != nil {
		return nil, err
	}
	return f.Engine.DeliveriesAck(ctx, p)
}

func (f *failSettleEngine) DeliveriesNack(ctx context.Context, p *storage.DeliveriesNackParams) (*storage.DeliveriesNackResult, error) {
	if err := f.failing(p.SubscriptionID); err != nil {
		return nil, err
	}
	return f.Engine.DeliveriesNack(ctx, p)
}

func (f *failSettleEngine) DeliveriesExtend(ctx context.Context, p *storage.DeliveriesExtendParams) (*storage.DeliveriesExtendResult, error) {
	if err := f.failing(p.SubscriptionID); err != nil {
		return nil, err
	}
	return f.Engine.DeliveriesExtend(ctx, p)
}

// TestSettleStopsAtStorageFailure: an Extend, Nack or Ack whose first subscription's refs fail
// with a failure of the storage itself (unavailable, full, a timeout) is answered with that
// failure's Error at once: the engine is not called for the next subscription, whose call would
// wait on the same storage (a database that stopped answering: tx_timeout per subscription).
// The next subscription's refs were not settled, so the same request settles them once the
// storage answers again.
func TestSettleStopsAtStorageFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		code uint16
	}{
		{"unavailable", &storage.IOError{Kind: storage.ErrUnavailable, Reason: "database unreachable", Err: errors.New("injected")}, protocol.CodeStorageUnavailable},
		{"full", &storage.IOError{Kind: storage.ErrFull, Reason: "no space left on device", Err: errors.New("injected")}, protocol.CodeStorageFull},
		{"timeout", fmt.Errorf("injected: transaction exceeded tx_timeout: %w", context.DeadlineExceeded), protocol.CodeTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wengine, err := wal.Open(t.TempDir(), wal.Config{})
			if err != nil {
				t.Fatal(err)
			}
			eng := &failSettleEngine{Engine: wengine}
			s := newSettleEnvEngine(t, eng, 3)
			for _, m := range []protocol.Message{
				&protocol.Extend{Duration: broker.MaxLeaseDuration, Refs: refs(s.a, s.bs[0])},
				&protocol.Nack{Refs: refs(s.a, s.bs[1])},
				&protocol.Ack{Refs: refs(s.a, s.bs[2])},
			} {
				eng.fail(s.subA, tc.err)
				s.c.expectErr(m, tc.code)
				if n := eng.othersCalled(); n != 0 {
					t.Errorf("%T after the storage failure: %d settles of the other subscription reached the engine, want none", m, n)
				}
			}
			if st := s.groupStats("s.b", "g"); st.InFlight != 3 {
				t.Fatalf("s.b stats %+v, want its 3 messages still in flight (not nacked, not acked)", st)
			}
			eng.fail(0, nil)
			ack := expectOK[*protocol.AckOK](s.c, &protocol.Ack{Refs: refs(append([]protocol.Delivery{s.a}, s.bs...)...)})
			if ack.Acked != 4 {
				t.Fatalf("AckOK %+v once the storage answers, want 4 acked", ack)
			}
		})
	}
}

// TestTextSettleStopsAtStorageFailure: a text session's ACK and NACK name tags of two
// subscriptions (a wildcard SUBSCRIBE), and the first one's fail with a storage failure. As a
// binary Ack, the answer is the failure's ERR at once, without calling the engine for the other
// subscription; the tags of both stay held, so the same ACK works once the storage is back.
func TestTextSettleStopsAtStorageFailure(t *testing.T) {
	t.Parallel()
	wengine, err := wal.Open(t.TempDir(), wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	eng := &failSettleEngine{Engine: wengine}
	e := newEnvEngine(t, eng, fastPublisherIdle, nil)
	ctx := context.Background()
	for _, topic := range []string{"s.a", "s.b"} {
		if _, err := e.b.CreateTopic(ctx, topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
			t.Fatal(err)
		}
	}
	c := e.dialText()
	c.send("VERBOSE ON", "JOIN_GROUP g c", "SUBSCRIBE s.* FROM_BEGINNING")
	c.expect("OK verbose on")
	c.expect("OK group g consumer c")
	c.expect("OK subscribed s.*")
	for _, m := range []struct{ topic, payload string }{{"s.a", "a0"}, {"s.a", "a1"}, {"s.b", "b0"}, {"s.b", "b1"}} {
		if _, err := e.b.Publish(ctx, m.topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte(m.payload)}}); err != nil {
			t.Fatal(err)
		}
	}
	tags := map[string]uint64{} // by payload
	for range 4 {
		r := parseReply(t, c.expect("DELIVERY "))
		tags[string(r.Delivery.Payload)] = r.Delivery.Tag
	}
	info, err := e.b.Group(ctx, "s.a", "g")
	if err != nil {
		t.Fatal(err)
	}
	eng.fail(info.Subscription.ID, nil)

	c.send(fmt.Sprintf("ACK %d %d", tags["a0"], tags["b0"]))
	c.expect("ERR STORAGE_UNAVAILABLE")
	c.send(fmt.Sprintf("NACK %d %d", tags["a1"], tags["b1"]))
	c.expect("ERR STORAGE_UNAVAILABLE")
	if n := eng.othersCalled(); n != 0 {
		t.Fatalf("%d settles of s.b reached the engine after the storage failure, want none", n)
	}
	if st := e.groupStats("s.b", "g"); st.InFlight != 2 {
		t.Fatalf("s.b stats %+v: want b0 and b1 still in flight (not acked, not nacked)", st)
	}

	// Every tag is still held: acked now that the storage answers.
	eng.fail(0, nil)
	c.send(fmt.Sprintf("ACK %d %d %d %d", tags["a0"], tags["b0"], tags["a1"], tags["b1"]))
	c.expect("OK 4 acked")
}

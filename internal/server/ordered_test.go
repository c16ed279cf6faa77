package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// TestOrderedGroupOnTheWire: Subscribe with mode ORDERED joins an ordered group; deliveries carry
// the generation; after a second member took the partition, the first one's Ack, Nack and Extend
// are refused with STALE_GENERATION, and the new owner gets the message and acks it.
func TestOrderedGroupOnTheWire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(c *broker.Config) { c.RebalanceDelay = -1 })
	if _, err := e.b.CreateTopic(context.Background(), "o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	ca, cb := e.dial(nil), e.dial(nil)
	sa := ca.subscribe(&protocol.Subscribe{Topic: "o", Group: "g", MemberID: "a", Mode: protocol.GroupOrdered,
		Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	eventually(t, "a owns both partitions", func() error {
		a, err := e.b.GroupAssignment(context.Background(), "o", "g")
		if err != nil || len(a.Members["a"]) != 2 {
			return fmt.Errorf("assignment %+v, %v", a, err)
		}
		return nil
	})
	expectOK[*protocol.PublishOK](ca, &protocol.Publish{Topic: "o", Messages: []protocol.PublishMessage{{Partition: 1, Payload: []byte("m")}}})
	old := ca.deliveriesN(1)[0]
	if old.Handle != sa.Handle || old.Generation != 1 || old.Partition != 1 {
		t.Fatalf("delivery %+v, want generation 1 on partition 1", old)
	}
	cb.subscribe(&protocol.Subscribe{Topic: "o", Group: "g", MemberID: "b", Mode: protocol.GroupOrdered})
	got := cb.deliveriesN(1)[0]
	if got.Offset != old.Offset || got.Generation != 2 {
		t.Fatalf("new owner's delivery %+v, want offset %d generation 2", got, old.Offset)
	}
	ca.expectErr(&protocol.Ack{Refs: refs(old)}, protocol.CodeStaleGeneration)
	ca.expectErr(&protocol.Nack{Refs: refs(old)}, protocol.CodeStaleGeneration)
	ca.expectErr(&protocol.Extend{Refs: refs(old)}, protocol.CodeStaleGeneration)
	if ack := expectOK[*protocol.AckOK](cb, &protocol.Ack{Refs: refs(got)}); ack.Acked != 1 {
		t.Fatalf("new owner's AckOK %+v", ack)
	}
	// A shared member of the ordered group is refused: modes do not mix.
	cb.expectErr(&protocol.Subscribe{Topic: "o", Group: "g"}, protocol.CodeSubExists)
}

// TestTextJoinGroupOrdered: JOIN_GROUP ... ORDERED joins an ordered group; its deliveries are
// acked without a generation on the line (the broker's current one is used).
func TestTextJoinGroupOrdered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fastPublisherIdle, func(c *broker.Config) { c.RebalanceDelay = -1 })
	if _, err := e.b.CreateTopic(context.Background(), "o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	a := e.dialText()
	a.send("JOIN_GROUP g a ORDERED", "SUBSCRIBE o FROM_BEGINNING")
	a.expect("OK group g consumer a ordered")
	a.expect("OK subscribed o")
	eventually(t, "a owns the partitions", func() error {
		asg, err := e.b.GroupAssignment(context.Background(), "o", "g")
		if err != nil || len(asg.Members["a"]) != 3 {
			return fmt.Errorf("assignment %+v, %v", asg, err)
		}
		return nil
	})
	p := e.dialText()
	p.send("PUBLISH o x")
	p.expect("OK ")
	a.expectLine("MESSAGE o x")
	a.send("ACK 1")
	a.expect("OK 1 acked")
	if st := e.groupStats("o", "g"); st.Pending != 0 {
		t.Fatalf("stats %+v", st)
	}
	// A shared member cannot join the ordered group.
	b := e.dialText()
	b.send("JOIN_GROUP g b", "SUBSCRIBE o")
	b.expect("OK group g consumer b")
	b.expect("ERR SUBSCRIPTION_EXISTS")
}

// TestOrderedMixedAckFrame: one Ack frame with refs of a kept and of a lost partition (same
// generation) acks the kept one and answers STALE_GENERATION; the kept one is then done.
func TestOrderedMixedAckFrame(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(c *broker.Config) { c.RebalanceDelay = -1 })
	if _, err := e.b.CreateTopic(context.Background(), "o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	ca, cb := e.dial(nil), e.dial(nil)
	ca.subscribe(&protocol.Subscribe{Topic: "o", Group: "g", MemberID: "a", Mode: protocol.GroupOrdered,
		Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	eventually(t, "a owns both partitions", func() error {
		a, err := e.b.GroupAssignment(context.Background(), "o", "g")
		if err != nil || len(a.Members["a"]) != 2 {
			return fmt.Errorf("assignment %+v, %v", a, err)
		}
		return nil
	})
	expectOK[*protocol.PublishOK](ca, &protocol.Publish{Topic: "o", Messages: []protocol.PublishMessage{
		{Partition: 0, Payload: []byte("k")}, {Partition: 1, Payload: []byte("l")}}})
	held := ca.deliveriesN(2)
	cb.subscribe(&protocol.Subscribe{Topic: "o", Group: "g", MemberID: "b", Mode: protocol.GroupOrdered})
	cb.deliveriesN(1)
	ca.expectErr(&protocol.Ack{Refs: refs(held...)}, protocol.CodeStaleGeneration)
	for _, d := range held {
		if d.Partition == 0 {
			if ack := expectOK[*protocol.AckOK](ca, &protocol.Ack{Refs: refs(d)}); ack.AlreadyDone != 1 {
				t.Fatalf("kept partition's ref after the mixed frame: %+v, want already done", ack)
			}
		}
	}
}

package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// TestOrderedGroupStaleAck: an ordered member holding deliveries of two partitions loses one of
// them to a member that joins; acking both at once acks the kept one and fails the lost one with
// ErrStaleGeneration (also when the two acks share one Ack frame); the new owner gets the lost
// message, and the first member goes on receiving its partition without resubscribing.
func TestOrderedGroupStaleAck(t *testing.T) {
	t.Parallel()
	b := startBroker(t, nil)
	b.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	type got struct {
		member string
		d      *Delivery
	}
	ch := make(chan got, 16)
	sub := func(id string) {
		c := b.dial(t)
		_, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "o", Group: "g", Ordered: true, Start: FromBeginning()},
			func(_ context.Context, d *Delivery) error { ch <- got{id, d}; return nil }, ManualAck(), MemberID(id))
		if err != nil {
			t.Fatalf("Subscribe %s: %v", id, err)
		}
	}
	sub("a")
	testutil.Eventually(t, waitTimeout, "a owns both partitions", func() error {
		asg, err := b.broker.GroupAssignment(context.Background(), "o", "g")
		if err != nil || len(asg.Members["a"]) != 2 {
			return fmt.Errorf("assignment %+v, %v", asg, err)
		}
		return nil
	})
	pub := b.dial(t)
	for p := range int32(2) {
		if _, err := pub.Publish(context.Background(), "o", Message{PinPartition: true, Partition: p, Payload: []byte{'0' + byte(p)}}); err != nil {
			t.Fatal(err)
		}
	}
	next := func() got {
		t.Helper()
		select {
		case g := <-ch:
			return g
		case <-time.After(waitTimeout):
			t.Fatalf("no delivery within %s", waitTimeout)
			return got{}
		}
	}
	held := map[int32]*Delivery{}
	for range 2 {
		g := next()
		held[g.d.Partition] = g.d
	}
	sub("b") // round robin over a, b: b takes partition 1
	moved := next()
	if moved.member != "b" || moved.d.Partition != 1 {
		t.Fatalf("after the join %s got partition %d, want b partition 1", moved.member, moved.d.Partition)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for p := range 2 {
		wg.Go(func() { errs[p] = held[int32(p)].Ack(context.Background()) })
	}
	wg.Wait()
	if errs[0] != nil || !errors.Is(errs[1], protocol.ErrStaleGeneration) {
		t.Fatalf("acks of the kept and the lost partition: %v, %v; want nil, STALE_GENERATION", errs[0], errs[1])
	}
	if err := moved.d.Ack(context.Background()); err != nil {
		t.Fatalf("new owner's ack: %v", err)
	}
	if _, err := pub.Publish(context.Background(), "o", Message{PinPartition: true, Partition: 0, Payload: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	if g := next(); g.member != "a" || string(g.d.Payload) != "again" {
		t.Fatalf("partition 0 went to %s (%q), want a", g.member, g.d.Payload)
	}
}

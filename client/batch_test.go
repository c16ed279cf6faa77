package client

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// TestSubscribeBatch: a batch handler of an ordered member with batch size 2 and credit 1 gets a
// publish's run of 4 messages of one key as one call (in offset order), never split; an error
// nacks the whole batch, which comes back whole (attempt 2) before the next publish's message;
// nil acks it and the next batch follows. An Ack of one delivery of the batch is refused and
// does not keep the handler's error from nacking the whole. Bad parameters are refused before anything is sent.
func TestSubscribeBatch(t *testing.T) {
	t.Parallel()
	b := startBroker(t, nil)
	b.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	c := b.dial(t)
	ctx := context.Background()
	noop := func(context.Context, []*Delivery) error { return nil }
	for _, p := range []SubscribeParams{
		{Topic: "o", Group: "g", BatchSize: 2},
		{Topic: "o", Group: "g", Ordered: true},
		{Topic: "o", Group: "g", Ordered: true, BatchSize: 1001},
	} {
		if _, err := c.SubscribeBatch(ctx, p, noop); !errors.Is(err, protocol.ErrInvalidArgument) {
			t.Fatalf("SubscribeBatch(%+v): %v, want ErrInvalidArgument", p, err)
		}
	}
	if _, err := c.Subscribe(ctx, SubscribeParams{Topic: "o", Group: "g", Ordered: true, BatchSize: 2},
		func(context.Context, *Delivery) error { return nil }); !errors.Is(err, protocol.ErrInvalidArgument) {
		t.Fatalf("Subscribe with BatchSize: %v, want ErrInvalidArgument", err)
	}

	batches := make(chan []*Delivery, 8)
	failed := false
	_, err := c.SubscribeBatch(ctx, SubscribeParams{Topic: "o", Group: "g", Ordered: true, BatchSize: 2, MaxInFlight: 1, Start: FromBeginning()},
		func(_ context.Context, batch []*Delivery) error {
			batches <- batch
			if !failed {
				failed = true
				// Part of a batch cannot be settled alone; the handler's error still nacks all.
				if err := batch[0].Ack(context.Background()); !errors.Is(err, protocol.ErrInvalidArgument) {
					t.Errorf("ack of one delivery of a batch of %d: %v, want ErrInvalidArgument", len(batch), err)
				}
				return errors.New("downstream down")
			}
			return nil
		}, NackDelay(0))
	if err != nil {
		t.Fatalf("SubscribeBatch: %v", err)
	}
	testutil.Eventually(t, waitTimeout, "the member owns both partitions", func() error {
		asg, err := b.broker.GroupAssignment(ctx, "o", "g")
		if err != nil || len(asg.Members) != 1 {
			return fmt.Errorf("assignment %+v, %v", asg, err)
		}
		return nil
	})
	run := make([]Message, 4)
	for i := range run {
		run[i] = Message{PinPartition: true, Partition: 1, Key: []byte("k"), Payload: fmt.Appendf(nil, "k-%d", i)}
	}
	if _, err := c.PublishBatch(ctx, "o", run); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "o", Message{PinPartition: true, Partition: 1, Key: []byte("j"), Payload: []byte("j-0")}); err != nil {
		t.Fatal(err)
	}
	check := func(batch []*Delivery, from int64, n, attempt int) {
		t.Helper()
		if len(batch) != n {
			t.Fatalf("batch of %d, want %d", len(batch), n)
		}
		for i, d := range batch {
			if d.Partition != 1 || d.Offset != from+int64(i) || d.Attempt != attempt {
				t.Fatalf("batch[%d] = %d:%d attempt %d, want %d:%d attempt %d", i, d.Partition, d.Offset, d.Attempt, 1, from+int64(i), attempt)
			}
		}
	}
	check(recv(t, batches, "first batch"), 0, 4, 1)
	check(recv(t, batches, "the nacked batch again"), 0, 4, 2)
	check(recv(t, batches, "the next batch"), 4, 1, 1)
}

// TestBatchDeliveryAckStaysLocal: an Ack of one delivery of a batch is refused by the client
// and never sent: coalesced with other subscriptions' acks, the broker's refusal of a part of a
// batch would have failed their acks too. The batch's own Ack carries all its refs.
func TestBatchDeliveryAckStaysLocal(t *testing.T) {
	t.Parallel()
	_, c, p := pipeClient(t, nil)
	ackErr := make(chan error, 1)
	ch := make(chan error, 1)
	go func() {
		_, err := c.SubscribeBatch(context.Background(), SubscribeParams{Topic: "orders", Group: "g", Ordered: true, BatchSize: 2},
			func(_ context.Context, batch []*Delivery) error {
				ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
				defer cancel()
				ackErr <- batch[0].Ack(ctx)
				return nil
			})
		ch <- err
	}()
	corr, _ := expect[*protocol.Subscribe](p)
	p.write(corr, &protocol.SubscribeOK{Handle: 1, MemberID: "m1", Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 10, Topic: "orders"}}})
	if err := recv(t, ch, "SubscribeBatch"); err != nil {
		t.Fatal(err)
	}
	ds := []protocol.Delivery{delivery(1, 0, "a"), delivery(1, 1, "b")}
	for i := range ds {
		ds[i].BatchLen, ds[i].BatchOffset = 2, 0
	}
	p.write(0, &protocol.Deliver{Deliveries: ds})
	if err := recv(t, ackErr, "the handler's Ack"); !errors.Is(err, protocol.ErrInvalidArgument) {
		t.Fatalf("Ack of one delivery of a batch: %v, want ErrInvalidArgument", err)
	}
	corr, ack := expect[*protocol.Ack](p)
	if len(ack.Refs) != 2 {
		t.Fatalf("first Ack frame has %d refs, want the batch's 2", len(ack.Refs))
	}
	p.write(corr, &protocol.AckOK{Acked: 2})
}

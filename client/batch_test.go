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

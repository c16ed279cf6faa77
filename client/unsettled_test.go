package client

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestHandlerLeavesUnsettled: a handler that returns ErrUnsettled (wrapped) settles nothing: the
// delivery is not nacked (the group counts no failure) and goes back to the group when the
// Subscription closes, delivered again as the next attempt.
func TestHandlerLeavesUnsettled(t *testing.T) {
	t.Parallel()
	b := startBroker(t, nil)
	b.createTopic("jobs", storage.TopicConfig{Semantics: storage.PubSub})
	c := b.dial(t)
	ctx := context.Background()
	var handled atomic.Int32
	done := make(chan struct{})
	sub, err := c.Subscribe(ctx, SubscribeParams{Topic: "jobs", Group: "g", MaxInFlight: 3},
		func(_ context.Context, d *Delivery) error {
			n := handled.Add(1)
			if n == 3 {
				close(done)
			}
			if n == 1 {
				return nil // acked
			}
			return fmt.Errorf("stopping before handling it: %w", ErrUnsettled)
		}, Concurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := c.Publish(ctx, "jobs", Message{Payload: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	recv(t, done, "three deliveries handled")
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := b.broker.Group(ctx, "jobs", "g")
	if err != nil {
		t.Fatal(err)
	}
	if g.Counts.Processed != 1 || g.Counts.Failed != 0 {
		t.Fatalf("group counts %+v, want 1 processed and no failure (nothing nacked)", g.Counts)
	}
	again := make(chan *Delivery, 2)
	sub2, err := c.Subscribe(ctx, SubscribeParams{Topic: "jobs", Group: "g", MaxInFlight: 2},
		func(_ context.Context, d *Delivery) error { again <- d; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Close(ctx)
	for range 2 {
		d := recv(t, again, "a released delivery again")
		if d.Attempt != 2 {
			t.Fatalf("%s delivered again at attempt %d, want 2", d.Payload, d.Attempt)
		}
	}
}

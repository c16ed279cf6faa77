package client

import (
	"context"
	"errors"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// TestSubscriptionEndedByBroker: when the broker ends the one subscription of a topic-name
// Subscription (group cancelled, topic deleted), the Subscription stops with the reason and does
// not subscribe again; a pattern's Subscription goes on with its other topics.
func TestSubscriptionEndedByBroker(t *testing.T) {
	t.Parallel()

	noop := func(context.Context, *Delivery) error { return nil }
	ended := func(t *testing.T, sub *Subscription, want error) {
		t.Helper()
		recv(t, sub.Done(), "Done after the broker ended the subscription")
		if err := sub.Err(); !errors.Is(err, want) {
			t.Fatalf("Err() = %v, want %v", err, want)
		}
	}

	t.Run("GroupCancelled", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
		c := b.dial(t)
		sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders", Group: "billing"}, noop)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.broker.CancelGroup(context.Background(), "orders", "billing"); err != nil {
			t.Fatal(err)
		}
		ended(t, sub, protocol.ErrSubscriptionNotActive)
		// Not subscribed again: that would have created a new, ACTIVE subscription of the group.
		g, err := b.broker.Group(context.Background(), "orders", "billing")
		if err != nil {
			t.Fatal(err)
		}
		if g.State != storage.Cancelled {
			t.Fatalf("group state %s after the end, want %s", g.State, storage.Cancelled)
		}
	})

	t.Run("TopicDeleted", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
		c := b.dial(t)
		sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders", Group: "billing"}, noop)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.broker.DeleteTopic(context.Background(), "orders", true); err != nil {
			t.Fatal(err)
		}
		ended(t, sub, protocol.ErrSubscriptionNotFound)
	})

	t.Run("PatternGoesOn", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders.eu", storage.TopicConfig{Semantics: storage.PubSub})
		b.createTopic("orders.us", storage.TopicConfig{Semantics: storage.PubSub})
		endedEv := make(chan SubscriptionEndedEvent, 4)
		c := b.dial(t, Hooks(endedHook(func(e SubscriptionEndedEvent) { endedEv <- e })))
		got := make(chan string, 4)
		sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders.*", Group: "billing"}, func(_ context.Context, d *Delivery) error {
			got <- d.Topic
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.broker.DeleteTopic(context.Background(), "orders.eu", true); err != nil {
			t.Fatal(err)
		}
		if ev := recv(t, endedEv, "the end of orders.eu"); ev.Topic != "orders.eu" || ev.HandleClosed {
			t.Fatalf("ended event %+v", ev)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if _, err := c.Publish(ctx, "orders.us", Message{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if topic := recv(t, got, "a delivery of orders.us"); topic != "orders.us" {
			t.Fatalf("delivery of %q", topic)
		}
		select {
		case <-sub.Done():
			t.Fatalf("pattern subscription ended: %v", sub.Err())
		default:
		}
	})
}

type endedHook func(SubscriptionEndedEvent)

func (f endedHook) OnSubscriptionEnded(e SubscriptionEndedEvent) { f(e) }

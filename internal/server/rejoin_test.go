package server

import (
	"context"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// TestSubscribeRejoin: a version-5 Subscribe with rejoin joins the subscription it names while it
// lives and otherwise is refused with the end's code, creating nothing; a version-4 session's
// Subscribe (no rejoin on the wire) still creates a new subscription of a cancelled group.
func TestSubscribeRejoin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	if _, err := e.b.CreateTopic(ctx, "orders", storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
		t.Fatal(err)
	}
	c := e.dial(nil)
	first := c.subscribe(&protocol.Subscribe{Topic: "orders", Group: "billing", MaxInFlight: 1})
	id := first.Subscriptions[0].SubscriptionID
	again := c.subscribe(&protocol.Subscribe{Topic: "orders", Group: "billing", MaxInFlight: 1, Rejoin: id})
	if len(again.Subscriptions) != 1 || again.Subscriptions[0].SubscriptionID != id {
		t.Fatalf("rejoin of a live group joined %+v, want subscription %d", again.Subscriptions, id)
	}

	c.expectErr(&protocol.Subscribe{Topic: "orders.*", Group: "billing", Rejoin: id}, protocol.CodeInvalidArgument)
	c.expectErr(&protocol.Subscribe{Topic: "nothere", Group: "billing", Rejoin: id}, protocol.CodeTopicNotFound)
	if _, err := e.b.CancelGroup(ctx, "orders", "billing"); err != nil {
		t.Fatal(err)
	}
	c.expectErr(&protocol.Subscribe{Topic: "orders", Group: "billing", Rejoin: id}, protocol.CodeSubNotActive)
	c.expectErr(&protocol.Subscribe{Topic: "orders", Group: "billing", Rejoin: id + 100}, protocol.CodeSubNotFound)
	gs, err := e.b.TopicGroups(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 1 || gs[0].State != storage.Cancelled {
		t.Fatalf("groups after the refused rejoins: %d, want the cancelled one only", len(gs))
	}
	if bs, err := e.b.Bindings(ctx); err != nil || len(bs) != 0 {
		t.Fatalf("bindings after the refused rejoins: %d, %v", len(bs), err)
	}

	old := e.dial(&protocol.Hello{ClientName: "old", MinVersion: protocol.Version2, MaxVersion: protocol.Version4})
	ok := old.subscribe(&protocol.Subscribe{Topic: "orders", Group: "billing", MaxInFlight: 1})
	if len(ok.Subscriptions) != 1 || ok.Subscriptions[0].SubscriptionID == id {
		t.Fatalf("version-4 Subscribe of a cancelled group joined %+v, want a new subscription", ok.Subscriptions)
	}
}

// TestTopicDeletedSameCodeConnectedOrAway: a topic deleted while a handle is connected ends its
// subscription with the code that refuses the rejoin of a client that was away when it was
// deleted: TOPIC_NOT_FOUND, one reason for one event. Before, the push said
// SUBSCRIPTION_NOT_FOUND.
func TestTopicDeletedSameCodeConnectedOrAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	if _, err := e.b.CreateTopic(ctx, "orders", storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
		t.Fatal(err)
	}
	connected := e.dial(nil)
	sub := connected.subscribe(&protocol.Subscribe{Topic: "orders", Group: "billing", MaxInFlight: 1})
	away := e.dial(nil)
	awayID := away.subscribe(&protocol.Subscribe{Topic: "orders", Group: "audit", MaxInFlight: 1}).Subscriptions[0].SubscriptionID
	_ = away.nc.Close()
	if err := e.b.DeleteTopic(ctx, "orders", true); err != nil {
		t.Fatal(err)
	}
	for len(connected.ended) == 0 {
		corr, m := connected.read()
		connected.keep(corr, m)
	}
	if se := connected.ended[0]; se.Handle != sub.Handle || se.Topic != "orders" || se.Code != protocol.CodeTopicNotFound {
		t.Fatalf("SubscriptionEnded %+v, want TOPIC_NOT_FOUND (%d)", se, protocol.CodeTopicNotFound)
	}
	back := e.dial(nil)
	back.expectErr(&protocol.Subscribe{Topic: "orders", Group: "audit", MaxInFlight: 1, Rejoin: awayID}, protocol.CodeTopicNotFound)
}

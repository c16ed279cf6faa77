package client

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// awayChange subscribes to topic with params on b, drops the connection, runs change on the broker
// while the client is away, lets it reconnect, and returns the Subscription once the resubscription
// ended it, and the SubscriptionEndedHook event it reported. before runs once subscribed, with the
// client, before the connection drops.
func awayChange(t *testing.T, b *testBroker, p SubscribeParams, before func(*Client), change func()) (*Subscription, SubscriptionEndedEvent) {
	t.Helper()
	dialer, reconnect := gatedDialer()
	endedEv := make(chan SubscriptionEndedEvent, 4)
	c := b.dial(t, dialer, Hooks(endedHook(func(e SubscriptionEndedEvent) { endedEv <- e })))
	got := make(chan struct{}, 16)
	sub, err := c.Subscribe(context.Background(), p, func(context.Context, *Delivery) error {
		got <- struct{}{}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(c)
		recv(t, got, "a delivery before the connection drops")
	}
	_ = c.current().nc.Close() // a dropped TCP connection
	change()
	reconnect <- struct{}{}
	recv(t, sub.Done(), "Done after the refused resubscription")
	return sub, recv(t, endedEv, "the end reported to the hook")
}

// wantEnded fails t unless sub and the hook's event ended with want.
func wantEnded(t *testing.T, sub *Subscription, ev SubscriptionEndedEvent, topic string, want error) {
	t.Helper()
	if err := sub.Err(); !errors.Is(err, want) {
		t.Fatalf("Err() = %v, want %v", err, want)
	}
	if ev.Topic != topic || ev.HandleClosed || !errors.Is(ev.Err, want) {
		t.Fatalf("ended event %+v, want %v on %s", ev, want, topic)
	}
}

// TestResubscribeRejoin: the resubscription of a topic name after a reconnect rejoins the
// subscription the handle was on and creates nothing on the broker: a group removed meanwhile ends
// the Subscription with SUBSCRIPTION_NOT_FOUND without a new group; a deleted topic ends it with
// TOPIC_NOT_FOUND (with or without a group) without a binding waiting for the topic; and a
// Subscription made before its topic existed learns its subscription from its deliveries, so that
// a cancel while away ends it too instead of making a new group. (A cancel of a group subscribed
// after its topic existed: TestResubscribeAfterCancel.)
func TestResubscribeRejoin(t *testing.T) {
	t.Parallel()
	publish := func(topic string) func(*Client) {
		return func(c *Client) {
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			if _, err := c.Publish(ctx, topic, Message{Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("GroupRemoved", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
		sub, ev := awayChange(t, b, SubscribeParams{Topic: "orders", Group: "billing"}, nil, func() {
			if _, err := b.broker.RemoveGroup(context.Background(), "orders", "billing"); err != nil {
				t.Fatal(err)
			}
		})
		wantEnded(t, sub, ev, "orders", protocol.ErrSubscriptionNotFound)
		gs, err := b.broker.TopicGroups(context.Background(), "orders")
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gs {
			if g.State != storage.Deleted {
				t.Fatalf("group %s: subscription %d %s after the refused resubscription", g.Group, g.Subscription.ID, g.State)
			}
		}
	})

	for _, group := range []string{"billing", ""} {
		t.Run("TopicDeleted/group="+group, func(t *testing.T) {
			t.Parallel()
			b := startBroker(t, nil)
			b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
			sub, ev := awayChange(t, b, SubscribeParams{Topic: "orders", Group: group}, nil, func() {
				if err := b.broker.DeleteTopic(context.Background(), "orders", true); err != nil {
					t.Fatal(err)
				}
			})
			wantEnded(t, sub, ev, "orders", protocol.ErrTopicNotFound)
			bs, err := b.broker.Bindings(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(bs) != 0 {
				t.Fatalf("bindings %+v after the refused resubscription", bs[0])
			}
		})
	}

	t.Run("TopicCreatedLater", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		var cancelled int64
		sub, ev := awayChange(t, b, SubscribeParams{Topic: "orders", Group: "billing"}, func(c *Client) {
			b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
			publish("orders")(c)
		}, func() {
			g, err := b.broker.CancelGroup(context.Background(), "orders", "billing")
			if err != nil {
				t.Fatal(err)
			}
			cancelled = g.ID
		})
		wantEnded(t, sub, ev, "orders", protocol.ErrSubscriptionNotActive)
		onlyGroup(t, b, "orders", cancelled, storage.Cancelled)
	})
}

// TestResubscribeRejoinField: the resubscription names the subscription it rejoins to a broker of
// protocol version 5, and to an older broker (which cannot take it) sends the Subscribe of the
// first time, whose answer the client compares with the subscription it had.
func TestResubscribeRejoinField(t *testing.T) {
	t.Parallel()
	for _, v := range []uint16{protocol.Version4, protocol.Version5} {
		t.Run(fmt.Sprintf("version=%d", v), func(t *testing.T) {
			t.Parallel()
			n, c, p := pipeClient(t, nil)
			sub, _ := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g"}, func(context.Context, *Delivery) error { return nil })
			_ = p.nc.Close()

			p = n.acceptPeer(t)
			p.handshake(func(ok *protocol.HelloOK) { ok.Version = v })
			corr, req := expect[*protocol.Subscribe](p)
			if v >= protocol.Version5 {
				if req.Rejoin != 10 {
					t.Fatalf("resubscription with rejoin %d, want 10", req.Rejoin)
				}
				p.write(corr, protocol.ErrSubscriptionNotActive.Errorf("subscription 10 of group \"g\" on topic \"orders\" was cancelled"))
			} else {
				if req.Rejoin != 0 {
					t.Fatalf("resubscription to a version-%d broker with rejoin %d", v, req.Rejoin)
				}
				// An older broker took it for a new group.
				p.write(corr, &protocol.SubscribeOK{Handle: 2, MemberID: "m1", Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 11, Topic: "orders"}}})
				if _, un := expect[*protocol.Unsubscribe](p); un.Handle != 2 {
					t.Fatalf("gave back handle %d, want 2", un.Handle)
				}
			}
			recv(t, sub.Done(), "Done after the resubscription")
			if err := sub.Err(); !errors.Is(err, protocol.ErrSubscriptionNotActive) {
				t.Fatalf("Err() = %v, want SUBSCRIPTION_NOT_ACTIVE", err)
			}
		})
	}
}

package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/server"
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
		// TOPIC_NOT_FOUND, as a rejoin after a reconnect is refused for the same deletion.
		ended(t, sub, protocol.ErrTopicNotFound)
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

// TestResubscribeRefusedNotActive: a resubscription that the broker refuses with
// SUBSCRIPTION_NOT_ACTIVE (the group's subscription is no longer active) ends the Subscription
// with that reason instead of being retried, for a topic name and a pattern alike: neither has a
// handle left to go on with. The peer plays the broker (the current one takes such a Subscribe as
// a new group instead).
func TestResubscribeRefusedNotActive(t *testing.T) {
	t.Parallel()
	for _, topic := range []string{"orders", "orders.*"} {
		t.Run(topic, func(t *testing.T) {
			t.Parallel()
			n, c, p := pipeClient(t, nil)
			sub, _ := subscribePipe(t, c, p, SubscribeParams{Topic: topic, Group: "g"}, func(context.Context, *Delivery) error { return nil })
			_ = p.nc.Close()

			p = n.acceptPeer(t)
			p.handshake(nil)
			corr, _ := expect[*protocol.Subscribe](p)
			p.write(corr, protocol.ErrSubscriptionNotActive.Errorf("subscription 10 of group \"g\" is CANCELLED"))
			recv(t, sub.Done(), "Done after the refused resubscription")
			if err := sub.Err(); !errors.Is(err, protocol.ErrSubscriptionNotActive) {
				t.Fatalf("Err() = %v, want SUBSCRIPTION_NOT_ACTIVE", err)
			}
		})
	}
}

// TestResubscribeAfterCancel: a group cancelled while the client reconnects ends its topic-name
// Subscription with SUBSCRIPTION_NOT_ACTIVE, as the end does when it comes while connected: the
// resubscription rejoins the cancelled subscription (protocol version 5), which the broker refuses
// without creating a new group. A pattern's Subscription (which cannot rejoin: the broker takes
// its resubscription for a new group) reports the end of that topic's subscription and goes on.
func TestResubscribeAfterCancel(t *testing.T) {
	t.Parallel()

	t.Run("Topic", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
		dialer, reconnect := gatedDialer()
		endedEv := make(chan SubscriptionEndedEvent, 4)
		c := b.dial(t, dialer, Hooks(endedHook(func(e SubscriptionEndedEvent) { endedEv <- e })))
		sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders", Group: "billing"}, func(context.Context, *Delivery) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		g, err := b.broker.Group(context.Background(), "orders", "billing")
		if err != nil {
			t.Fatal(err)
		}
		cancelled := g.Subscription.ID

		_ = c.current().nc.Close() // a dropped TCP connection
		if _, err := b.broker.CancelGroup(context.Background(), "orders", "billing"); err != nil {
			t.Fatal(err)
		}
		reconnect <- struct{}{}
		recv(t, sub.Done(), "Done after the resubscription found the group cancelled")
		if err := sub.Err(); !errors.Is(err, protocol.ErrSubscriptionNotActive) {
			t.Fatalf("Err() = %v, want SUBSCRIPTION_NOT_ACTIVE", err)
		}
		if ev := recv(t, endedEv, "the end of orders"); ev.Topic != "orders" || ev.HandleClosed || !errors.Is(ev.Err, protocol.ErrSubscriptionNotActive) {
			t.Fatalf("ended event %+v", ev)
		}
		// The broker created nothing for the refused resubscription.
		onlyGroup(t, b, "orders", cancelled, storage.Cancelled)
	})

	t.Run("Pattern", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders.eu", storage.TopicConfig{Semantics: storage.PubSub})
		b.createTopic("orders.us", storage.TopicConfig{Semantics: storage.PubSub})
		dialer, reconnect := gatedDialer()
		endedEv := make(chan SubscriptionEndedEvent, 4)
		c := b.dial(t, dialer, Hooks(endedHook(func(e SubscriptionEndedEvent) { endedEv <- e })))
		got := make(chan string, 4)
		sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders.*", Group: "billing"}, func(_ context.Context, d *Delivery) error {
			got <- d.Topic
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		_ = c.current().nc.Close()
		if _, err := b.broker.CancelGroup(context.Background(), "orders.eu", "billing"); err != nil {
			t.Fatal(err)
		}
		reconnect <- struct{}{}
		if ev := recv(t, endedEv, "the end of orders.eu"); ev.Topic != "orders.eu" || ev.Pattern != "orders.*" || ev.HandleClosed ||
			!errors.Is(ev.Err, protocol.ErrSubscriptionNotActive) {
			t.Fatalf("ended event %+v", ev)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if _, err := c.Publish(ctx, "orders.us", Message{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		select {
		case topic := <-got:
			if topic != "orders.us" {
				t.Fatalf("delivery of %q", topic)
			}
		case <-sub.Done():
			t.Fatalf("pattern subscription ended: %v", sub.Err())
		case <-ctx.Done():
			t.Fatal("timed out waiting for a delivery of orders.us")
		}
	})
}

// onlyGroup fails t unless topic's only subscription is id, in state: a refused resubscription made
// no new group.
func onlyGroup(t *testing.T, b *testBroker, topic string, id int64, state storage.SubscriptionState) {
	t.Helper()
	gs, err := b.broker.TopicGroups(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 1 || gs[0].Subscription.ID != id || gs[0].State != state {
		var got []string
		for _, g := range gs {
			got = append(got, fmt.Sprintf("%s: subscription %d %s, members %v", g.Group, g.Subscription.ID, g.State, g.Members))
		}
		t.Fatalf("groups of %s: %v, want only subscription %d %s", topic, got, id, state)
	}
}

// gatedDialer returns a Dialer option that dials TCP at once the first time and then once per
// value sent on reconnect, so that a test changes the broker while the client is away.
func gatedDialer() (Opt, chan<- struct{}) {
	reconnect := make(chan struct{}, 1)
	first := make(chan struct{}, 1)
	first <- struct{}{}
	var d net.Dialer
	return Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case <-first:
		case <-reconnect:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return d.DialContext(ctx, network, addr)
	}), reconnect
}

type endedHook func(SubscriptionEndedEvent)

func (f endedHook) OnSubscriptionEnded(e SubscriptionEndedEvent) { f(e) }

// TestAddCreditPastCap: a raise past the broker's cap is refused by AddCredit and not kept, so
// the subscription survives a reconnect (whose Subscribe would otherwise ask for more than the
// cap and be refused).
func TestAddCreditPastCap(t *testing.T) {
	t.Parallel()
	b := startBrokerServer(t, func(cfg *server.Config) { cfg.MaxCredit, cfg.TextMaxInFlight = 100, 100 })
	b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	connects := make(chan ConnectEvent, 4)
	c := b.dial(t, Hooks(connectHook(func(e ConnectEvent) { connects <- e })))
	recv(t, connects, "connect")
	got := make(chan string, 4)
	sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders", Group: "billing", MaxInFlight: 100}, func(_ context.Context, d *Delivery) error {
		got <- string(d.Payload)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.AddCredit(context.Background(), 1); !errors.Is(err, protocol.ErrInvalidArgument) {
		t.Fatalf("AddCredit past the cap: %v, want INVALID_ARGUMENT", err)
	}
	_ = c.current().nc.Close() // a dropped TCP connection
	if ev := recv(t, connects, "reconnect"); !ev.Reconnect {
		t.Fatalf("connect event %+v", ev)
	}
	// The group outlives the connection: the message reaches the member once it resubscribed.
	publishReaches(t, c, sub, got, "the reconnect")
}

// TestCreditLoweredToNewCap: after a restart with a lower server.max_credit, the resubscription
// asks for the new cap instead of being refused.
func TestCreditLoweredToNewCap(t *testing.T) {
	t.Parallel()
	b := startBrokerServer(t, func(cfg *server.Config) { cfg.MaxCredit, cfg.TextMaxInFlight = 100, 100 })
	b.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	c := b.dial(t)
	got := make(chan string, 4)
	sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders", Group: "billing", MaxInFlight: 100}, func(_ context.Context, d *Delivery) error {
		got <- string(d.Payload)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.srvMod = func(cfg *server.Config) { cfg.MaxCredit, cfg.TextMaxInFlight = 50, 50 }
	b.restart()
	publishReaches(t, c, sub, got, "the restart")
}

// publishReaches publishes "after" to orders and fails unless sub's handler (which sends payloads
// to got) receives it while sub stays open.
func publishReaches(t *testing.T, c *Client, sub *Subscription, got <-chan string, after string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.Publish(ctx, "orders", Message{Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p != "after" {
			t.Fatalf("delivery %q", p)
		}
	case <-sub.Done():
		t.Fatalf("subscription ended: %v", sub.Err())
	case <-ctx.Done():
		t.Fatalf("timed out waiting for a delivery after %s", after)
	}
}

// TestCreditRaiseRefusedWithoutCap: a broker that announces no cap refuses a raise only with an
// Error; the resubscription that asks for the raised credit is refused too, and the client
// subscribes again with the credit the broker accepted instead of ending the subscription.
func TestCreditRaiseRefusedWithoutCap(t *testing.T) {
	t.Parallel()
	n, c, p := pipeClient(t, nil)
	sub, _ := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g", MaxInFlight: 100}, func(context.Context, *Delivery) error { return nil })
	if err := sub.AddCredit(context.Background(), 1); err != nil {
		t.Fatalf("AddCredit with no announced cap: %v", err)
	}
	corr, _ := expect[*protocol.Credit](p)
	p.write(corr, protocol.ErrInvalidArgument.Errorf("credit 100 + 1 exceeds the server's cap 100"))
	_ = p.nc.Close()

	p = n.acceptPeer(t)
	p.handshake(nil)
	corr, req := expect[*protocol.Subscribe](p)
	if req.MaxInFlight != 101 {
		t.Fatalf("first resubscribe asks for %d, want the raised 101", req.MaxInFlight)
	}
	p.write(corr, protocol.ErrInvalidArgument.Errorf("max_in_flight 101 exceeds the server's cap 100"))
	corr, req = expect[*protocol.Subscribe](p)
	if req.MaxInFlight != 100 {
		t.Fatalf("second resubscribe asks for %d, want the accepted 100", req.MaxInFlight)
	}
	p.write(corr, &protocol.SubscribeOK{Handle: 2, MemberID: "m1"})
	checkFor(t, waitTimeout, func() error {
		select {
		case <-sub.Done():
			t.Fatalf("subscription ended: %v", sub.Err())
		default:
		}
		if sub.handleOf() != 2 {
			return errors.New("not resubscribed yet")
		}
		return nil
	})
}

// TestAddCreditDuringResubscribe: a raise made while a resubscription waits for its answer is
// checked against the cap of the broker the resubscription went to and, once answered, sent to the
// new handle in a Credit; it is counted once (the next resubscription asks for it, and no Credit
// repeats it). The peer holds the SubscribeOK back while the test raises.
func TestAddCreditDuringResubscribe(t *testing.T) {
	t.Parallel()
	// A broker with cap n. Its heartbeat interval outlasts the peer's read deadline, so that a
	// Credit that never comes fails the read instead of being waited for between heartbeats.
	maxCredit := func(n int) func(*protocol.HelloOK) {
		return func(ok *protocol.HelloOK) {
			ok.Properties = map[string]string{"server.max_credit": strconv.Itoa(n)}
			ok.HeartbeatInterval, ok.SessionTimeout = 2*waitTimeout, 6*waitTimeout
		}
	}
	ctx := context.Background()
	n, c, p := pipeClient(t, maxCredit(100))
	sub, _ := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g", MaxInFlight: 10}, func(context.Context, *Delivery) error { return nil })
	_ = p.nc.Close()

	// The broker reconnected to has a lower cap.
	p = n.acceptPeer(t)
	p.handshake(maxCredit(12))
	corr, req := expect[*protocol.Subscribe](p)
	if req.MaxInFlight != 10 {
		t.Fatalf("resubscribe asks for %d, want 10", req.MaxInFlight)
	}
	if err := sub.AddCredit(ctx, 5); !errors.Is(err, protocol.ErrInvalidArgument) {
		t.Fatalf("AddCredit past the new broker's cap during the resubscribe: %v, want INVALID_ARGUMENT", err)
	}
	if err := sub.AddCredit(ctx, 2); err != nil {
		t.Fatalf("AddCredit during the resubscribe: %v", err)
	}
	p.write(corr, &protocol.SubscribeOK{Handle: 2, MemberID: "m1", Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 10, Topic: "orders"}}})
	if _, cr := expect[*protocol.Credit](p); cr.Handle != 2 || cr.Additional != 2 {
		t.Fatalf("credit after the resubscribe: %+v, want handle 2 +2", cr)
	}

	// Counted once: the next broker is asked for 12, and a raise then is sent as it is.
	_ = p.nc.Close()
	p = n.acceptPeer(t)
	p.handshake(maxCredit(100))
	corr, req = expect[*protocol.Subscribe](p)
	if req.MaxInFlight != 12 {
		t.Fatalf("next resubscribe asks for %d, want 12", req.MaxInFlight)
	}
	p.write(corr, &protocol.SubscribeOK{Handle: 3, MemberID: "m1", Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 10, Topic: "orders"}}})
	checkFor(t, waitTimeout, func() error {
		if sub.handleOf() != 3 {
			return errors.New("not resubscribed yet")
		}
		return nil
	})
	if err := sub.AddCredit(ctx, 1); err != nil {
		t.Fatalf("AddCredit after the resubscribe: %v", err)
	}
	if _, cr := expect[*protocol.Credit](p); cr.Handle != 3 || cr.Additional != 1 {
		t.Fatalf("credit after AddCredit(1): %+v, want handle 3 +1", cr)
	}
}

// handleOf returns the current handle, 0 if none.
func (s *Subscription) handleOf() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handle
}

// TestEndedSubscriptionNotYetKnown: a topic-name Subscription ends when the broker ends its
// subscription also while the client does not know that subscription's id (it learns it from
// SubscribeOK or from a delivery): a topic created after the Subscribe, joined without a
// SubscribeOK naming the subscription and deleted before any delivery, ends the Subscription
// (with and without a group); so does the cancel of the group's subscription that a semantics
// change moved the handle to without a push. Before, the client looked the ended id up among the
// ones it knew, found none, and kept a handle that received nothing.
func TestEndedSubscriptionNotYetKnown(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, *Delivery) error { return nil }
	subscribe := func(t *testing.T, b *testBroker, p SubscribeParams) (*Subscription, <-chan SubscriptionEndedEvent) {
		t.Helper()
		endedEv := make(chan SubscriptionEndedEvent, 4)
		c := b.dial(t, Hooks(endedHook(func(e SubscriptionEndedEvent) { endedEv <- e })))
		sub, err := c.Subscribe(context.Background(), p, noop)
		if err != nil {
			t.Fatal(err)
		}
		return sub, endedEv
	}

	for _, tc := range []struct {
		group     string
		semantics storage.Semantics
	}{{"billing", storage.PubSub}, {"", storage.Queue}} {
		t.Run("TopicCreatedLaterDeleted/group="+tc.group, func(t *testing.T) {
			t.Parallel()
			b := startBroker(t, nil)
			sub, endedEv := subscribe(t, b, SubscribeParams{Topic: "orders", Group: tc.group})
			b.createTopic("orders", storage.TopicConfig{Semantics: tc.semantics})
			joined(t, b, "orders")
			if err := b.broker.DeleteTopic(context.Background(), "orders", true); err != nil {
				t.Fatal(err)
			}
			recv(t, sub.Done(), "Done after the topic was deleted")
			if err := sub.Err(); !errors.Is(err, protocol.ErrTopicNotFound) {
				t.Fatalf("Err() = %v, want TOPIC_NOT_FOUND", err)
			}
			if ev := recv(t, endedEv, "the end of orders"); ev.Topic != "orders" || ev.HandleClosed || !errors.Is(ev.Err, protocol.ErrTopicNotFound) {
				t.Fatalf("ended event %+v", ev)
			}
		})
	}

	t.Run("MovedBySemanticsChangeCancelled", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders", storage.TopicConfig{Semantics: storage.Queue})
		// The handle joins the queue's subscription (SubscribeOK names it); the change makes the
		// queue's subscription group other's and moves the member to a new one of billing.
		sub, endedEv := subscribe(t, b, SubscribeParams{Topic: "orders", Group: "billing"})
		if _, err := b.broker.UpdateTopic(context.Background(), broker.UpdateTopicParams{Name: "orders",
			Config: storage.TopicConfig{Semantics: storage.PubSub}, QueueToGroup: "other"}); err != nil {
			t.Fatal(err)
		}
		checkFor(t, waitTimeout, func() error {
			g, err := b.broker.Group(context.Background(), "orders", "billing")
			if err != nil {
				return err
			}
			if len(g.Members) == 0 {
				return fmt.Errorf("billing's subscription %d has no member yet", g.Subscription.ID)
			}
			return nil
		})
		if _, err := b.broker.CancelGroup(context.Background(), "orders", "billing"); err != nil {
			t.Fatal(err)
		}
		recv(t, sub.Done(), "Done after the group was cancelled")
		if err := sub.Err(); !errors.Is(err, protocol.ErrSubscriptionNotActive) {
			t.Fatalf("Err() = %v, want SUBSCRIPTION_NOT_ACTIVE", err)
		}
		if ev := recv(t, endedEv, "the end of orders"); ev.Topic != "orders" || !errors.Is(ev.Err, protocol.ErrSubscriptionNotActive) {
			t.Fatalf("ended event %+v", ev)
		}
	})
}

// joined waits until a member of this broker is attached to a subscription of topic.
func joined(t *testing.T, b *testBroker, topic string) {
	t.Helper()
	checkFor(t, waitTimeout, func() error {
		gs, err := b.broker.TopicGroups(context.Background(), topic)
		if err != nil {
			return err
		}
		for _, g := range gs {
			if len(g.Members) > 0 {
				return nil
			}
		}
		return fmt.Errorf("no member on the %d subscriptions of %s", len(gs), topic)
	})
}

// TestRetryableEndResubscribes: when the broker ends one subscription of a handle with a retryable
// code and leaves the handle open (the current broker closes it right after, section 8.5; the
// protocol does not promise it), the client gives the handle back and subscribes again, as after a
// retryable close of the handle: a topic name rejoins the subscription that ended (so that the
// broker creates nothing should it have been cancelled meanwhile), a pattern subscribes as the
// first time and gets the topic back. The Subscription goes on with the new handle. Before, it
// kept the handle, which received nothing more from that topic (a topic name's: nothing at all).
// The peer plays the broker: the real one never sends such an end without closing the handle.
func TestRetryableEndResubscribes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		topic, ended string
		rejoin       int64
	}{{"orders", "orders", 10}, {"orders.*", "orders.eu", 0}} {
		t.Run(tc.topic, func(t *testing.T) {
			t.Parallel()
			endedEv := make(chan SubscriptionEndedEvent, 4)
			// The heartbeat interval outlasts the peer's read deadline: a frame that never comes
			// fails the read instead of being waited for between heartbeats.
			slowHeartbeats := func(ok *protocol.HelloOK) { ok.HeartbeatInterval, ok.SessionTimeout = 2*waitTimeout, 6*waitTimeout }
			_, c, p := pipeClient(t, slowHeartbeats, Hooks(endedHook(func(e SubscriptionEndedEvent) { endedEv <- e })))
			got := make(chan string, 4)
			sub, _ := subscribePipe(t, c, p, SubscribeParams{Topic: tc.topic, Group: "g"}, func(_ context.Context, d *Delivery) error {
				got <- string(d.Payload)
				return nil
			})
			p.write(0, &protocol.SubscriptionEnded{Handle: 1, SubscriptionID: 10, Topic: tc.ended, Code: protocol.CodeStorageUnavailable,
				Message: "storage unavailable: database unreachable"})
			if ev := recv(t, endedEv, "the end reported to the hook"); ev.Topic != tc.ended || ev.HandleClosed || !errors.Is(ev.Err, protocol.ErrStorageUnavailable) {
				t.Fatalf("ended event %+v", ev)
			}
			corr, un := expect[*protocol.Unsubscribe](p)
			if un.Handle != 1 {
				t.Fatalf("gave back handle %d, want 1", un.Handle)
			}
			p.write(corr, &protocol.UnsubscribeOK{})
			corr, req := expect[*protocol.Subscribe](p)
			if req.Topic != tc.topic || req.Group != "g" || req.Rejoin != tc.rejoin {
				t.Fatalf("resubscription %+v, want %s of g rejoining %d", req, tc.topic, tc.rejoin)
			}
			p.write(corr, &protocol.SubscribeOK{Handle: 2, MemberID: "m1", Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 10, Topic: tc.ended}}})
			d := delivery(2, 0, "after")
			d.Topic = tc.ended
			p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{d}})
			select {
			case payload := <-got:
				if payload != "after" {
					t.Fatalf("delivery %q", payload)
				}
			case <-sub.Done():
				t.Fatalf("subscription ended: %v", sub.Err())
			case <-time.After(waitTimeout):
				t.Fatal("timed out waiting for the delivery on the new handle")
			}
		})
	}
}

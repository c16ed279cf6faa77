package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// Tests against the real broker: the wal engine, the broker and the TCP server in-process.

// seen records deliveries by offset, counting duplicates.
type seen struct {
	mu     sync.Mutex
	counts map[int64]int
	dups   int
	total  int
	full   chan struct{}
	want   int
}

func newSeen(want int) *seen {
	return &seen{counts: make(map[int64]int), full: make(chan struct{}), want: want}
}

func (s *seen) add(offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[offset]++
	s.total++
	if s.counts[offset] > 1 {
		s.dups++
	}
	if len(s.counts) == s.want && s.total-s.dups == s.want {
		select {
		case <-s.full:
		default:
			close(s.full)
		}
	}
}

func (s *seen) snapshot() (distinct, dups int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.counts), s.dups
}

func publishN(t *testing.T, c *Client, topic string, n int) {
	t.Helper()
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Payload: fmt.Appendf(nil, "m%d", i)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.PublishBatch(ctx, topic, msgs); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
}

// waitGroupDone waits until the group's subscription on topic has nothing pending.
func waitGroupDone(t *testing.T, b *testBroker, topic, group string) {
	t.Helper()
	checkFor(t, waitTimeout, func() error {
		g, err := b.broker.Group(context.Background(), topic, group)
		if err != nil {
			return err
		}
		if g.Stats == nil || g.Stats.Pending != 0 || g.Stats.Redelivering != 0 {
			return fmt.Errorf("group %q on %s: stats %+v", group, topic, g.Stats)
		}
		return nil
	})
}

func TestIntegrationPublishSubscribe(t *testing.T) {
	t.Parallel()

	t.Run("FanOutToThreeGroups", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("orders.created", storage.TopicConfig{Semantics: storage.PubSub})
		c := b.dial(t)
		const n = 200
		groups := []string{"billing", "audit", "shipping"}
		got := map[string]*seen{}
		for _, g := range groups {
			s := newSeen(n)
			got[g] = s
			// One client per group, like three services.
			gc := b.dial(t, ClientName(g))
			if _, err := gc.Subscribe(context.Background(), SubscribeParams{Topic: "orders.created", Group: g}, func(_ context.Context, d *Delivery) error {
				s.add(d.Offset)
				return nil
			}, Concurrency(2)); err != nil {
				t.Fatalf("Subscribe %s: %v", g, err)
			}
		}
		// Bad names are refused by the broker with INVALID_ARGUMENT, and change nothing.
		if _, err := c.Publish(context.Background(), "bad topic!", Message{}); !errors.Is(err, protocol.ErrInvalidArgument) || IsRetryable(err) {
			t.Fatalf("publish to an invalid topic: %v", err)
		}
		if _, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "orders.#.x"}, func(context.Context, *Delivery) error { return nil }); !errors.Is(err, protocol.ErrInvalidArgument) {
			t.Fatalf("subscribe to an invalid pattern: %v", err)
		}
		publishN(t, c, "orders.created", n)
		for _, g := range groups {
			recv(t, got[g].full, "every message in group "+g)
			waitGroupDone(t, b, "orders.created", g)
			if distinct, dups := got[g].snapshot(); distinct != n || dups != 0 {
				t.Fatalf("group %s: %d distinct, %d duplicates", g, distinct, dups)
			}
		}
	})

	t.Run("CompetingMembersOfOneGroup", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("jobs", storage.TopicConfig{Semantics: storage.PubSub})
		const n, members = 300, 3
		all := newSeen(n)
		var per [members]atomic.Int64
		for i := range members {
			mc := b.dial(t, ClientName(fmt.Sprint("worker-", i)))
			if _, err := mc.Subscribe(context.Background(), SubscribeParams{Topic: "jobs", Group: "workers"}, func(_ context.Context, d *Delivery) error {
				per[i].Add(1)
				all.add(d.Offset)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		publishN(t, b.dial(t), "jobs", n)
		recv(t, all.full, "every job")
		waitGroupDone(t, b, "jobs", "workers")
		if distinct, dups := all.snapshot(); distinct != n || dups != 0 {
			t.Fatalf("%d distinct jobs, %d handled twice", distinct, dups)
		}
		busy := 0
		for i := range per {
			if per[i].Load() > 0 {
				busy++
			}
		}
		t.Logf("jobs per member: %d %d %d", per[0].Load(), per[1].Load(), per[2].Load())
		if busy < 2 {
			t.Fatalf("only %d member(s) got work: the group did not share it", busy)
		}
	})

	t.Run("NackRedeliveredToAnotherMember", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("tasks", storage.TopicConfig{Semantics: storage.PubSub})
		type hit struct {
			member  int
			attempt int
		}
		hits := make(chan hit, 4)
		for i := range 2 {
			mc := b.dial(t)
			if _, err := mc.Subscribe(context.Background(), SubscribeParams{Topic: "tasks", Group: "g"}, func(_ context.Context, d *Delivery) error {
				hits <- hit{i, d.Attempt}
				if d.Attempt == 1 {
					return errors.New("transient failure")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		publishN(t, b.dial(t), "tasks", 1)
		first := recv(t, hits, "first delivery")
		second := recv(t, hits, "redelivery")
		if first.attempt != 1 || second.attempt != 2 {
			t.Fatalf("attempts %d then %d", first.attempt, second.attempt)
		}
		if first.member == second.member {
			t.Fatalf("the nacked message went back to member %d, not to the other member", first.member)
		}
		waitGroupDone(t, b, "tasks", "g")
	})

	t.Run("KilledMemberMessagesRedelivered", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		// ack_wait stays at 30 s: the redelivery must come from the connection closing, not from
		// an expired lease.
		b.createTopic("work", storage.TopicConfig{Semantics: storage.PubSub})
		var (
			mu     sync.Mutex
			raw    net.Conn
			killed atomic.Bool
		)
		dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
			if killed.Load() {
				return nil, errors.New("this member is dead")
			}
			var d net.Dialer
			nc, err := d.DialContext(ctx, network, addr)
			mu.Lock()
			raw = nc
			mu.Unlock()
			return nc, err
		}
		victim := b.dial(t, Dialer(dialer))
		const n = 5
		held := make(chan *Delivery, n)
		if _, err := victim.Subscribe(context.Background(), SubscribeParams{Topic: "work", Group: "g", MaxInFlight: n}, func(_ context.Context, d *Delivery) error {
			held <- d // never settled
			return nil
		}, ManualAck(), Concurrency(n)); err != nil {
			t.Fatal(err)
		}
		publishN(t, b.dial(t), "work", n)
		var victimDeliveries []*Delivery
		for range n {
			victimDeliveries = append(victimDeliveries, recv(t, held, "delivery to the victim"))
		}
		survivor := b.dial(t)
		got := newSeen(n)
		attempts := make(chan int, n)
		if _, err := survivor.Subscribe(context.Background(), SubscribeParams{Topic: "work", Group: "g"}, func(_ context.Context, d *Delivery) error {
			attempts <- d.Attempt
			got.add(d.Offset)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		killed.Store(true)
		mu.Lock()
		_ = raw.Close() // the member dies without a goodbye
		mu.Unlock()
		recv(t, got.full, "the victim's messages at the survivor")
		for range n {
			if a := recv(t, attempts, "attempt"); a != 2 {
				t.Fatalf("redelivery attempt %d, want 2", a)
			}
		}
		// The victim's leases went with its connection: acking now fails, the survivor has them.
		if err := victimDeliveries[0].Ack(context.Background()); !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("ack by the dead member: %v, want ErrConnectionLost", err)
		}
		waitGroupDone(t, b, "work", "g")
	})
}

func TestIntegrationResilience(t *testing.T) {
	t.Parallel()

	t.Run("ReconnectAfterBrokerRestart", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("events", storage.TopicConfig{Semantics: storage.PubSub})
		connects := make(chan ConnectEvent, 8)
		c := b.dial(t, Hooks(connectHook(func(e ConnectEvent) { connects <- e })))
		recv(t, connects, "first connect")
		got := make(chan *Delivery, 16)
		if _, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "events", Group: "g"}, func(_ context.Context, d *Delivery) error {
			got <- d
			if string(d.Payload) == "before" && d.Attempt == 1 {
				return nil // left unacked (ManualAck): the restart must bring it back
			}
			return d.Ack(context.Background())
		}, ManualAck()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if _, err := c.Publish(ctx, "events", Message{Payload: []byte("before")}); err != nil {
			t.Fatal(err)
		}
		first := recv(t, got, "delivery before the restart")
		if string(first.Payload) != "before" || first.Attempt != 1 {
			t.Fatalf("first delivery %q attempt %d", first.Payload, first.Attempt)
		}

		b.restart()
		if ev := recv(t, connects, "reconnect"); !ev.Reconnect {
			t.Fatalf("connect event %+v", ev)
		}
		// The unacked message comes back on the new connection; the old delivery cannot be acked.
		again := recv(t, got, "redelivery after the restart")
		if string(again.Payload) != "before" || again.Offset != first.Offset {
			t.Fatalf("after the restart got %q offset %d, want the unacked message", again.Payload, again.Offset)
		}
		if err := first.Ack(context.Background()); !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("ack on the dead connection: %v, want ErrConnectionLost", err)
		}
		// Publishing works again, and the subscription continues.
		if _, err := c.Publish(ctx, "events", Message{Payload: []byte("after")}); err != nil {
			t.Fatalf("publish after the restart: %v", err)
		}
		for {
			d := recv(t, got, "message published after the restart")
			if string(d.Payload) == "after" {
				break
			}
		}
		waitGroupDone(t, b, "events", "g")
	})

	t.Run("AsyncPublishTenThousand", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		c := b.dial(t)
		const n = 10_000
		var ok, failed atomic.Int64
		offsets := make([]atomic.Bool, n)
		for i := range n {
			c.PublishAsync("bulk", Message{Payload: fmt.Appendf(nil, "%d", i)}, func(p Position, err error) {
				if err != nil {
					failed.Add(1)
					t.Errorf("async publish %d: %v", i, err)
					return
				}
				if p.Offset >= 0 && p.Offset < n {
					offsets[p.Offset].Store(true)
				}
				ok.Add(1)
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if ok.Load() != n || failed.Load() != 0 {
			t.Fatalf("%d acknowledged, %d failed", ok.Load(), failed.Load())
		}
		for i := range offsets {
			if !offsets[i].Load() {
				t.Fatalf("no message at offset %d", i)
			}
		}
		info, err := b.broker.Topic(ctx, "bulk")
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Stats.Messages; got != n {
			t.Fatalf("topic holds %d messages, want %d", got, n)
		}
	})

	t.Run("HandlerConcurrencyLimit", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		c := b.dial(t)
		const limit, n = 3, 24
		var active, peak atomic.Int32
		release := make(chan struct{})
		done := newSeen(n)
		if _, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "slow", MaxInFlight: 10, Start: FromBeginning()}, func(_ context.Context, d *Delivery) error {
			a := active.Add(1)
			for {
				p := peak.Load()
				if a <= p || peak.CompareAndSwap(p, a) {
					break
				}
			}
			<-release
			active.Add(-1)
			done.add(d.Offset)
			return nil
		}, Concurrency(limit)); err != nil {
			t.Fatal(err)
		}
		publishN(t, c, "slow", n)
		// Wait until the limit is reached (more deliveries are waiting: credit is 10), then let
		// everything through.
		checkFor(t, waitTimeout, func() error {
			if active.Load() < limit {
				return fmt.Errorf("%d handlers running", active.Load())
			}
			return nil
		})
		close(release)
		recv(t, done.full, "every message handled")
		if p := peak.Load(); p != limit {
			t.Fatalf("peak of %d concurrent handlers, limit %d", p, limit)
		}
	})

	t.Run("ExtendKeepsLeasePastAckWait", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		// Extends every ackWait/5 leave 800 ms of slack for a loaded CI machine.
		const ackWait = time.Second
		b.createTopic("long", storage.TopicConfig{Semantics: storage.PubSub, AckWait: ackWait})
		c := b.dial(t)
		finished := make(chan error, 1)
		stolen := make(chan int, 4)
		var calls atomic.Int32
		// One member with room for a second delivery: if the lease lapsed, the broker would
		// redeliver the message to it (attempt 2) while the first handler still runs.
		if _, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "long", Group: "g", MaxInFlight: 4}, func(ctx context.Context, d *Delivery) error {
			if calls.Add(1) > 1 {
				stolen <- d.Attempt
				return nil
			}
			// Work for well past the lease plus the first redelivery backoff (1 s), extending the
			// lease by ack_wait every ack_wait/5.
			end := time.Now().Add(2*ackWait + 1500*time.Millisecond)
			tick := time.NewTicker(ackWait / 5)
			defer tick.Stop()
			for time.Now().Before(end) {
				<-tick.C
				if _, err := d.Extend(ctx, ackWait); err != nil {
					finished <- err
					return err
				}
			}
			err := d.Ack(ctx)
			finished <- err
			return err
		}, Concurrency(2)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(context.Background(), "long", Message{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-finished:
			if err != nil {
				t.Fatalf("extend or ack failed: %v", err)
			}
		case a := <-stolen:
			t.Fatalf("the message was redelivered (attempt %d) while its lease was extended", a)
		case <-time.After(waitTimeout):
			t.Fatal("timed out")
		}
		select {
		case a := <-stolen:
			t.Fatalf("the message was redelivered (attempt %d) while its lease was extended", a)
		default:
		}
		waitGroupDone(t, b, "long", "g")
	})
}

func TestIntegrationClose(t *testing.T) {
	t.Parallel()

	t.Run("SubscriptionCloseWaitsForHandlersAndAcks", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		b.createTopic("q", storage.TopicConfig{Semantics: storage.PubSub})
		c := b.dial(t)
		entered := make(chan struct{}, 1)
		release := make(chan struct{})
		sub, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "q", Group: "g"}, func(context.Context, *Delivery) error {
			entered <- struct{}{}
			<-release
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		publishN(t, c, "q", 1)
		recv(t, entered, "handler start")
		closed := make(chan error, 1)
		go func() { closed <- sub.Close(context.Background()) }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while a handler was running", err)
		default:
		}
		close(release)
		if err := recv(t, closed, "Close"); err != nil {
			t.Fatal(err)
		}
		recv(t, sub.Done(), "Done")
		// The handler's ack went out before the Unsubscribe: nothing is pending or redelivered.
		waitGroupDone(t, b, "q", "g")
		if _, err := c.Subscribe(context.Background(), SubscribeParams{}, func(context.Context, *Delivery) error { return nil }); !errors.Is(err, protocol.ErrInvalidArgument) {
			t.Fatalf("Subscribe without a topic: %v", err)
		}
	})

	t.Run("ClientCloseStopsEverything", func(t *testing.T) {
		t.Parallel()
		b := startBroker(t, nil)
		c, err := Dial(context.Background(), b.addr, Logger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		handled := make(chan struct{}, 100)
		if _, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "w", Start: FromBeginning()}, func(context.Context, *Delivery) error {
			handled <- struct{}{}
			return nil
		}, Concurrency(3)); err != nil {
			t.Fatal(err)
		}
		var acked atomic.Int64
		for range 50 {
			c.PublishAsync("w", Message{Payload: []byte("x")}, func(_ Position, err error) {
				if err == nil {
					acked.Add(1)
				}
			})
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if acked.Load() != 50 {
			t.Fatalf("Close returned with %d of 50 async publishes acknowledged", acked.Load())
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := c.Publish(context.Background(), "w", Message{}); !errors.Is(err, ErrClientClosed) || IsRetryable(err) {
			t.Fatalf("Publish after Close: %v", err)
		}
		if _, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "w"}, func(context.Context, *Delivery) error { return nil }); !errors.Is(err, ErrClientClosed) {
			t.Fatalf("Subscribe after Close: %v", err)
		}
		// The broker saw the session end: no member is left.
		checkFor(t, waitTimeout, func() error {
			if m := b.broker.Members(); len(m) != 0 {
				return fmt.Errorf("%d members left", len(m))
			}
			return nil
		})
	})
}

// TestCloseReportsClientClosed: the disconnect hook of a connection that Close ended reports
// ErrClientClosed, also when the broker's close after GoodbyeOK reaches the reader first.
func TestCloseReportsClientClosed(t *testing.T) {
	t.Parallel()
	b := startBroker(t, nil)
	for i := range 20 {
		disc := make(chan DisconnectEvent, 4)
		c := b.dial(t, Hooks(disconnectHook(func(e DisconnectEvent) { disc <- e })))
		if _, err := c.Publish(context.Background(), "close.reason", Message{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		err := c.Close(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
		ev := recv(t, disc, "disconnect")
		if !errors.Is(ev.Err, ErrClientClosed) {
			t.Fatalf("close %d: disconnect reported %v, want ErrClientClosed", i, ev.Err)
		}
	}
}

package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Framing, correlation, heartbeat and reconnect tests against a scripted peer over net.Pipe.

func TestHandshake(t *testing.T) {
	t.Parallel()

	t.Run("HelloCarriesOptions", func(t *testing.T) {
		t.Parallel()
		n := newPipeNet(t)
		ch := make(chan error, 1)
		var c *Client
		go func() {
			var err error
			c, err = Dial(context.Background(), "pipe:1", Dialer(n.dial), ClientName("billing"), Token("secret"), HeartbeatInterval(2*time.Second))
			ch <- err
		}()
		p := n.acceptPeer(t)
		hello := p.handshake(nil)
		if err := recv(t, ch, "Dial"); err != nil {
			t.Fatalf("Dial: %v", err)
		}
		closePipeClient(t, c, &p)
		if hello.ClientName != "billing" || hello.Token != "secret" || hello.HeartbeatInterval != 2*time.Second ||
			hello.MinVersion != protocol.MinVersion || hello.MaxVersion != protocol.MaxVersion || hello.Properties["client.library"] != "spool-go" {
			t.Fatalf("hello = %+v", hello)
		}
	})

	t.Run("RefusalIsProtocolError", func(t *testing.T) {
		t.Parallel()
		n := newPipeNet(t)
		ch := make(chan error, 1)
		go func() {
			_, err := Dial(context.Background(), "pipe:1", Dialer(n.dial))
			ch <- err
		}()
		p := n.acceptPeer(t)
		if err := p.r.ReadPreamble(); err != nil {
			t.Fatal(err)
		}
		corr, _ := p.read()
		if err := p.w.WritePreamble(); err != nil {
			t.Fatal(err)
		}
		p.write(corr, protocol.ErrNotAuthenticated.WithMessage("bad token"))
		err := recv(t, ch, "Dial")
		var pe *protocol.Error
		if !errors.Is(err, protocol.ErrNotAuthenticated) || !errors.As(err, &pe) || IsRetryable(err) {
			t.Fatalf("Dial error = %v, want NOT_AUTHENTICATED", err)
		}
	})

	t.Run("BadOptions", func(t *testing.T) {
		t.Parallel()
		for _, opt := range []Opt{DialTimeout(0), ReconnectBackoff(time.Second, time.Millisecond, 0), ReconnectBackoff(time.Millisecond, time.Second, 2),
			MaxFrameSize(10), MaxAsyncInFlight(0), AsyncPublishTimeout(-1), Hooks(42), HeartbeatInterval(-time.Second)} {
			if _, err := Dial(context.Background(), "127.0.0.1:1", opt); !errors.Is(err, protocol.ErrInvalidArgument) {
				t.Errorf("Dial with a bad option: %v, want INVALID_ARGUMENT", err)
			}
		}
	})
}

func TestPublishFraming(t *testing.T) {
	t.Parallel()

	t.Run("PipelinedAnswersOutOfOrder", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)

		const k = 5
		type res struct {
			payload string
			pos     Position
			err     error
		}
		results := make(chan res, k)
		for i := range k {
			go func() {
				payload := fmt.Sprintf("m%d", i)
				pos, err := c.Publish(context.Background(), "orders", Message{Payload: []byte(payload), Key: []byte("k")})
				results <- res{payload, pos, err}
			}()
		}
		// Read all five requests, then answer them in reverse order, each with an offset that
		// encodes its payload.
		type req struct {
			corr    uint32
			payload string
		}
		var reqs []req
		for range k {
			corr, pub := expect[*protocol.Publish](p)
			if pub.Topic != "orders" || len(pub.Messages) != 1 || pub.Messages[0].Partition != protocol.PartitionAuto || string(pub.Messages[0].Key) != "k" {
				t.Fatalf("publish = %+v", pub)
			}
			reqs = append(reqs, req{corr, string(pub.Messages[0].Payload)})
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			var off int64
			fmt.Sscanf(reqs[i].payload, "m%d", &off)
			p.write(reqs[i].corr, &protocol.PublishOK{Positions: []protocol.Position{{Offset: 100 + off}}})
		}
		for range k {
			r := recv(t, results, "publish result")
			var off int64
			fmt.Sscanf(r.payload, "m%d", &off)
			if r.err != nil || r.pos.Offset != 100+off {
				t.Fatalf("publish %s: %+v, %v", r.payload, r.pos, r.err)
			}
		}
	})

	t.Run("BrokerErrorSurfacesAsProtocolError", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		ch := make(chan error, 1)
		go func() {
			_, err := c.Publish(context.Background(), "nope", Message{Payload: []byte("x")})
			ch <- err
		}()
		corr, _ := expect[*protocol.Publish](p)
		p.write(corr, protocol.ErrTopicNotFound.WithMessage("no"))
		err := recv(t, ch, "publish")
		var pe *protocol.Error
		if !errors.Is(err, protocol.ErrTopicNotFound) || !errors.As(err, &pe) || pe.Message != "no" || IsRetryable(err) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("OverloadedIsRetried", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		ch := make(chan error, 1)
		go func() {
			_, err := c.Publish(context.Background(), "t", Message{Payload: []byte("x")})
			ch <- err
		}()
		corr, _ := expect[*protocol.Publish](p)
		e := *protocol.ErrOverloaded
		e.RetryAfter = time.Millisecond
		p.write(corr, &e)
		corr, _ = expect[*protocol.Publish](p)
		p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{Offset: 7}}})
		if err := recv(t, ch, "publish"); err != nil {
			t.Fatalf("publish after OVERLOADED: %v", err)
		}
	})

	t.Run("TooLargeForFrame", func(t *testing.T) {
		t.Parallel()
		_, c, _ := pipeClient(t, func(h *protocol.HelloOK) { h.MaxFrameSize = protocol.MinMaxFrameSize })
		_, err := c.Publish(context.Background(), "t", Message{Payload: make([]byte, protocol.MinMaxFrameSize)})
		if !errors.Is(err, protocol.ErrFrameTooLarge) {
			t.Fatalf("err = %v, want FRAME_TOO_LARGE", err)
		}
		_, err = c.PublishBatch(context.Background(), "t", make([]Message, protocol.MaxBatch+1))
		if !errors.Is(err, protocol.ErrInvalidArgument) {
			t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
		}
	})
}

// TestPublishOutcomeUnknown: a publish whose answer was lost with the connection is retried on the
// next connection only when every message has a producer id (at-least-once publishing).
func TestPublishOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, withID := range []bool{false, true} {
		t.Run(fmt.Sprintf("ProducerID=%v", withID), func(t *testing.T) {
			t.Parallel()
			n, c, p := pipeClient(t, nil)
			msg := Message{Payload: []byte("first")}
			if withID {
				msg.ProducerID = "order-1"
			}
			ch := make(chan error, 1)
			go func() {
				_, err := c.Publish(context.Background(), "t", msg)
				ch <- err
			}()
			expect[*protocol.Publish](p)
			_ = p.nc.Close() // the broker got the request; its answer is lost
			if !withID {
				err := recv(t, ch, "publish")
				if !errors.Is(err, ErrConnectionLost) || !IsRetryable(err) {
					t.Fatalf("err = %v, want ErrConnectionLost", err)
				}
			}
			p = n.acceptPeer(t)
			p.handshake(nil)
			if !withID {
				go func() {
					_, err := c.Publish(context.Background(), "t", Message{Payload: []byte("second")})
					ch <- err
				}()
			}
			corr, pub := expect[*protocol.Publish](p)
			want := "second"
			if withID {
				want = "first"
				if pub.Messages[0].ProducerID != "order-1" {
					t.Fatalf("retried publish lost its producer id: %+v", pub.Messages[0])
				}
			}
			if got := string(pub.Messages[0].Payload); got != want {
				t.Fatalf("next publish on the new connection = %q, want %q", got, want)
			}
			p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{Offset: 1}}})
			if err := recv(t, ch, "publish"); err != nil {
				t.Fatalf("publish: %v", err)
			}
		})
	}
}

func TestHeartbeats(t *testing.T) {
	t.Parallel()

	t.Run("ClientSendsWhenIdle", func(t *testing.T) {
		t.Parallel()
		_, _, p := pipeClient(t, func(h *protocol.HelloOK) { h.HeartbeatInterval = 20 * time.Millisecond; h.SessionTimeout = time.Minute })
		for range 3 {
			_ = p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
			corr, m, err := p.r.ReadClientMessage()
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := m.(*protocol.Heartbeat); !ok || corr == 0 {
				t.Fatalf("got %T corr %d, want Heartbeat", m, corr)
			}
			p.write(corr, &protocol.HeartbeatOK{Time: time.Now()})
		}
	})

	t.Run("ClientAnswersBroker", func(t *testing.T) {
		t.Parallel()
		_, _, p := pipeClient(t, nil)
		at := time.Unix(1_700_000_000, 0)
		p.write(77, &protocol.Heartbeat{Time: at})
		corr, ok := expect[*protocol.HeartbeatOK](p)
		if corr != 77 || !ok.Echo.Equal(at) {
			t.Fatalf("HeartbeatOK corr %d echo %v", corr, ok.Echo)
		}
	})

	t.Run("SilentBrokerIsDead", func(t *testing.T) {
		t.Parallel()
		disc := make(chan DisconnectEvent, 4)
		n, _, p := pipeClient(t, func(h *protocol.HelloOK) { h.SessionTimeout = 100 * time.Millisecond; h.HeartbeatInterval = time.Hour },
			Hooks(disconnectHook(func(e DisconnectEvent) { disc <- e })))
		// The peer reads (so the client's writes go through) but never sends.
		silent := p
		go func() {
			for {
				if _, _, err := silent.r.ReadClientMessage(); err != nil {
					return
				}
			}
		}()
		ev := recv(t, disc, "disconnect")
		if !errors.Is(ev.Err, protocol.ErrSessionTimeout) || !errors.Is(ev.Err, ErrConnectionLost) {
			t.Fatalf("disconnect error = %v, want SESSION_TIMEOUT", ev.Err)
		}
		p = n.acceptPeer(t) // the client reconnects
		p.handshake(nil)
	})
}

type disconnectHook func(DisconnectEvent)

func (f disconnectHook) OnDisconnect(e DisconnectEvent) { f(e) }

type connectHook func(ConnectEvent)

func (f connectHook) OnConnect(e ConnectEvent) { f(e) }

// subscribePipe subscribes through the peer (answering SubscribeOK with handle 1, subscription
// 10) and returns the Subscribe the client sent.
func subscribePipe(t *testing.T, c *Client, p *peer, params SubscribeParams, h Handler, opts ...SubscribeOpt) (*Subscription, *protocol.Subscribe) {
	t.Helper()
	type result struct {
		s   *Subscription
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := c.Subscribe(context.Background(), params, h, opts...)
		ch <- result{s, err}
	}()
	corr, sub := expect[*protocol.Subscribe](p)
	p.write(corr, &protocol.SubscribeOK{Handle: 1, MemberID: "m1", Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 10, Topic: params.Topic}}})
	r := recv(t, ch, "Subscribe")
	if r.err != nil {
		t.Fatalf("Subscribe: %v", r.err)
	}
	return r.s, sub
}

func delivery(handle uint32, offset int64, payload string) protocol.Delivery {
	return protocol.Delivery{Handle: handle, SubscriptionID: 10, Topic: "orders", Offset: offset, Attempt: 1, Payload: []byte(payload),
		LeaseDeadline: time.Now().Add(time.Minute), PublishTime: time.Now()}
}

func TestSubscribeFraming(t *testing.T) {
	t.Parallel()

	// A consumer that receives one delivery at a time (each after the previous handler returned)
	// acks each at once when its window is narrow (the broker may wait for that credit: each Ack
	// comes before the next delivery is sent), and coalesces the acks for ackDelay when it is wide
	// (at least ackCoalesceCredit per handler; the peer reads the frames as they come).
	t.Run("LoneAcksLeaveAtOnceInANarrowWindow", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		handled := make(chan struct{}, 1)
		subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g", MaxInFlight: 8}, func(context.Context, *Delivery) error {
			handled <- struct{}{}
			return nil
		})
		for i := range 20 {
			p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, int64(i), "p")}})
			recv(t, handled, "handler")
			corr, ack := expect[*protocol.Ack](p)
			if len(ack.Refs) != 1 || ack.Refs[0].Offset != int64(i) {
				t.Fatalf("ack %d: %+v", i, ack.Refs)
			}
			p.write(corr, &protocol.AckOK{Acked: 1})
		}
	})
	t.Run("LoneAcksCoalesceInAWideWindow", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		handled := make(chan struct{}, 1)
		subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g", MaxInFlight: ackCoalesceCredit}, func(context.Context, *Delivery) error {
			handled <- struct{}{}
			return nil
		})
		const n = 50
		type count struct{ frames, refs int }
		counted := make(chan count, 1)
		go func() { // reads what the client writes as it comes (the pipe does not buffer)
			var k count
			for k.refs < n {
				_, m, err := p.r.ReadClientMessage()
				if err != nil {
					break
				}
				if ack, ok := m.(*protocol.Ack); ok {
					k.frames++
					k.refs += len(ack.Refs)
				}
			}
			counted <- k
		}()
		for i := range n {
			p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, int64(i), "p")}})
			recv(t, handled, "handler")
		}
		k := recv(t, counted, "the acks")
		if k.refs != n || k.frames > n/2 {
			t.Fatalf("%d acks in %d frames for %d lone deliveries, want them coalesced", k.refs, k.frames, n)
		}
		t.Logf("%d acks in %d frames", k.refs, k.frames)
	})

	t.Run("AcksAreBatched", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		var got sync.Map
		_, sub := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g", Start: FromBeginning()}, func(_ context.Context, d *Delivery) error {
			got.Store(d.Offset, string(d.Payload))
			return nil
		}, Concurrency(4))
		if sub.Group != "g" || sub.MaxInFlight != 8 || sub.Start.Kind != protocol.StartFromBeginning {
			t.Fatalf("subscribe = %+v", sub)
		}
		var ds []protocol.Delivery
		for i := range 8 {
			ds = append(ds, delivery(1, int64(i), fmt.Sprint("p", i)))
		}
		p.write(0, &protocol.Deliver{Deliveries: ds})
		var acked []int64
		frames := 0
		for len(acked) < 8 {
			corr, ack := expect[*protocol.Ack](p)
			frames++
			for _, r := range ack.Refs {
				if r.SubscriptionID != 10 {
					t.Fatalf("ref %+v", r)
				}
				acked = append(acked, r.Offset)
			}
			p.write(corr, &protocol.AckOK{Acked: uint32(len(ack.Refs))})
		}
		slices.Sort(acked)
		if !slices.Equal(acked, []int64{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Fatalf("acked %v", acked)
		}
		t.Logf("8 acks in %d frames", frames)
		for i := range 8 {
			if v, _ := got.Load(int64(i)); v != fmt.Sprint("p", i) {
				t.Fatalf("delivery %d payload %v", i, v)
			}
		}
	})

	t.Run("ErrorsNack", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		subscribePipe(t, c, p, SubscribeParams{Topic: "orders"}, func(_ context.Context, d *Delivery) error {
			switch string(d.Payload) {
			case "dlq":
				return ToDLQ(errors.New("poison"))
			case "later":
				return NackWithDelay(errors.New("busy"), 3*time.Second)
			case "panic":
				panic("boom")
			}
			return errors.New("failed")
		}, NackDelay(time.Second))
		p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 0, "plain")}})
		corr, nack := expect[*protocol.Nack](p)
		if nack.Delay != time.Second || nack.ToDLQ || nack.Reason != "failed" || len(nack.Refs) != 1 || nack.Refs[0].Offset != 0 {
			t.Fatalf("nack = %+v", nack)
		}
		p.write(corr, &protocol.NackOK{Nacked: 1})
		p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 1, "dlq")}})
		corr, nack = expect[*protocol.Nack](p)
		if !nack.ToDLQ || nack.Reason != "poison" {
			t.Fatalf("nack = %+v", nack)
		}
		p.write(corr, &protocol.NackOK{DeadLettered: 1})
		p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 2, "later")}})
		corr, nack = expect[*protocol.Nack](p)
		if nack.Delay != 3*time.Second || nack.ToDLQ || nack.Reason != "busy" {
			t.Fatalf("nack = %+v", nack)
		}
		p.write(corr, &protocol.NackOK{Nacked: 1})
		p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 3, "panic")}})
		corr, nack = expect[*protocol.Nack](p)
		if nack.Refs[0].Offset != 3 {
			t.Fatalf("nack = %+v", nack)
		}
		p.write(corr, &protocol.NackOK{Nacked: 1})
	})

	t.Run("ManualAckAndExtend", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		got := make(chan *Delivery, 1)
		subscribePipe(t, c, p, SubscribeParams{Topic: "orders"}, func(_ context.Context, d *Delivery) error {
			got <- d
			return errors.New("ignored with manual ack")
		}, ManualAck())
		p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 5, "x")}})
		d := recv(t, got, "delivery")

		ext := make(chan error, 1)
		go func() {
			_, err := d.Extend(context.Background(), time.Minute)
			ext <- err
		}()
		corr, e := expect[*protocol.Extend](p)
		if e.Duration != time.Minute || e.Refs[0].Offset != 5 {
			t.Fatalf("extend = %+v", e)
		}
		p.write(corr, &protocol.ExtendOK{NotHeld: e.Refs})
		if err := recv(t, ext, "extend"); !errors.Is(err, protocol.ErrLeaseNotHeld) {
			t.Fatalf("extend of a lost lease: %v", err)
		}

		ack := make(chan error, 1)
		go func() { ack <- d.Ack(context.Background()) }()
		corr, a := expect[*protocol.Ack](p)
		if len(a.Refs) != 1 || a.Refs[0].Offset != 5 {
			t.Fatalf("ack = %+v", a)
		}
		p.write(corr, &protocol.AckOK{Unknown: a.Refs})
		if err := recv(t, ack, "ack"); !errors.Is(err, ErrUnknownMessage) {
			t.Fatalf("ack of an unknown message: %v", err)
		}
		if err := d.Ack(context.Background()); !errors.Is(err, ErrAlreadySettled) {
			t.Fatalf("second ack: %v", err)
		}
	})

	t.Run("AckAfterConnectionLostFails", func(t *testing.T) {
		t.Parallel()
		n, c, p := pipeClient(t, nil)
		got := make(chan *Delivery, 1)
		subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g"}, func(_ context.Context, d *Delivery) error {
			got <- d
			return nil
		}, ManualAck())
		p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 0, "x")}})
		d := recv(t, got, "delivery")
		_ = p.nc.Close()
		p = n.acceptPeer(t)
		p.handshake(nil)
		expect[*protocol.Subscribe](p) // resubscribed; not answered, not needed
		if err := d.Ack(context.Background()); !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("ack after the connection broke: %v, want ErrConnectionLost", err)
		}
	})

	t.Run("EndedByBroker", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		s, _ := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g"}, func(context.Context, *Delivery) error { return nil })
		p.write(0, &protocol.SubscriptionEnded{Handle: 1, Code: protocol.CodeSubNotFound, Message: "cancelled"})
		recv(t, s.Done(), "subscription end")
		if !errors.Is(s.Err(), protocol.ErrSubscriptionNotFound) {
			t.Fatalf("Err = %v", s.Err())
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatalf("Close of an ended subscription: %v", err)
		}
	})
}

// TestResubscribe: after a reconnect every subscription is subscribed again; a durable group keeps
// its parameters, an ephemeral subscription restarts FROM_NOW.
func TestResubscribe(t *testing.T) {
	t.Parallel()
	connects := make(chan ConnectEvent, 4)
	n, c, p := pipeClient(t, nil, Hooks(connectHook(func(e ConnectEvent) { connects <- e })))
	recv(t, connects, "connect")
	received := make(chan string, 10)
	h := func(_ context.Context, d *Delivery) error { received <- string(d.Payload); return nil }

	ch := make(chan error, 2)
	go func() {
		_, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "a", Group: "g", Start: FromBeginning(), MaxInFlight: 3}, h, MemberID("w1"), LeaseDuration(time.Minute))
		ch <- err
	}()
	corr, sub := expect[*protocol.Subscribe](p)
	p.write(corr, &protocol.SubscribeOK{Handle: 1, MemberID: "w1"})
	if err := recv(t, ch, "subscribe"); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "b", Start: FromBeginning()}, h)
		ch <- err
	}()
	corr, _ = expect[*protocol.Subscribe](p)
	p.write(corr, &protocol.SubscribeOK{Handle: 2, MemberID: "m2"})
	if err := recv(t, ch, "subscribe"); err != nil {
		t.Fatal(err)
	}
	if sub.MemberID != "w1" || sub.LeaseDuration != time.Minute || sub.MaxInFlight != 3 {
		t.Fatalf("subscribe = %+v", sub)
	}

	_ = p.nc.Close()
	p = n.acceptPeer(t)
	p.handshake(func(h *protocol.HelloOK) { h.SessionID = "s2" })
	if ev := recv(t, connects, "reconnect"); !ev.Reconnect || ev.SessionID != "s2" {
		t.Fatalf("connect event %+v", ev)
	}
	byTopic := map[string]*protocol.Subscribe{}
	handles := map[string]uint32{}
	for i := range 2 {
		corr, sub := expect[*protocol.Subscribe](p)
		byTopic[sub.Topic] = sub
		handles[sub.Topic] = uint32(10 + i)
		p.write(corr, &protocol.SubscribeOK{Handle: uint32(10 + i), MemberID: "x"})
	}
	// Deliveries on the new handles reach the handlers.
	for topic, h := range handles {
		p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{{Handle: h, SubscriptionID: 1, Topic: topic, Attempt: 1, Payload: []byte(topic)}}})
	}
	if a := byTopic["a"]; a == nil || a.Group != "g" || a.Start.Kind != protocol.StartFromBeginning || a.MemberID != "w1" || a.MaxInFlight != 3 {
		t.Fatalf("durable resubscribe = %+v", a)
	}
	if b := byTopic["b"]; b == nil || b.Group != "" || b.Start.Kind != protocol.StartFromNow {
		t.Fatalf("ephemeral resubscribe = %+v", b)
	}
	got := []string{recv(t, received, "delivery"), recv(t, received, "delivery")}
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("deliveries after resubscribe: %v", got)
	}
}

// TestBrokerGoodbye: on the broker's Goodbye the client reconnects for new work (after the first
// backoff), lets the running handler finish and ack on the old connection, then answers GoodbyeOK
// there.
func TestBrokerGoodbye(t *testing.T) {
	t.Parallel()
	n, c, p := pipeClient(t, nil)
	entered := make(chan struct{})
	release := make(chan struct{})
	subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g"}, func(context.Context, *Delivery) error {
		close(entered)
		<-release
		return nil
	})
	p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 0, "x")}})
	<-entered
	old := p
	old.write(900, &protocol.Goodbye{Code: protocol.CodeClosed, Reason: "shutting down"})

	p = n.acceptPeer(t)
	p.handshake(nil)
	corr, _ := expect[*protocol.Subscribe](p)
	p.write(corr, &protocol.SubscribeOK{Handle: 5})

	close(release)
	corr, ack := expect[*protocol.Ack](old)
	if len(ack.Refs) != 1 || ack.Refs[0].Offset != 0 {
		t.Fatalf("ack on the old connection = %+v", ack)
	}
	old.write(corr, &protocol.AckOK{Acked: 1})
	corr, _ = expect[*protocol.GoodbyeOK](old)
	if corr != 900 {
		t.Fatalf("GoodbyeOK corr %d, want 900", corr)
	}
	_ = old.nc.Close()
}

// TestPublishAsync covers coalescing, order, the split of a failed batch, Flush and Close.
func TestPublishAsync(t *testing.T) {
	t.Parallel()

	t.Run("CoalescedInOrder", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		const k = 500
		var mu sync.Mutex
		got := make([]int64, k)
		for i := range k {
			c.PublishAsync("t", Message{Payload: fmt.Appendf(nil, "%d", i)}, func(pos Position, err error) {
				if err != nil {
					t.Errorf("async %d: %v", i, err)
				}
				mu.Lock()
				got[i] = pos.Offset
				mu.Unlock()
			})
		}
		frames, next := 0, int64(0)
		for next < k {
			corr, pub := expect[*protocol.Publish](p)
			frames++
			ok := &protocol.PublishOK{}
			for _, m := range pub.Messages {
				if string(m.Payload) != fmt.Sprint(next) {
					t.Fatalf("message %q arrived as number %d: order broken", m.Payload, next)
				}
				ok.Positions = append(ok.Positions, protocol.Position{Offset: next})
				next++
			}
			p.write(corr, ok)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		for i, off := range got {
			if off != int64(i) {
				t.Fatalf("callback %d got offset %d", i, off)
			}
		}
		t.Logf("%d async publishes in %d frames", k, frames)
	})

	t.Run("BadMessageDoesNotFailNeighbours", func(t *testing.T) {
		t.Parallel()
		disc := make(chan DisconnectEvent, 1)
		n, c, p := pipeClient(t, nil, Hooks(disconnectHook(func(e DisconnectEvent) { disc <- e })))
		// Break the connection so that the next publishes queue up and leave as one batch.
		_ = p.nc.Close()
		recv(t, disc, "disconnect")
		results := make(chan error, 3)
		for _, payload := range []string{"a", "bad", "c"} {
			c.PublishAsync("t", Message{Payload: []byte(payload)}, func(_ Position, err error) { results <- err })
		}
		p = n.acceptPeer(t)
		p.handshake(nil)
		corr, pub := expect[*protocol.Publish](p)
		if len(pub.Messages) != 3 {
			t.Fatalf("first request has %d messages, want the 3 queued ones", len(pub.Messages))
		}
		p.write(corr, protocol.ErrMessageTooLarge.WithMessage("one of them"))
		for range 3 {
			corr, pub := expect[*protocol.Publish](p)
			if len(pub.Messages) != 1 {
				t.Fatalf("retry alone: %d messages", len(pub.Messages))
			}
			if string(pub.Messages[0].Payload) == "bad" {
				p.write(corr, protocol.ErrMessageTooLarge.WithMessage("too big"))
			} else {
				p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{Offset: 1}}})
			}
		}
		var failed int
		for range 3 {
			if err := recv(t, results, "callback"); err != nil {
				if !errors.Is(err, protocol.ErrMessageTooLarge) {
					t.Fatalf("err = %v", err)
				}
				failed++
			}
		}
		if failed != 1 {
			t.Fatalf("%d failed, want 1", failed)
		}
	})

	t.Run("WindowBlocksAndCloseFailsTheRest", func(t *testing.T) {
		t.Parallel()
		n := newPipeNet(t)
		c, p := dialPipe(t, n, nil, MaxAsyncInFlight(2))
		var failed atomic.Int32
		cb := func(_ Position, err error) {
			if errors.Is(err, ErrClientClosed) || errors.Is(err, ErrConnectionLost) {
				failed.Add(1)
			}
		}
		c.PublishAsync("t", Message{Payload: []byte("1")}, cb)
		c.PublishAsync("t", Message{Payload: []byte("2")}, cb)
		third := make(chan struct{})
		go func() {
			c.PublishAsync("t", Message{Payload: []byte("3")}, cb) // blocks: the window is full
			close(third)
		}()
		// Nothing is answered: the third call stays blocked until Close fails the first two.
		n1 := 0
		for n1 < 2 {
			_, pub := expect[*protocol.Publish](p)
			n1 += len(pub.Messages)
		}
		select {
		case <-third:
			t.Fatal("PublishAsync returned with a full window")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		go p.serveClose()
		if err := c.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close with unanswered publishes: %v, want the flush deadline", err)
		}
		recv(t, third, "blocked PublishAsync")
		if got := failed.Load(); got != 3 {
			t.Fatalf("%d callbacks failed with ErrClientClosed, want 3", got)
		}
		c.PublishAsync("t", Message{}, cb) // after Close: the callback runs at once
		if got := failed.Load(); got != 4 {
			t.Fatalf("PublishAsync after Close: %d failures", got)
		}
	})
}

type recordingHooks struct {
	publish chan PublishEvent
	handle  chan HandleEvent
	ended   chan SubscriptionEndedEvent
}

func (h *recordingHooks) OnPublish(e PublishEvent)                     { h.publish <- e }
func (h *recordingHooks) OnHandle(e HandleEvent)                       { h.handle <- e }
func (h *recordingHooks) OnSubscriptionEnded(e SubscriptionEndedEvent) { h.ended <- e }

func TestHooksAndCredit(t *testing.T) {
	t.Parallel()
	h := &recordingHooks{publish: make(chan PublishEvent, 4), handle: make(chan HandleEvent, 4), ended: make(chan SubscriptionEndedEvent, 4)}
	n, c, p := pipeClient(t, nil, Hooks(h))

	go func() { _, _ = c.Publish(context.Background(), "t", Message{Payload: []byte("12345")}) }()
	corr, _ := expect[*protocol.Publish](p)
	p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{}}})
	if ev := recv(t, h.publish, "publish hook"); ev.Topic != "t" || ev.Messages != 1 || ev.Bytes != 5 || ev.Err != nil {
		t.Fatalf("publish event %+v", ev)
	}

	s, sub := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g"}, func(context.Context, *Delivery) error { return errors.New("no") })
	p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, 0, "x")}})
	corr, _ = expect[*protocol.Nack](p)
	p.write(corr, &protocol.NackOK{Nacked: 1})
	if ev := recv(t, h.handle, "handle hook"); ev.Topic != "orders" || ev.Group != "g" || ev.Attempt != 1 || ev.Err == nil {
		t.Fatalf("handle event %+v", ev)
	}

	// Credit: raised on the open handle, and carried by the next Subscribe after a reconnect.
	if err := s.AddCredit(context.Background(), 5); err != nil {
		t.Fatal(err)
	}
	corr, credit := expect[*protocol.Credit](p)
	if corr == 0 || credit.Handle != 1 || credit.Additional != 5 {
		t.Fatalf("credit corr %d %+v", corr, credit)
	}
	_ = p.nc.Close()
	p = n.acceptPeer(t)
	p.handshake(nil)
	corr, again := expect[*protocol.Subscribe](p)
	if again.MaxInFlight != sub.MaxInFlight+5 {
		t.Fatalf("resubscribe credit %d, want %d", again.MaxInFlight, sub.MaxInFlight+5)
	}
	p.write(corr, &protocol.SubscribeOK{Handle: 3, MemberID: "m1", Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 10, Topic: "orders"}}})

	// The end of the handle's one subscription: hooked, and it ends the Subscription, which gives
	// the handle back.
	p.write(0, &protocol.SubscriptionEnded{Handle: 3, SubscriptionID: 10, Topic: "orders", Code: protocol.CodeSubNotFound})
	if ev := recv(t, h.ended, "ended hook"); ev.HandleClosed || ev.Topic != "orders" || !errors.Is(ev.Err, protocol.ErrSubscriptionNotFound) {
		t.Fatalf("ended event %+v", ev)
	}
	if _, unsub := expect[*protocol.Unsubscribe](p); unsub.Handle != 3 {
		t.Fatalf("unsubscribe of handle %d, want 3", unsub.Handle)
	}
	recv(t, s.Done(), "Done")
	if err := s.Err(); !errors.Is(err, protocol.ErrSubscriptionNotFound) {
		t.Fatalf("Err() = %v, want SUBSCRIPTION_NOT_FOUND", err)
	}
}

// TestCloseWhileReconnecting: calls waiting for a connection end with ErrClientClosed, and Close
// does not wait for a Subscribe that never started its handlers.
func TestCloseWhileReconnecting(t *testing.T) {
	t.Parallel()
	n := newPipeNet(t)
	disc := make(chan DisconnectEvent, 1)
	c, p := dialPipe(t, n, nil, Hooks(disconnectHook(func(e DisconnectEvent) { disc <- e })))
	_ = p.nc.Close()
	recv(t, disc, "disconnect")
	subErr := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(context.Background(), SubscribeParams{Topic: "t"}, func(context.Context, *Delivery) error { return nil })
		subErr <- err
	}()
	pubErr := make(chan error, 1)
	go func() {
		_, err := c.Publish(context.Background(), "t", Message{})
		pubErr <- err
	}()
	// Wait until the Subscribe is registered (it then waits for the connection).
	checkFor(t, waitTimeout, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.subs) != 1 {
			return fmt.Errorf("%d subscriptions", len(c.subs))
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := recv(t, subErr, "Subscribe"); !errors.Is(err, ErrClientClosed) && !errors.Is(err, ErrSubscriptionClosed) {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := recv(t, pubErr, "Publish"); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("Publish: %v", err)
	}
}

// TestResubscribeMemberIDStillTaken: with a fixed member id, the broker may refuse the
// resubscription while it still holds the broken connection's member; the client retries.
func TestResubscribeMemberIDStillTaken(t *testing.T) {
	t.Parallel()
	n, c, p := pipeClient(t, nil)
	s, _ := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g"}, func(context.Context, *Delivery) error { return nil }, MemberID("w1"))
	_ = p.nc.Close()
	p = n.acceptPeer(t)
	p.handshake(nil)
	corr, _ := expect[*protocol.Subscribe](p)
	p.write(corr, protocol.ErrInvalidArgument.WithMessage(`member id "w1" is in use`))
	corr, sub := expect[*protocol.Subscribe](p)
	if sub.MemberID != "w1" {
		t.Fatalf("retry = %+v", sub)
	}
	p.write(corr, &protocol.SubscribeOK{Handle: 2, MemberID: "w1"})
	checkFor(t, waitTimeout, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.handle != 2 || s.closing {
			return fmt.Errorf("handle %d closing %v", s.handle, s.closing)
		}
		return nil
	})
}

// TestAsyncPublishClosedWhileRetryingTellsWhy: an async publish the broker keeps refusing with a
// retryable code (STORAGE_UNAVAILABLE: a damaged partition, a database that is down) and that
// Close ends fails with the broker's last answer in its error, not "closed" alone (spool pub
// printed "client: closed" and hid the cause).
func TestAsyncPublishClosedWhileRetryingTellsWhy(t *testing.T) {
	t.Parallel()
	_, c, p := pipeClient(t, nil)
	retried := make(chan struct{}) // the second attempt arrived: the client took in the first refusal
	peerDone := make(chan struct{})
	go func() {
		defer close(peerDone)
		attempts := 0
		for {
			_ = p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
			corr, m, err := p.r.ReadClientMessage()
			if err != nil {
				return
			}
			switch m.(type) {
			case *protocol.Publish:
				if attempts++; attempts == 2 {
					close(retried)
				}
				if p.tryWrite(corr, protocol.ErrStorageUnavailable.WithMessage("partition damaged")) != nil {
					return // the client's Close ended the connection while a retry was answered
				}
			case *protocol.Goodbye:
				p.write(corr, &protocol.GoodbyeOK{})
				_ = p.nc.Close()
				return
			}
		}
	}()
	result := make(chan error, 1)
	c.PublishAsync("t", Message{Payload: []byte("x")}, func(_ Position, err error) { result <- err })
	recv(t, retried, "a retry of the refused publish")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = c.Close(ctx)
	err := recv(t, result, "the publish's outcome")
	_ = p.nc.Close()
	<-peerDone // the fixture's cleanup reads the connection next
	if !errors.Is(err, protocol.ErrStorageUnavailable) || !strings.Contains(err.Error(), "partition damaged") {
		t.Fatalf("publish ended by Close while retrying: %v, want the last STORAGE_UNAVAILABLE in it", err)
	}
}

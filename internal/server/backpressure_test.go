package server

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// A topic at its backlog bound refuses publishes over TCP with RATE_LIMITED and the broker's
// retry-after (binary Error frame; text ERR line); a principal holding the priority permission
// still publishes.
func TestBackpressureRefusalOverTCP(t *testing.T) {
	e, _ := authEnv(t)
	defer e.close()
	if _, err := e.b.CreateTopic(t.Context(), "orders.bp", storage.TopicConfig{MaxBacklogMessages: 2}); err != nil {
		t.Fatal(err)
	}
	alice := e.dial(&protocol.Hello{ClientName: "test", Token: aliceToken})
	alice.publish("orders.bp", "a", "b")
	if err := e.b.RefreshBackpressure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if bp, _ := e.b.TopicBackpressure("orders.bp"); bp.State != broker.BackpressureRejecting {
		t.Fatalf("backpressure %+v, want rejecting", bp)
	}
	pe := alice.expectErr(&protocol.Publish{Topic: "orders.bp", Messages: []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte("c")}}}, protocol.CodeRateLimited)
	if !pe.Retryable || pe.RetryAfter < broker.DefaultBackpressureInterval {
		t.Fatalf("refused publish: %+v, want retryable with retry_after >= 1s", pe)
	}

	dave := e.dial(&protocol.Hello{ClientName: "test", Token: daveToken})
	dave.publish("orders.bp", "priority")

	tc := e.dialText()
	tc.send("AUTH "+aliceToken, "PUBLISH orders.bp c")
	tc.expect("OK authenticated as alice")
	if l := tc.expect("ERR RATE_LIMITED"); !strings.Contains(l, "retry after") {
		t.Fatalf("text refusal %q does not say when to retry", l)
	}
	st := e.groupStats("orders.bp", storage.QueueGroup)
	if st.Pending != 3 {
		t.Fatalf("pending %d, want 3 (a, b and the priority one; the refused ones changed nothing)", st.Pending)
	}
}

// throttleEnv is a server whose broker reads backlogs only when the test says
// (RefreshBackpressure) and throttles for up to maxDelay.
func throttleEnv(t *testing.T, maxDelay time.Duration) *env {
	return newEnv(t, nil, func(c *broker.Config) {
		c.BackpressureInterval = -1
		c.MaxThrottleDelay = maxDelay
	})
}

// onlyConn returns the server's only connection.
func (e *env) onlyConn() *conn {
	e.t.Helper()
	conns := e.srv.snapshot()
	if len(conns) != 1 {
		e.t.Fatalf("%d connections, want 1", len(conns))
	}
	return conns[0]
}

// responseBefore reads until corr is answered and returns the answer; it fails if one of early
// is answered first.
func (c *bclient) responseBefore(corr uint32, early ...uint32) protocol.ServerMessage {
	c.t.Helper()
	for {
		got, m := c.read()
		if !m.Opcode().IsResponse() {
			c.keep(got, m)
			continue
		}
		if slices.Contains(early, got) {
			c.t.Fatalf("request %d answered (%T %v) before request %d", got, m, m, corr)
		}
		if got == corr {
			return m
		}
		c.keep(got, m)
	}
}

// publishedAt reports whether m is the PublishOK of one message stored at offset.
func publishedAt(m protocol.ServerMessage, offset int64) bool {
	ok, isOK := m.(*protocol.PublishOK)
	return isOK && len(ok.Positions) == 1 && ok.Positions[0].Offset == offset
}

// A throttled publish holds back only the later publishes of its own topic on its connection
// (per-topic order), not those to other topics, which are appended and answered while it waits;
// interrupting the session ends the wait, nothing of the held publishes stored.
func TestThrottledPublishHoldsOnlyItsTopic(t *testing.T) {
	e := throttleEnv(t, time.Minute)
	ctx := t.Context()
	if _, err := e.b.CreateTopic(ctx, "slow", storage.TopicConfig{MaxBacklogMessages: 10, BacklogPolicy: storage.BacklogThrottle}); err != nil {
		t.Fatal(err)
	}
	c := e.dial(nil)
	c.publish("slow", "m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8")
	if err := e.b.RefreshBackpressure(ctx); err != nil {
		t.Fatal(err)
	}
	// At 90% of the bound a publish waits 50 s: far longer than anything below waits for.
	if bp, _ := e.b.TopicBackpressure("slow"); bp.State != broker.BackpressureThrottled || bp.Delay <= 2*waitTimeout {
		t.Fatalf("backpressure %+v, want throttled by more than %s", bp, 2*waitTimeout)
	}
	sc := e.onlyConn()
	// wantHeld waits until the publishes answered are off the connection's load (they are taken
	// off after their answer is written), then checks that n are still held and not stored.
	wantHeld := func(n int) {
		t.Helper()
		eventually(t, "the answered publishes leave the connection's load", func() error {
			if pending, _ := sc.pub.load(); pending != n {
				return fmt.Errorf("%d publishes pending on the connection, want %d", pending, n)
			}
			return nil
		})
		if st := e.groupStats("slow", storage.QueueGroup); st.Pending != 9 {
			t.Fatalf("%d messages pending on the throttled topic, want 9 (the held publishes not stored)", st.Pending)
		}
	}

	held := c.send(pub("slow", "held"))
	fast := c.send(pub("fast", "f0"))
	if m := c.responseBefore(fast, held); !publishedAt(m, 0) {
		t.Fatalf("publish to another topic after the throttled one: %T %v", m, m)
	}
	wantHeld(1)

	// The bound is removed: the topic is no longer throttled, but a publish to it still waits
	// behind the held one (per-topic order), while another topic's goes on.
	if _, err := e.b.UpdateTopic(ctx, broker.UpdateTopicParams{Name: "slow", Config: storage.TopicConfig{}}); err != nil {
		t.Fatal(err)
	}
	if err := e.b.RefreshBackpressure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, bounded := e.b.TopicBackpressure("slow"); bounded {
		t.Fatal("the topic still has a backlog bound")
	}
	after := c.send(pub("slow", "after"))
	fast = c.send(pub("fast", "f1"))
	if m := c.responseBefore(fast, held, after); !publishedAt(m, 1) {
		t.Fatalf("publish to another topic: %T %v", m, m)
	}
	wantHeld(2)

	// Interrupted, the session answers both CLOSED, in order, and stores nothing of them.
	sc.interrupt()
	for _, m := range []protocol.ServerMessage{c.responseBefore(held, after), c.response(after)} {
		if pe, ok := m.(*protocol.Error); !ok || pe.Code != protocol.CodeClosed {
			t.Fatalf("held publish after the interrupt: %T %v, want CLOSED", m, m)
		}
	}
	c.expectClosed()
	eventually(t, "the connection ends", func() error {
		if n := len(e.srv.snapshot()); n != 0 {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	})
	if st := e.groupStats("slow", storage.QueueGroup); st.Pending != 9 {
		t.Fatalf("%d messages on the throttled topic, want 9", st.Pending)
	}
}

// A session the server ends by its session timeout while a publish waits for its topic's
// throttle answers that publish CLOSED, nothing stored (docs/protocol.md 8.3), as at Stop: the
// wait ends with the session instead of running out and appending. The throttle delay (5 s) is
// far longer than the session timeout (150 ms); the client answers no Heartbeat.
func TestThrottledPublishEndsWithSessionTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MinHeartbeatInterval = 10 * time.Millisecond }, func(c *broker.Config) {
		c.BackpressureInterval = -1
		c.MaxThrottleDelay = 6 * time.Second
	})
	ctx := t.Context()
	if _, err := e.b.CreateTopic(ctx, "slow", storage.TopicConfig{MaxBacklogMessages: 10, BacklogPolicy: storage.BacklogThrottle}); err != nil {
		t.Fatal(err)
	}
	fill := make([]storage.AppendMessage, 9)
	for i := range fill {
		fill[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("fill")}
	}
	if _, err := e.b.Publish(ctx, "slow", fill); err != nil {
		t.Fatal(err)
	}
	if err := e.b.RefreshBackpressure(ctx); err != nil {
		t.Fatal(err)
	}
	if bp, _ := e.b.TopicBackpressure("slow"); bp.State != broker.BackpressureThrottled || bp.Delay < 4*time.Second {
		t.Fatalf("backpressure %+v, want throttled by at least 4s", bp)
	}
	c := e.dial(&protocol.Hello{HeartbeatInterval: 50 * time.Millisecond})
	if c.hello.SessionTimeout != 150*time.Millisecond {
		t.Fatalf("session timeout %s", c.hello.SessionTimeout)
	}
	held := c.send(pub("slow", "held"))
	// Read to the close without answering the server's Heartbeats (bclient.response would).
	var timedOut bool
	var answer protocol.ServerMessage
	for {
		corr, m, err := c.tryRead()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
				break
			}
			t.Fatalf("waiting for the server to close: %v", err)
		}
		switch pe, _ := m.(*protocol.Error); {
		case corr == held:
			answer = m
		case corr == 0 && pe != nil && pe.Code == protocol.CodeSessionTimeout:
			timedOut = true
		}
	}
	if !timedOut {
		t.Fatal("no SESSION_TIMEOUT before the close")
	}
	if pe, ok := answer.(*protocol.Error); !ok || pe.Code != protocol.CodeClosed {
		t.Fatalf("held publish answered %T %v, want CLOSED", answer, answer)
	}
	if st := e.groupStats("slow", storage.QueueGroup); st.Pending != 9 {
		t.Fatalf("%d messages on the throttled topic, want 9 (the held publish not stored)", st.Pending)
	}
}

// Publishes to a throttled topic pipelined with publishes to another topic are all appended and
// answered, each topic's in the order sent (the throttled ones through the topic's lane, merged
// as they queue up behind each wait).
func TestThrottledPublishesKeepOrder(t *testing.T) {
	e := throttleEnv(t, 20*time.Millisecond)
	ctx := t.Context()
	if _, err := e.b.CreateTopic(ctx, "slow", storage.TopicConfig{MaxBacklogMessages: 1000, BacklogPolicy: storage.BacklogThrottle}); err != nil {
		t.Fatal(err)
	}
	c := e.dial(nil)
	fill := make([]string, 600)
	for i := range fill {
		fill[i] = fmt.Sprint("fill-", i)
	}
	c.publish("slow", fill...)
	if err := e.b.RefreshBackpressure(ctx); err != nil {
		t.Fatal(err)
	}
	if bp, _ := e.b.TopicBackpressure("slow"); bp.State != broker.BackpressureThrottled || bp.Delay <= 0 {
		t.Fatalf("backpressure %+v, want throttled", bp)
	}
	const n = 100
	var reqs []protocol.Message
	for i := range n {
		reqs = append(reqs, pub("slow", fmt.Sprint("s-", i)), pub("fast", fmt.Sprint("f-", i)))
	}
	corrs := c.pipeline(reqs...)
	got := c.responses(corrs)
	for i, corr := range corrs {
		want := int64(i / 2)
		if i%2 == 0 {
			want += int64(len(fill))
		}
		if !publishedAt(got[corr], want) {
			t.Fatalf("request %d (%v) answered %T %v, want offset %d", i, reqs[i].(*protocol.Publish).Topic, got[corr], got[corr], want)
		}
	}
	if bp, _ := e.b.TopicBackpressure("slow"); bp.Throttled == 0 {
		t.Fatalf("backpressure %+v: no publish was throttled", bp)
	}
	r := c.subscribe(&protocol.Subscribe{Topic: "slow", MaxInFlight: uint32(len(fill) + n), Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	ds := c.deliveriesN(len(fill) + n)
	for i, d := range ds[len(fill):] {
		if d.Handle != r.Handle || string(d.Payload) != fmt.Sprint("s-", i) {
			t.Fatalf("message %d of the throttled topic: %q, want %q", len(fill)+i, d.Payload, fmt.Sprint("s-", i))
		}
	}
}

// A merged call refused for one bad request is appended again one request at a time; when the
// throttle then delays one of them (the refused call counted in the estimated backlog until the
// next reading), it and the rest go to the topic's lane, which appends them in order: the good
// ones stored, the bad one failing alone.
func TestPublishRoundFallbackToLane(t *testing.T) {
	e := throttleEnv(t, 20*time.Millisecond)
	ctx := t.Context()
	if _, err := e.b.CreateTopic(ctx, "merge", storage.TopicConfig{MaxMessageBytes: 64, MaxBacklogMessages: 100,
		BacklogPolicy: storage.BacklogThrottle}); err != nil {
		t.Fatal(err)
	}
	fill := make([]storage.AppendMessage, 48)
	for i := range fill {
		fill[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("fill")}
	}
	if _, err := e.b.Publish(ctx, "merge", fill); err != nil {
		t.Fatal(err)
	}
	if err := e.b.RefreshBackpressure(ctx); err != nil {
		t.Fatal(err)
	}
	// At 48% the merged call of 3 messages is admitted (normal), then its requests alone start
	// at 51%: throttled.
	if bp, _ := e.b.TopicBackpressure("merge"); bp.State != broker.BackpressureNormal || bp.BacklogMessages != 48 {
		t.Fatalf("backpressure %+v, want normal at 48", bp)
	}
	sess := pipeSession(t, e)
	c := sess.c
	reqs := []pubReq{
		{corr: 1, msg: pub("merge", "a")},
		{corr: 2, msg: pub("merge", strings.Repeat("z", 100))},
		{corr: 3, msg: pub("merge", "b")},
	}
	c.pub.pending = len(reqs) // as queuePublish counts them
	sess.publishRound(reqs)
	eventually(t, "every request answered", func() error {
		if n, _ := c.pub.load(); n != 0 {
			return fmt.Errorf("%d not answered", n)
		}
		return nil
	})
	out, _ := c.take(true)
	got := map[uint32]protocol.ServerMessage{}
	for _, it := range out {
		got[it.corr], _ = it.msg.(protocol.ServerMessage)
	}
	if len(out) != 3 || !publishedAt(got[1], 48) || !publishedAt(got[3], 49) {
		t.Fatalf("answers %v, want requests 1 and 3 stored at 48 and 49", out)
	}
	if pe, ok := got[2].(*protocol.Error); !ok || pe.Code != protocol.CodeMessageTooLarge {
		t.Fatalf("bad request answered %v", got[2])
	}
	if bp, _ := e.b.TopicBackpressure("merge"); bp.Throttled == 0 {
		t.Fatalf("backpressure %+v: nothing was throttled", bp)
	}
}

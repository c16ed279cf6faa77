package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

func TestHandshake(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.Version = "1.2.3" }, nil)

	c := e.dial(nil)
	h := c.hello
	if h.Version != protocol.Version6 || h.ServerName != "test" || h.SessionID == "" ||
		h.HeartbeatInterval != DefaultHeartbeatInterval || h.SessionTimeout != DefaultSessionTimeout ||
		h.MaxFrameSize != protocol.DefaultMaxFrameSize || h.MaxMessageSize != storage.DefaultMaxMessageBytes ||
		h.Properties["server.version"] != "1.2.3" || h.Properties["server.max_credit"] != "65536" {
		t.Fatalf("HelloOK = %+v", h)
	}

	// A requested interval is clamped, and the session timeout keeps the 3:1 ratio.
	c2 := e.dial(&protocol.Hello{HeartbeatInterval: 2 * time.Second})
	if c2.hello.HeartbeatInterval != 2*time.Second || c2.hello.SessionTimeout != 6*time.Second {
		t.Fatalf("HelloOK heartbeat %s / %s, want 2s / 6s", c2.hello.HeartbeatInterval, c2.hello.SessionTimeout)
	}
	c3 := e.dial(&protocol.Hello{HeartbeatInterval: time.Millisecond})
	if c3.hello.HeartbeatInterval != DefaultMinHeartbeatInterval {
		t.Fatalf("HelloOK heartbeat %s, want the minimum %s", c3.hello.HeartbeatInterval, DefaultMinHeartbeatInterval)
	}
	if c.hello.SessionID == c2.hello.SessionID {
		t.Fatalf("two sessions share id %q", c.hello.SessionID)
	}
	if got := c.request(&protocol.Heartbeat{Time: time.Unix(5, 0)}); !got.(*protocol.HeartbeatOK).Echo.Equal(time.Unix(5, 0)) {
		t.Fatalf("HeartbeatOK = %+v", got)
	}
	// A second Hello is refused and the session stays.
	c.expectErr(&protocol.Hello{MinVersion: 1, MaxVersion: 1}, protocol.CodeUnexpectedFrame)
	c.publish("still.open", "x")
}

func TestHandshakeRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)

	t.Run("unsupported version", func(t *testing.T) {
		_, err := e.tryDial(&protocol.Hello{MinVersion: 7, MaxVersion: 9})
		if pe := protocol.AsError(err); pe == nil || pe.Code != protocol.CodeUnsupportedVersion || !strings.Contains(pe.Message, "server 2 to 6") {
			t.Fatalf("handshake with versions 7-9: %v", err)
		}
	})
	t.Run("version 1 (pre-release layout)", func(t *testing.T) {
		_, err := e.tryDial(&protocol.Hello{MinVersion: 1, MaxVersion: 1})
		if pe := protocol.AsError(err); pe == nil || pe.Code != protocol.CodeUnsupportedVersion {
			t.Fatalf("handshake with version 1: %v", err)
		}
	})
	t.Run("first frame not Hello", func(t *testing.T) {
		nc := e.dialRaw()
		w := protocol.NewWriter(nc, 0)
		_ = w.WritePreamble()
		_ = w.WriteMessage(3, &protocol.Publish{Topic: "a", Messages: []protocol.PublishMessage{{Payload: []byte("x")}}})
		_ = w.Flush()
		c := &bclient{t: t, nc: nc, r: protocol.NewReader(nc, 0)}
		if err := c.r.ReadPreamble(); err != nil {
			t.Fatalf("server preamble: %v", err)
		}
		got := c.expectClosed()
		if len(got) != 1 || got[0].(*protocol.Error).Code != protocol.CodeUnexpectedFrame {
			t.Fatalf("got %v, want one UNEXPECTED_FRAME", got)
		}
	})
	// An opcode no version defines is unexpected before Hello too (it was UNKNOWN_OPCODE).
	t.Run("unknown opcode first", func(t *testing.T) {
		got := e.firstFrameHeader(t, 8, 0x3f, 4)
		if len(got) != 1 || got[0].(*protocol.Error).Code != protocol.CodeUnexpectedFrame {
			t.Fatalf("got %v, want one UNEXPECTED_FRAME", got)
		}
	})
	// Before HelloOK the peer is unauthenticated: a frame past 64 KiB is refused, although the
	// server's max frame size (10 MiB here) allows it afterwards.
	t.Run("frame past 64 KiB before Hello", func(t *testing.T) {
		got := e.firstFrameHeader(t, 1<<20, protocol.OpHello, 1)
		if len(got) != 1 || got[0].(*protocol.Error).Code != protocol.CodeFrameTooLarge {
			t.Fatalf("got %v, want one FRAME_TOO_LARGE", got)
		}
		// After the handshake the announced max frame size holds again.
		c2 := e.dial(nil)
		if c2.hello.MaxFrameSize != protocol.DefaultMaxFrameSize {
			t.Fatalf("announced max frame size %d", c2.hello.MaxFrameSize)
		}
		payload := bytes.Repeat([]byte("p"), 200<<10)
		c2.publish("big.after.hello", string(payload))
	})
	t.Run("bad preamble closes without an answer", func(t *testing.T) {
		nc := e.dialRaw()
		if _, err := nc.Write([]byte("\x00XYZ")); err != nil {
			t.Fatal(err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(waitTimeout))
		if b, err := io.ReadAll(nc); len(b) != 0 || (err != nil && !isReset(err)) {
			t.Fatalf("bad preamble: read %q, %v; want a close without answer", b, err)
		}
	})
}

// firstFrameHeader sends the preamble and a first frame header of length, op and corr (no
// body), and returns what the server answered before closing the connection.
func (e *env) firstFrameHeader(t *testing.T, length uint32, op protocol.Opcode, corr uint32) []protocol.ServerMessage {
	nc := e.dialRaw()
	var frame [12]byte
	binary.BigEndian.PutUint32(frame[0:], length)
	binary.BigEndian.PutUint16(frame[4:], uint16(op))
	binary.BigEndian.PutUint32(frame[8:], corr)
	if _, err := nc.Write(append(protocol.Preamble[:], frame[:]...)); err != nil {
		t.Fatal(err)
	}
	c := &bclient{t: t, nc: nc, r: protocol.NewReader(nc, 0)}
	if err := c.r.ReadPreamble(); err != nil {
		t.Fatalf("server preamble: %v", err)
	}
	return c.expectClosed()
}

func TestHandshakeTimeout(t *testing.T) {
	t.Parallel()
	// Not shorter: the deadline runs from the accept, and a server goroutine that first reads
	// after it (a loaded CI machine once took over 100 ms) closes without a word, as for a
	// connection that sent nothing.
	e := newEnv(t, func(c *Config) { c.HandshakeTimeout = 500 * time.Millisecond }, nil)
	nc := e.dialRaw()
	if _, err := nc.Write(protocol.Preamble[:]); err != nil {
		t.Fatal(err)
	}
	c := &bclient{t: t, nc: nc, r: protocol.NewReader(nc, 0)}
	if err := c.r.ReadPreamble(); err != nil {
		t.Fatalf("server preamble: %v", err)
	}
	got := c.expectClosed()
	if len(got) != 1 || got[0].(*protocol.Error).Code != protocol.CodeSessionTimeout {
		t.Fatalf("got %v, want one SESSION_TIMEOUT", got)
	}
}

func TestPublishSubscribeAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	c := e.dial(nil)

	ok := c.publish("orders.created", "a", "b", "c")
	// Partitions: 1 lets the client show the ids as the text mode and HTTP do (the offset alone).
	if len(ok.Positions) != 3 || ok.Partitions != 1 {
		t.Fatalf("PublishOK = %+v", ok)
	}
	for i, p := range ok.Positions {
		if p.Partition != 0 || p.Offset != int64(i) || p.PublishTime.IsZero() || p.Duplicate {
			t.Fatalf("position %d = %+v", i, p)
		}
	}
	sub := c.subscribe(&protocol.Subscribe{Topic: "orders.created", MaxInFlight: 10})
	if sub.Handle == 0 || sub.MemberID == "" || len(sub.Subscriptions) != 1 || sub.Subscriptions[0].Topic != "orders.created" {
		t.Fatalf("SubscribeOK = %+v", sub)
	}
	ds := c.deliveriesN(3)
	for i, d := range ds {
		if d.Handle != sub.Handle || d.SubscriptionID != sub.Subscriptions[0].SubscriptionID || d.Topic != "orders.created" ||
			d.Partitions != 1 || d.Offset != int64(i) || d.Attempt != 1 || string(d.Payload) != "abc"[i:i+1] ||
			!d.LeaseDeadline.After(d.PublishTime) {
			t.Fatalf("delivery %d = %+v", i, d)
		}
	}
	ack := expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(ds...)})
	if ack.Acked != 3 || ack.AlreadyDone != 0 || len(ack.Unknown) != 0 {
		t.Fatalf("AckOK = %+v", ack)
	}
	// Acks are idempotent; refs of a subscription this connection never joined are unknown.
	foreign := protocol.Ref{SubscriptionID: 9999, Offset: 1}
	ack = expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: append(refs(ds[0]), foreign)})
	if ack.Acked != 0 || ack.AlreadyDone != 1 || len(ack.Unknown) != 1 || ack.Unknown[0] != foreign {
		t.Fatalf("second AckOK = %+v", ack)
	}
	// Above the high-water mark: unknown.
	high := protocol.Ref{SubscriptionID: ds[0].SubscriptionID, Offset: 100}
	if ack = expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: []protocol.Ref{high}}); len(ack.Unknown) != 1 {
		t.Fatalf("AckOK above the high-water mark = %+v", ack)
	}
	if st := e.groupStats("orders.created", ""); st.Pending != 0 {
		t.Fatalf("pending after acks = %d", st.Pending)
	}

	// Extend: held refs move their deadline, others are not held.
	c.publish("orders.created", "d")
	d := c.deliveriesN(1)[0]
	ext := expectOK[*protocol.ExtendOK](c, &protocol.Extend{Duration: time.Hour, Refs: append(refs(d), high)})
	if ext.Extended != 1 || len(ext.NotHeld) != 1 || time.Until(ext.Deadline) < 59*time.Minute {
		t.Fatalf("ExtendOK = %+v", ext)
	}
	// Leases are bounded by broker.MaxLeaseDuration (24 h), as over HTTP: the wire's largest
	// duration (2^32-1 ms, 49.7 days) is refused, held or not, and the lease keeps its deadline.
	for _, m := range []*protocol.Extend{
		{Duration: protocol.MaxDuration, Refs: refs(d)},
		{Duration: broker.MaxLeaseDuration + time.Millisecond, Refs: refs(d)},
		{Duration: protocol.MaxDuration, Refs: []protocol.Ref{high}},
	} {
		if pe := c.expectErr(m, protocol.CodeInvalidArgument); !strings.Contains(pe.Message, "24h0m0s") {
			t.Fatalf("Extend %s: %v", m.Duration, pe)
		}
	}
	if ext := expectOK[*protocol.ExtendOK](c, &protocol.Extend{Duration: broker.MaxLeaseDuration, Refs: refs(d)}); ext.Extended != 1 {
		t.Fatalf("Extend by the maximum: %+v", ext)
	}

	// Unsubscribe releases what the handle holds; no delivery for it follows.
	un := expectOK[*protocol.UnsubscribeOK](c, &protocol.Unsubscribe{Handle: sub.Handle})
	if un.Released != 1 {
		t.Fatalf("UnsubscribeOK = %+v", un)
	}
	c.expectErr(&protocol.Unsubscribe{Handle: sub.Handle}, protocol.CodeUnknownHandle)
	// Acks for deliveries of a closed handle are still accepted.
	if ack := expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(d)}); ack.Acked != 1 {
		t.Fatalf("AckOK after Unsubscribe = %+v", ack)
	}
}

// TestPipelinedPublishesKeepOrder sends many publishes to one topic without waiting: they are
// appended in the order sent, and every one is answered once.
func TestPipelinedPublishesKeepOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	c := e.dial(nil)
	const n = 200
	corrs := make(map[uint32]int, n)
	c.wmu.Lock()
	for i := range n {
		c.corr++
		corrs[c.corr] = i
		m := &protocol.Publish{Topic: "pipe", Messages: []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: fmt.Appendf(nil, "m%d", i)}}}
		if err := c.w.WriteMessage(c.corr, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.w.Flush(); err != nil {
		t.Fatal(err)
	}
	c.wmu.Unlock()
	for range n {
		corr, m := c.read()
		ok, isOK := m.(*protocol.PublishOK)
		i, known := corrs[corr]
		if !isOK || !known {
			t.Fatalf("got %T corr %d", m, corr)
		}
		delete(corrs, corr)
		if ok.Positions[0].Offset != int64(i) {
			t.Fatalf("publish %d got offset %d", i, ok.Positions[0].Offset)
		}
	}
}

// gateSpy passes every call on to the real engine, but holds each DeliveriesAck (DeliveriesNack)
// until want calls of that kind are in it at the same time: requests that run one after the
// other never get through (they fail after gateWait). want 0 lets the calls through.
type gateSpy struct {
	storage.Engine
	mu                sync.Mutex
	ackGate, nackGate *gate
}

// gateWait bounds the wait of a gated call.
const gateWait = 10 * time.Second

// gate lets calls through once want of them wait at the same time; once one waited in vain,
// the calls after it fail at once.
type gate struct {
	want, in int
	failed   bool
	open     chan struct{}
}

func newGate(want int) *gate { return &gate{want: want, open: make(chan struct{})} }

// pass waits until the gate (nil: none) opened; it reports false when it did not in time.
func (s *gateSpy) pass(g *gate) bool {
	if g == nil {
		return true
	}
	s.mu.Lock()
	if g.failed {
		s.mu.Unlock()
		return false
	}
	g.in++
	if g.in == g.want {
		close(g.open)
	}
	s.mu.Unlock()
	select {
	case <-g.open:
		return true
	case <-time.After(gateWait):
		s.mu.Lock()
		g.failed = true
		s.mu.Unlock()
		return false
	}
}

func (s *gateSpy) gates() (ack, nack *gate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ackGate, s.nackGate
}

func (s *gateSpy) DeliveriesAck(ctx context.Context, p *storage.DeliveriesAckParams) (*storage.DeliveriesAckResult, error) {
	if g, _ := s.gates(); !s.pass(g) {
		return nil, errors.New("gateSpy: the acks did not run at the same time")
	}
	return s.Engine.DeliveriesAck(ctx, p)
}

func (s *gateSpy) DeliveriesNack(ctx context.Context, p *storage.DeliveriesNackParams) (*storage.DeliveriesNackResult, error) {
	if _, g := s.gates(); !s.pass(g) {
		return nil, errors.New("gateSpy: the nacks did not run at the same time")
	}
	return s.Engine.DeliveriesNack(ctx, p)
}

// TestAcksArrivingTogetherShareCommits: Ack requests that arrive together run at once (so they
// share the engine's commits instead of waiting for one commit each: the engine's group commit
// is tested in wlog); every one still gets its own answer, and the request after them (a Nack)
// runs after them. The engine holds each ack until all of them are in it: one at a time, they
// would fail.
func TestAcksArrivingTogetherShareCommits(t *testing.T) {
	t.Parallel()
	spy := &gateSpy{}
	e := newEnv(t, nil, func(c *broker.Config) { spy.Engine = c.Engine; c.Engine = spy })
	c := e.dial(nil)
	const n = 40
	ds := c.holdN("burst", n)

	// n-1 Acks of one ref each, a second Ack of the first ref, then a Nack of the last
	// delivery, all in one write.
	var frames []protocol.Message
	for _, d := range ds[:n-1] {
		frames = append(frames, &protocol.Ack{Refs: refs(d)})
	}
	frames = append(frames, &protocol.Ack{Refs: refs(ds[0])}, &protocol.Nack{Delay: time.Hour, Refs: refs(ds[n-1])})
	spy.mu.Lock()
	spy.ackGate = newGate(n)
	spy.mu.Unlock()
	corrs := c.pipeline(frames...)
	got := c.responses(corrs)
	acked, done := 0, 0
	for i := range n {
		ok, isOK := got[corrs[i]].(*protocol.AckOK)
		if !isOK || len(ok.Unknown) != 0 || ok.Acked+ok.AlreadyDone != 1 {
			t.Fatalf("answer to Ack %d: %#v", i, got[corrs[i]])
		}
		acked += int(ok.Acked)
		done += int(ok.AlreadyDone)
	}
	if acked != n-1 || done != 1 {
		t.Fatalf("acked %d, already done %d; want %d and 1", acked, done, n-1)
	}
	if nack, isOK := got[corrs[n]].(*protocol.NackOK); !isOK || nack.Nacked != 1 {
		t.Fatalf("answer to the Nack: %#v", got[corrs[n]])
	}
	if st := e.groupStats("burst", ""); st.Pending != 1 || st.InFlight != 0 {
		t.Fatalf("stats = %+v, want only the nacked message pending", st)
	}
}

// TestNacksArrivingTogetherShareCommits: Nack requests that arrive together run at once, like
// acks (a consumer whose downstream is down nacks every message), so that they share the
// engine's commits: each gets its own answer and the messages come back with their next
// attempt. The engine holds each nack until all of them are in it.
func TestNacksArrivingTogetherShareCommits(t *testing.T) {
	t.Parallel()
	spy := &gateSpy{}
	e := newEnv(t, nil, func(c *broker.Config) { spy.Engine = c.Engine; c.Engine = spy })
	c := e.dial(nil)
	const n = 40
	ds := c.holdN("outage", n)

	frames := make([]protocol.Message, n)
	for i, d := range ds {
		frames[i] = &protocol.Nack{Delay: 100 * time.Millisecond, Reason: "downstream unavailable", Refs: refs(d)}
	}
	spy.mu.Lock()
	spy.nackGate = newGate(n)
	spy.mu.Unlock()
	corrs := c.pipeline(frames...)
	got := c.responses(corrs)
	for i, corr := range corrs {
		m := got[corr]
		if ok, isOK := m.(*protocol.NackOK); !isOK || ok.Nacked != 1 || ok.DeadLettered != 0 || len(ok.NotHeld) != 0 {
			t.Fatalf("answer to Nack %d: %#v", i, m)
		}
	}
	again := c.deliveriesN(n)
	seen := make(map[int64]bool, n)
	for _, d := range again {
		if d.Attempt != 2 || seen[d.Offset] {
			t.Fatalf("redelivery %+v: want each message once, attempt 2", d)
		}
		seen[d.Offset] = true
	}
	for _, d := range ds {
		if !seen[d.Offset] {
			t.Fatalf("message at offset %d not redelivered", d.Offset)
		}
	}
}

// TestGatheredRequestsKeepOrder: Acks, Nacks and Extends sent in one write, where each request
// depends on earlier ones of another kind, get the answers of running them one at a time: a group
// of one kind never runs before an earlier request or after a later one. The script runs once one
// request at a time (each waits for its answer) and once in one write, against the same expected
// answers. The last two requests, two Nacks of one delivery in one group, may run in either
// order: one gives it back, the other finds it not held.
func TestGatheredRequestsKeepOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	type step struct {
		req  protocol.Message
		want string
	}
	script := func(d []protocol.Delivery) []step {
		return []step{
			{&protocol.Ack{Refs: refs(d[0])}, "AckOK acked=1 done=0 unknown=[]"},
			{&protocol.Ack{Refs: refs(d[1])}, "AckOK acked=1 done=0 unknown=[]"},
			// d0 was acked just before.
			{&protocol.Nack{Delay: time.Hour, Refs: refs(d[0], d[2])}, "NackOK nacked=1 dead=0 notheld=[d0]"},
			{&protocol.Nack{Delay: time.Hour, Refs: refs(d[3])}, "NackOK nacked=1 dead=0 notheld=[]"},
			// d2 was nacked just before.
			{&protocol.Extend{Duration: time.Hour, Refs: refs(d[2], d[4])}, "ExtendOK extended=1 notheld=[d2]"},
			{&protocol.Extend{Duration: time.Hour, Refs: refs(d[5])}, "ExtendOK extended=1 notheld=[]"},
			// Any member may ack a nacked message (d2); d1 was acked before.
			{&protocol.Ack{Refs: refs(d[2], d[4], d[1])}, "AckOK acked=2 done=1 unknown=[]"},
			// d4 was acked just before.
			{&protocol.Nack{ToDLQ: true, Refs: refs(d[4], d[5])}, "NackOK nacked=0 dead=1 notheld=[d4]"},
			{&protocol.Extend{Refs: refs(d[5], d[6])}, "ExtendOK extended=1 notheld=[d5]"},
			{&protocol.Nack{Delay: time.Hour, Refs: refs(d[6])}, "NackOK nacked=1 dead=0 notheld=[]"},
			{&protocol.Nack{Delay: time.Hour, Refs: refs(d[6])}, "NackOK nacked=0 dead=0 notheld=[d6]"},
		}
	}
	const n = 7
	for _, together := range []bool{false, true} {
		topic := fmt.Sprint("mixed-together-", together)
		c := e.dial(nil)
		c.publish(topic, "0", "1", "2", "3", "4", "5", "6")
		c.subscribe(&protocol.Subscribe{Topic: topic, MaxInFlight: n})
		ds := c.deliveriesN(n)
		steps := script(ds)
		got := make([]string, len(steps))
		if together {
			reqs := make([]protocol.Message, len(steps))
			for i, s := range steps {
				reqs[i] = s.req
			}
			corrs := c.pipeline(reqs...)
			answers := c.responses(corrs)
			for i, corr := range corrs {
				got[i] = answerSummary(ds, answers[corr])
			}
		} else {
			for i, s := range steps {
				got[i] = answerSummary(ds, c.request(s.req))
			}
		}
		last := len(steps) - 2
		if together && got[last] < got[last+1] {
			got[last], got[last+1] = got[last+1], got[last] // either order (see the test comment)
		}
		for i, s := range steps {
			if got[i] != s.want {
				t.Errorf("together=%v: answer to request %d (%s): %s, want %s", together, i, s.req.Opcode(), got[i], s.want)
			}
		}
		// d3 and d6 wait for redelivery, d5 is dead-lettered, the others are done.
		if st := e.groupStats(topic, ""); st.Pending != 2 || st.InFlight != 0 || st.DeadLettered != 1 {
			t.Errorf("together=%v: stats %+v, want 2 pending, none in flight, 1 dead-lettered", together, st)
		}
	}
}

// answerSummary renders an answer to Ack, Nack or Extend, naming refs by their index in ds.
func answerSummary(ds []protocol.Delivery, m protocol.ServerMessage) string {
	names := func(rs []protocol.Ref) string {
		var out []string
		for _, r := range rs {
			name := fmt.Sprintf("%d:%d:%d", r.SubscriptionID, r.Partition, r.Offset)
			for i, d := range ds {
				if d.SubscriptionID == r.SubscriptionID && d.Partition == r.Partition && d.Offset == r.Offset {
					name = fmt.Sprint("d", i)
				}
			}
			out = append(out, name)
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	switch m := m.(type) {
	case *protocol.AckOK:
		return fmt.Sprintf("AckOK acked=%d done=%d unknown=%s", m.Acked, m.AlreadyDone, names(m.Unknown))
	case *protocol.NackOK:
		return fmt.Sprintf("NackOK nacked=%d dead=%d notheld=%s", m.Nacked, m.DeadLettered, names(m.NotHeld))
	case *protocol.ExtendOK:
		return fmt.Sprintf("ExtendOK extended=%d notheld=%s", m.Extended, names(m.NotHeld))
	}
	return fmt.Sprintf("%T %v", m, m)
}

// TestNackGoesToAnotherMember: a nacked delivery is redelivered at once to the other member of the
// group, with the next attempt number.
func TestNackGoesToAnotherMember(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	a, b := e.dial(nil), e.dial(nil)
	a.subscribe(&protocol.Subscribe{Topic: "jobs", Group: "workers", MemberID: "a"})
	a.publish("jobs", "job-1")
	d := a.deliveriesN(1)[0]
	b.subscribe(&protocol.Subscribe{Topic: "jobs", Group: "workers", MemberID: "b"})
	nack := expectOK[*protocol.NackOK](a, &protocol.Nack{Reason: "busy", Refs: refs(d)})
	if nack.Nacked != 1 || nack.DeadLettered != 0 || len(nack.NotHeld) != 0 {
		t.Fatalf("NackOK = %+v", nack)
	}
	got := b.deliveriesN(1)[0]
	if got.Offset != d.Offset || got.Attempt != 2 || string(got.Payload) != "job-1" {
		t.Fatalf("b got %+v, want job-1 attempt 2", got)
	}
	// a no longer holds it.
	if nack := expectOK[*protocol.NackOK](a, &protocol.Nack{Refs: refs(d)}); len(nack.NotHeld) != 1 {
		t.Fatalf("second NackOK = %+v", nack)
	}
	// to_dlq dead-letters.
	if nack := expectOK[*protocol.NackOK](b, &protocol.Nack{ToDLQ: true, Reason: "poison", Refs: refs(got)}); nack.DeadLettered != 1 {
		t.Fatalf("NackOK to_dlq = %+v", nack)
	}
	if st := e.groupStats("jobs", ""); st.DeadLettered != 1 || st.Pending != 0 {
		t.Fatalf("stats after to_dlq: %+v", st)
	}
}

// TestCreditRespected: the server never leaves more unsettled deliveries on a handle than its
// credit; settling and Credit frames let more through.
func TestCreditRespected(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	c := e.dial(nil)
	var payloads []string
	for i := range 6 {
		payloads = append(payloads, fmt.Sprint(i))
	}
	c.publish("credit", payloads...)
	sub := c.subscribe(&protocol.Subscribe{Topic: "credit", MemberID: "m", MaxInFlight: 2})

	first := c.deliveriesN(2)
	checkDelivered := func(want int64) {
		t.Helper()
		// A round trip after the broker counted the deliveries: nothing more is on its way.
		eventually(t, "member deliveries", func() error {
			info, err := e.memberInfo("m")
			if err != nil {
				return err
			}
			if info.Delivered < want {
				return fmt.Errorf("delivered %d, want %d", info.Delivered, want)
			}
			return nil
		})
		c.request(&protocol.Heartbeat{Time: time.Now()})
		if info, _ := e.memberInfo("m"); info.Delivered != want || len(c.deliveries) != 0 {
			t.Fatalf("delivered %d (client has %d extra), want %d", info.Delivered, len(c.deliveries), want)
		}
	}
	checkDelivered(2)

	// Credit raises the handle's credit by 1: one more.
	c.send(&protocol.Credit{Handle: sub.Handle, Additional: 1})
	third := c.deliveriesN(1)
	checkDelivered(3)

	// Acking settles: credit 3, 3 unsettled left -> 3 more (the rest).
	expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(append(first, third...)...)})
	rest := c.deliveriesN(3)
	checkDelivered(6)
	got := payloadsOf(append(append(first, third...), rest...))
	if strings.Join(got, "") != "012345" {
		t.Fatalf("got %v", got)
	}

	// Credit errors: an unknown handle, and the cap.
	corr := c.send(&protocol.Credit{Handle: 99, Additional: 1})
	if e := c.response(corr).(*protocol.Error); e.Code != protocol.CodeUnknownHandle {
		t.Fatalf("Credit on an unknown handle: %v", e)
	}
	corr = c.send(&protocol.Credit{Handle: sub.Handle, Additional: broker.MaxInFlightLimit})
	if e := c.response(corr).(*protocol.Error); e.Code != protocol.CodeInvalidArgument {
		t.Fatalf("Credit over the cap: %v", e)
	}
}

// TestSessionTimeoutReleasesLeases: a member that stops sending frames is closed after its session
// timeout with SESSION_TIMEOUT, and its lease goes to another member at once (not after the 30 s
// ack_wait).
func TestSessionTimeoutReleasesLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MinHeartbeatInterval = 10 * time.Millisecond }, nil)
	silent := e.dial(&protocol.Hello{HeartbeatInterval: 50 * time.Millisecond})
	if silent.hello.SessionTimeout != 150*time.Millisecond {
		t.Fatalf("session timeout %s", silent.hello.SessionTimeout)
	}
	silent.subscribe(&protocol.Subscribe{Topic: "hb", Group: "g", MemberID: "silent"})
	silent.publish("hb", "work")
	d := silent.deliveriesN(1)[0]

	// The silent member sends nothing more. Another member joins the group.
	live := e.dial(nil)
	live.subscribe(&protocol.Subscribe{Topic: "hb", Group: "g", MemberID: "live"})
	got := live.deliveriesN(1)[0]
	if got.Offset != d.Offset || got.Attempt != 2 {
		t.Fatalf("live got %+v, want the silent member's message with attempt 2", got)
	}
	frames := silent.expectClosed()
	if last, ok := frames[len(frames)-1].(*protocol.Error); !ok || last.Code != protocol.CodeSessionTimeout {
		t.Fatalf("silent member read %v, want Error SESSION_TIMEOUT last", frames)
	}
	if e.srv.Stats().SessionTimeouts != 1 {
		t.Fatalf("stats: %+v", e.srv.Stats())
	}
}

// TestServerHeartbeats: a silent server sends Heartbeat every interval, and a client that only
// answers them stays connected (any frame is a sign of life).
func TestServerHeartbeats(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MinHeartbeatInterval = 10 * time.Millisecond }, nil)
	c := e.dial(&protocol.Hello{HeartbeatInterval: 100 * time.Millisecond})
	for i := 0; i < 3; {
		corr, m := c.read()
		hb, ok := m.(*protocol.Heartbeat)
		if !ok {
			t.Fatalf("got %T, want Heartbeat", m)
		}
		if corr == 0 || hb.Time.IsZero() {
			t.Fatalf("Heartbeat corr %d %+v", corr, hb)
		}
		c.sendCorr(corr, &protocol.HeartbeatOK{Echo: hb.Time, Time: time.Now()})
		i++
	}
	c.publish("alive", "yes")
}

// TestBadFramesCloseOnlyThatConnection: a malformed header, an oversize frame and a bad preamble
// close their own connection (with an Error first for the first two); a bad body is answered and
// the session goes on; every other connection keeps working.
func TestBadFramesCloseOnlyThatConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxFrameSize = protocol.MinMaxFrameSize }, nil)
	bystander := e.dial(nil)
	bystander.subscribe(&protocol.Subscribe{Topic: "bad.frames"})

	header := func(length uint32, op protocol.Opcode, corr uint32) []byte {
		var h [12]byte
		binary.BigEndian.PutUint32(h[0:], length)
		binary.BigEndian.PutUint16(h[4:], uint16(op))
		binary.BigEndian.PutUint32(h[8:], corr)
		return h[:]
	}
	t.Run("malformed header", func(t *testing.T) {
		c := e.dial(nil)
		if _, err := c.nc.Write(header(3, protocol.OpPublish, 7)); err != nil {
			t.Fatal(err)
		}
		got := c.expectClosed()
		if len(got) != 1 || got[0].(*protocol.Error).Code != protocol.CodeMalformedFrame {
			t.Fatalf("got %v, want one MALFORMED_FRAME", got)
		}
	})
	t.Run("oversize frame", func(t *testing.T) {
		c := e.dial(nil)
		if c.hello.MaxFrameSize != protocol.MinMaxFrameSize {
			t.Fatalf("max frame size %d", c.hello.MaxFrameSize)
		}
		if _, err := c.nc.Write(header(1<<30, protocol.OpPublish, 8)); err != nil {
			t.Fatal(err)
		}
		got := c.expectClosed()
		if len(got) != 1 {
			t.Fatalf("got %v, want one FRAME_TOO_LARGE", got)
		}
		if pe := got[0].(*protocol.Error); pe.Code != protocol.CodeFrameTooLarge {
			t.Fatalf("got %v, want FRAME_TOO_LARGE", pe)
		}
	})
	t.Run("bad body keeps the session", func(t *testing.T) {
		c := e.dial(nil)
		body, _ := (&protocol.Publish{Topic: "bad.frames", Messages: []protocol.PublishMessage{{Payload: []byte("x")}}}).Encode(nil)
		body = append(body, 0xff) // trailing byte
		frame := append(header(uint32(8+len(body)), protocol.OpPublish, 9), body...)
		if _, err := c.nc.Write(frame); err != nil {
			t.Fatal(err)
		}
		if e := c.response(9).(*protocol.Error); e.Code != protocol.CodeMalformedFrame {
			t.Fatalf("got %v", e)
		}
		// An unknown opcode is answered too, and a server-only opcode is unexpected.
		if _, err := c.nc.Write(header(8, 0x3f, 10)); err != nil {
			t.Fatal(err)
		}
		if e := c.response(10).(*protocol.Error); e.Code != protocol.CodeUnknownOpcode {
			t.Fatalf("got %v", e)
		}
		c.expectErr(&protocol.Deliver{Deliveries: []protocol.Delivery{{Handle: 1}}}, protocol.CodeUnexpectedFrame)
		c.publish("bad.frames", "after")
	})
	t.Run("bad preamble", func(t *testing.T) {
		nc := e.dialRaw()
		if _, err := nc.Write([]byte{0, 'N', 'O', 'P', 0, 0, 0, 8}); err != nil {
			t.Fatal(err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(waitTimeout))
		if b, _ := io.ReadAll(nc); len(b) != 0 {
			t.Fatalf("bad preamble answered %q", b)
		}
	})

	bystander.publish("bad.frames", "still here")
	ds := bystander.deliveriesN(2)
	if got := strings.Join(payloadsOf(ds), ","); got != "after,still here" {
		t.Fatalf("bystander got %s", got)
	}
	if st := e.srv.Stats(); st.ClosedByError != 3 {
		t.Fatalf("stats %+v, want 3 connections closed by error", st)
	}
}

// TestErrorCodesOnTheWire checks that broker errors reach the client with their codes.
func TestErrorCodesOnTheWire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(c *broker.Config) { c.DisableAutoCreate = true })
	c := e.dial(nil)
	msg := func(payload []byte) []protocol.PublishMessage {
		return []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: payload}}
	}
	c.expectErr(&protocol.Publish{Topic: "missing", Messages: msg([]byte("x"))}, protocol.CodeTopicNotFound)
	c.expectErr(&protocol.Publish{Topic: "bad..name", Messages: msg([]byte("x"))}, protocol.CodeInvalidArgument)
	if _, err := e.b.CreateTopic(context.Background(), "small", storage.TopicConfig{MaxMessageBytes: 10}); err != nil {
		t.Fatal(err)
	}
	c.expectErr(&protocol.Publish{Topic: "small", Messages: msg(bytes.Repeat([]byte("x"), 11))}, protocol.CodeMessageTooLarge)
	if e := c.expectErr(&protocol.Subscribe{Topic: "small", Mode: protocol.GroupOrdered, Group: "g"}, protocol.CodeInvalidArgument); !strings.Contains(e.Message, "QUEUE topic") {
		t.Fatalf("ordered: %q", e.Message)
	}
	c.expectErr(&protocol.Subscribe{Topic: "small.#.x"}, protocol.CodeInvalidArgument)
	c.expectErr(&protocol.Subscribe{Topic: "small", Start: protocol.StartPosition{Kind: protocol.StartFromMessageID, MessageID: "x:y"}}, protocol.CodeInvalidArgument)
	c.expectErr(&protocol.Subscribe{Topic: "small", LeaseDuration: 48 * time.Hour}, protocol.CodeInvalidArgument)
	c.expectErr(&protocol.Subscribe{Topic: "small", MaxInFlight: broker.MaxInFlightLimit + 1}, protocol.CodeInvalidArgument)
	c.expectErr(&protocol.Unsubscribe{Handle: 42}, protocol.CodeUnknownHandle)
	// A request with correlation id 0 is refused with correlation id 0.
	c.sendCorr(0, &protocol.Publish{Topic: "small", Messages: msg([]byte("x"))})
	if e := c.response(0).(*protocol.Error); e.Code != protocol.CodeUnexpectedFrame {
		t.Fatalf("corr 0: %v", e)
	}
	c.publish("small", "ok")
}

// TestSubscriptionEnded: cancelling a group or deleting a topic tells the handle which
// subscription ended and why; the handle stays open for topics created later.
func TestSubscriptionEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	c := e.dial(nil)
	for _, topic := range []string{"end.a", "end.b"} {
		if _, err := e.b.CreateTopic(ctx, topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
			t.Fatal(err)
		}
	}
	sub := c.subscribe(&protocol.Subscribe{Topic: "end.*", Group: "g"})
	if len(sub.Subscriptions) != 2 {
		t.Fatalf("SubscribeOK = %+v", sub)
	}
	if _, err := e.b.CancelGroup(ctx, "end.a", "g"); err != nil {
		t.Fatal(err)
	}
	if err := e.b.DeleteTopic(ctx, "end.b", true); err != nil {
		t.Fatal(err)
	}
	for len(c.ended) < 2 {
		corr, m := c.read()
		c.keep(corr, m)
	}
	codes := map[string]uint16{}
	for _, se := range c.ended {
		if se.Handle != sub.Handle || se.SubscriptionID == 0 {
			t.Fatalf("SubscriptionEnded = %+v", se)
		}
		codes[se.Topic] = se.Code
	}
	if codes["end.a"] != protocol.CodeSubNotActive || codes["end.b"] != protocol.CodeTopicNotFound {
		t.Fatalf("ended codes %v", codes)
	}
	// The handle still gets topics created later.
	c.publish("end.c", "new")
	if d := c.deliveriesN(1)[0]; d.Topic != "end.c" || d.Handle != sub.Handle {
		t.Fatalf("delivery %+v", d)
	}
}

// TestGoodbye covers both directions: a client Goodbye releases its leases at once; the server's
// Goodbye (Stop) stops deliveries but accepts acks until the client answers GoodbyeOK.
func TestGoodbye(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	a := e.dial(nil)
	a.subscribe(&protocol.Subscribe{Topic: "bye", Group: "g", MemberID: "a"})
	a.publish("bye", "one", "two")
	a.deliveriesN(2)
	if _, ok := a.request(&protocol.Goodbye{}).(*protocol.GoodbyeOK); !ok {
		t.Fatal("no GoodbyeOK")
	}
	a.expectClosed()

	b := e.dial(nil)
	b.subscribe(&protocol.Subscribe{Topic: "bye", Group: "g", MemberID: "b"})
	ds := b.deliveriesN(2) // released at once by a's Goodbye
	if ds[0].Attempt != 2 {
		t.Fatalf("b got %+v", ds[0])
	}

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		stopped <- e.srv.Stop(ctx)
	}()
	var bye uint32
	for bye == 0 {
		corr, m := b.read()
		if g, ok := m.(*protocol.Goodbye); ok {
			if g.Code != protocol.CodeClosed {
				t.Fatalf("Goodbye %+v", g)
			}
			bye = corr
			continue
		}
		b.keep(corr, m)
	}
	if ack := expectOK[*protocol.AckOK](b, &protocol.Ack{Refs: refs(ds...)}); ack.Acked != 2 {
		t.Fatalf("AckOK during the grace period = %+v", ack)
	}
	b.sendCorr(bye, &protocol.GoodbyeOK{})
	b.expectClosed()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if st := e.groupStats("bye", ""); st.Pending != 0 {
		t.Fatalf("pending after acks in the grace period: %d", st.Pending)
	}
}

// TestConnectionLimit: over MaxConnections a binary client gets OVERLOADED after the preamble, a
// text client an ERR line; both are closed.
func TestConnectionLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxConnections = 1 }, nil)
	first := e.dial(nil)
	_, err := e.tryDial(nil)
	if pe := protocol.AsError(err); pe == nil || pe.Code != protocol.CodeOverloaded || pe.RetryAfter != time.Second {
		t.Fatalf("second binary connection: %v", err)
	}
	tc := e.dialText()
	tc.send("PING")
	if l := tc.expect("ERR OVERLOADED"); !strings.Contains(l, "max 1") {
		t.Fatalf("text: %q", l)
	}
	tc.expectEOF()
	first.publish("limit", "ok")
	if st := e.srv.Stats(); st.Rejected != 2 || st.Open != 1 || st.Binary != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestManyConnections: 1,000 concurrent connections each complete a handshake and a publish.
func TestManyConnections(t *testing.T) {
	t.Parallel()
	raiseFileLimit(t, 4096)
	e := newEnv(t, nil, nil)
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	opened := make(chan *bclient, n)
	for i := range n {
		wg.Go(func() {
			c, err := e.tryDial(&protocol.Hello{ClientName: fmt.Sprintf("c%d", i)})
			if err != nil {
				errs <- err
				return
			}
			opened <- c
			_ = c.nc.SetDeadline(time.Now().Add(waitTimeout))
			m := &protocol.Publish{Topic: "many", Messages: []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: fmt.Appendf(nil, "%d", i)}}}
			if err := c.w.WriteMessage(2, m); err != nil {
				errs <- err
				return
			}
			if err := c.w.Flush(); err != nil {
				errs <- err
				return
			}
			if _, resp, err := c.r.ReadServerMessage(); err != nil {
				errs <- err
			} else if _, ok := resp.(*protocol.PublishOK); !ok {
				errs <- fmt.Errorf("connection %d: %v", i, resp)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := e.srv.Stats(); st.Open != n || st.Binary != n {
		t.Fatalf("stats with every connection open: %+v", st)
	}
	info, err := e.b.Topic(context.Background(), "many")
	if err != nil {
		t.Fatal(err)
	}
	if info.Stats.Messages != n {
		t.Fatalf("topic has %d messages, want %d", info.Stats.Messages, n)
	}
	close(opened)
	for c := range opened {
		c.nc.Close()
	}
	eventually(t, "connections closed", func() error {
		if st := e.srv.Stats(); st.Open != 0 {
			return fmt.Errorf("%d open", st.Open)
		}
		return nil
	})
}

// TestSubscriptionsPerConnectionBounded: a connection past max_subscriptions_per_connection gets
// LIMIT_EXCEEDED and no member; unsubscribing makes room again. Text sessions share the bound.
func TestSubscriptionsPerConnectionBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxSubscriptionsPerConn = 2 }, nil)
	c := e.dial(nil)
	first := c.subscribe(&protocol.Subscribe{Topic: "bound.a"})
	c.subscribe(&protocol.Subscribe{Topic: "bound.b"})
	members := len(e.b.Members())
	if pe := c.expectErr(&protocol.Subscribe{Topic: "bound.c"}, protocol.CodeLimitExceeded); !strings.Contains(pe.Message, "max_subscriptions_per_connection") {
		t.Fatalf("error %v", pe)
	}
	if n := len(e.b.Members()); n != members {
		t.Fatalf("members %d after the refused subscribe, want %d", n, members)
	}
	if _, ok := c.request(&protocol.Unsubscribe{Handle: first.Handle}).(*protocol.UnsubscribeOK); !ok {
		t.Fatal("unsubscribe failed")
	}
	c.subscribe(&protocol.Subscribe{Topic: "bound.c"})

	tc := e.dialText()
	tc.send("SUBSCRIBE bound.a", "SUBSCRIBE bound.b")
	tc.expect("OK subscribed bound.a")
	tc.expect("OK subscribed bound.b")
	tc.send("SUBSCRIBE bound.c")
	tc.expect("ERR LIMIT_EXCEEDED this connection has 2 subscriptions open")
}

package server

import (
	"context"
	"fmt"
	"github.com/spoolmq/spool/internal/testutil"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// pipeline writes the requests in one flush without waiting and returns their correlation ids.
func (c *bclient) pipeline(ms ...protocol.Message) []uint32 {
	c.t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	corrs := make([]uint32, len(ms))
	for i, m := range ms {
		c.corr++
		corrs[i] = c.corr
		if err := c.w.WriteMessage(c.corr, m); err != nil {
			c.t.Fatalf("write %s: %v", m.Opcode(), err)
		}
	}
	if err := c.w.Flush(); err != nil {
		c.t.Fatalf("flush: %v", err)
	}
	return corrs
}

// responses reads until every correlation id of corrs was answered and returns the answers by id;
// it fails on an id answered twice.
func (c *bclient) responses(corrs []uint32) map[uint32]protocol.ServerMessage {
	c.t.Helper()
	want := make(map[uint32]bool, len(corrs))
	for _, id := range corrs {
		want[id] = true
	}
	got := make(map[uint32]protocol.ServerMessage, len(corrs))
	for len(got) < len(corrs) {
		corr, m := c.read()
		if !want[corr] || !m.Opcode().IsResponse() {
			c.keep(corr, m)
			continue
		}
		if _, dup := got[corr]; dup {
			c.t.Fatalf("correlation id %d answered twice", corr)
		}
		got[corr] = m
	}
	return got
}

func pub(topic string, payloads ...string) *protocol.Publish {
	msgs := make([]protocol.PublishMessage, len(payloads))
	for i, p := range payloads {
		msgs[i] = protocol.PublishMessage{Partition: protocol.PartitionAuto, Payload: []byte(p)}
	}
	return &protocol.Publish{Topic: topic, Messages: msgs}
}

// TestPipelinedPublishesTwoTopicsKeepOrder: publishes of one connection to two topics, with
// batches of several messages and acks in between, all sent without waiting. Each topic's
// messages are stored in the order sent, gapless, each request answered once with its own
// positions; the acks are answered too.
func TestPipelinedPublishesTwoTopicsKeepOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	c := e.dial(nil)
	// Something to ack on the same connection while the publishes are in flight.
	c.subscribe(&protocol.Subscribe{Topic: "acked", MaxInFlight: 1000})
	c.publish("acked", "x", "y")
	ds := c.deliveriesN(2)

	const rounds = 300
	type sent struct {
		topic string
		first int // index of the request's first message among its topic's messages
		n     int
	}
	var reqs []protocol.Message
	var meta []sent
	next := map[string]int{}
	for i := range rounds {
		topic := "order.a"
		if i%3 == 1 {
			topic = "order.b"
		}
		n := 1 + i%4
		payloads := make([]string, n)
		for j := range payloads {
			payloads[j] = fmt.Sprintf("%s-%d", topic, next[topic]+j)
		}
		reqs = append(reqs, pub(topic, payloads...))
		meta = append(meta, sent{topic: topic, first: next[topic], n: n})
		next[topic] += n
		if i == rounds/2 {
			reqs = append(reqs, &protocol.Ack{Refs: refs(ds...)})
			meta = append(meta, sent{})
		}
	}
	corrs := c.pipeline(reqs...)
	got := c.responses(corrs)
	for i, corr := range corrs {
		m := got[corr]
		if meta[i].topic == "" {
			if ack, ok := m.(*protocol.AckOK); !ok || ack.Acked != 2 {
				t.Fatalf("ack answered %T %v", m, m)
			}
			continue
		}
		ok, isOK := m.(*protocol.PublishOK)
		if !isOK || len(ok.Positions) != meta[i].n {
			t.Fatalf("request %d (%+v) answered %T %v", i, meta[i], m, m)
		}
		for j, p := range ok.Positions {
			if p.Offset != int64(meta[i].first+j) {
				t.Fatalf("request %d message %d: offset %d, want %d", i, j, p.Offset, meta[i].first+j)
			}
		}
	}
	// The stored order is the sent order.
	for topic, n := range next {
		r := c.subscribe(&protocol.Subscribe{Topic: topic, MaxInFlight: uint32(n), Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
		var got []string
		for _, d := range c.deliveriesN(n) {
			if d.Handle != r.Handle {
				t.Fatalf("delivery of handle %d, want %d", d.Handle, r.Handle)
			}
			got = append(got, string(d.Payload))
		}
		for i, p := range got {
			if want := fmt.Sprintf("%s-%d", topic, i); p != want {
				t.Fatalf("%s message %d = %q, want %q", topic, i, p, want)
			}
		}
	}
}

// TestPipelinedBadPublishFailsAlone: among publishes sent without waiting, a request with a
// message over the topic's max size and one with a partition out of range fail alone; their
// neighbours are stored in order.
func TestPipelinedBadPublishFailsAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	if _, err := e.b.CreateTopic(context.Background(), "small", storage.TopicConfig{MaxMessageBytes: 64}); err != nil {
		t.Fatal(err)
	}
	c := e.dial(nil)
	big := strings.Repeat("z", 100)
	bad := pub("small", "p")
	bad.Messages[0].Partition = 7
	reqs := []protocol.Message{pub("small", "a"), pub("small", "b"), pub("small", "c", big), pub("small", "d"), bad, pub("small", "e", "f")}
	wantCode := map[int]uint16{2: protocol.CodeMessageTooLarge, 4: protocol.CodeInvalidArgument}
	for range 20 { // many times, so that some rounds merge the requests
		corrs := c.pipeline(reqs...)
		got := c.responses(corrs)
		var offsets []int64
		for i, corr := range corrs {
			m := got[corr]
			if code, isBad := wantCode[i]; isBad {
				if pe, ok := m.(*protocol.Error); !ok || pe.Code != code {
					t.Fatalf("request %d answered %T %v, want code %d", i, m, m, code)
				}
				continue
			}
			ok, isOK := m.(*protocol.PublishOK)
			if !isOK {
				t.Fatalf("request %d answered %T %v", i, m, m)
			}
			for _, p := range ok.Positions {
				offsets = append(offsets, p.Offset)
			}
		}
		for i := 1; i < len(offsets); i++ {
			if offsets[i] != offsets[i-1]+1 {
				t.Fatalf("offsets %v are not consecutive in the order sent", offsets)
			}
		}
	}
}

// TestPublishRoundMerges runs one round of the publish stage on a batch built by hand, so that
// the merging is certain: the good requests of a topic are appended together in order, a bad one
// fails alone, another topic's requests keep their own order.
func TestPublishRoundMerges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	if _, err := e.b.CreateTopic(context.Background(), "merge", storage.TopicConfig{MaxMessageBytes: 64}); err != nil {
		t.Fatal(err)
	}
	sess := pipeSession(t, e)
	c := sess.c
	reqs := []pubReq{
		{corr: 1, msg: pub("merge", "a", "b")},
		{corr: 2, msg: pub("other", "x")},
		{corr: 3, msg: pub("merge", "c")},
		{corr: 4, msg: pub("merge", strings.Repeat("z", 100))},
		{corr: 5, msg: pub("other", "y")},
		{corr: 6, msg: pub("merge", "d", "e")},
	}
	for i := range reqs {
		reqs[i].start = time.Now()
	}
	c.pub.pending = len(reqs) // as queuePublish counts them
	sess.publishRound(reqs)
	// The engine's completions answer them.
	testutil.Eventually(t, 10*time.Second, "every request answered", func() error {
		if n, _ := c.pub.load(); n != 0 {
			return fmt.Errorf("%d not answered", n)
		}
		return nil
	})
	out, _ := c.take(true)
	if len(out) != len(reqs) {
		t.Fatalf("%d answers for %d requests", len(out), len(reqs))
	}
	want := map[uint32][]int64{1: {0, 1}, 3: {2}, 6: {3, 4}, 2: {0}, 5: {1}}
	times := map[uint32]time.Time{}
	for _, it := range out {
		if it.corr == 4 {
			if pe, ok := it.msg.(*protocol.Error); !ok || pe.Code != protocol.CodeMessageTooLarge {
				t.Fatalf("bad request answered %v", it.msg)
			}
			continue
		}
		ok, isOK := it.msg.(*protocol.PublishOK)
		if !isOK {
			t.Fatalf("request %d answered %v", it.corr, it.msg)
		}
		var got []int64
		for _, p := range ok.Positions {
			got = append(got, p.Offset)
		}
		times[it.corr] = ok.Positions[0].PublishTime
		if fmt.Sprint(got) != fmt.Sprint(want[it.corr]) {
			t.Fatalf("request %d: offsets %v, want %v", it.corr, got, want[it.corr])
		}
	}
	// The two requests to "other" went in one engine call: one append, one publish time.
	if !times[2].Equal(times[5]) {
		t.Fatalf("requests 2 and 5 were not appended together: %v and %v", times[2], times[5])
	}
	// The failed merged call stored nothing; the fallback stored each good request once.
	info, err := e.b.Topic(context.Background(), "merge")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.Stats.Messages; n != 5 {
		t.Fatalf("merge holds %d messages, want 5", n)
	}
}

// TestGoodbyeAfterPipelinedPublishes: GoodbyeOK comes after the answers of every publish sent
// before the Goodbye, and they are all stored.
func TestGoodbyeAfterPipelinedPublishes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	c := e.dial(nil)
	const n = 100
	reqs := make([]protocol.Message, 0, n+1)
	for i := range n {
		reqs = append(reqs, pub("bye.pipe", fmt.Sprint(i)))
	}
	reqs = append(reqs, &protocol.Goodbye{})
	corrs := c.pipeline(reqs...)
	answered := 0
	for _, m := range c.expectClosed() {
		switch m.(type) {
		case *protocol.PublishOK:
			answered++
		case *protocol.GoodbyeOK:
			if answered != n {
				t.Fatalf("GoodbyeOK after %d of %d publish answers", answered, n)
			}
			answered = -1
		default:
			t.Fatalf("unexpected %T %v", m, m)
		}
	}
	if answered != -1 {
		t.Fatalf("no GoodbyeOK (%d publish answers, %d requests)", answered, len(corrs))
	}
	info, err := e.b.Topic(context.Background(), "bye.pipe")
	if err != nil {
		t.Fatal(err)
	}
	if info.Stats.Messages != n {
		t.Fatalf("%d messages stored, want %d", info.Stats.Messages, n)
	}
}

// promptSpy records the Prompt hint of every MessagesAppend to one topic and passes the call on
// to the real engine.
type promptSpy struct {
	storage.Engine
	topic   string
	mu      sync.Mutex
	prompts []bool
}

func (s *promptSpy) MessagesAppend(ctx context.Context, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if p.Topic == s.topic {
		s.mu.Lock()
		s.prompts = append(s.prompts, p.Prompt)
		s.mu.Unlock()
	}
	return s.Engine.MessagesAppend(ctx, p)
}

// take returns the hints recorded since the last take.
func (s *promptSpy) take() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.prompts
	s.prompts = nil
	return p
}

// TestPublishPromptMarking: the server marks a Publish prompt (the engine may wait for it and its
// like before a commit round) only when a connection that publishes one request at a time and
// consumes nothing sends it within promptWithin of its last answer: never after a pause, never on a
// connection with a subscription.
func TestPublishPromptMarking(t *testing.T) {
	t.Parallel()
	spy := &promptSpy{topic: "prompt.t"}
	e := newEnv(t, nil, func(c *broker.Config) { spy.Engine = c.Engine; c.Engine = spy })
	c := e.dial(nil)
	c.publish("prompt.t", "first") // creates the topic
	spy.take()

	// After a pause longer than promptWithin: never prompt. The pause is the condition under
	// test, so it is slept; it is far longer than promptWithin because the connection's writer
	// records its last write when it gets to run, which a loaded machine (the full suite on two
	// cores) delays: with twice promptWithin one publish in five was seen prompt there.
	for range 5 {
		time.Sleep(50 * promptWithin)
		c.publish("prompt.t", "late")
	}
	if got := spy.take(); !slices.Equal(got, []bool{false, false, false, false, false}) {
		t.Fatalf("publishes after a pause marked %v, want none prompt", got)
	}

	// Right after the previous answer: prompt, unless this machine took longer than promptWithin
	// to send it; at least one of 50 must make it.
	for range 50 {
		c.publish("prompt.t", "quick")
	}
	if got := spy.take(); len(got) != 50 || !slices.Contains(got, true) {
		t.Fatalf("50 publishes right after their answers marked %v, want some prompt", got)
	}

	// A connection with a subscription is never prompt (its publishes go to the publish worker).
	c.subscribe(&protocol.Subscribe{Topic: "prompt.other", MaxInFlight: 1})
	for range 20 {
		c.publish("prompt.t", "subscribed")
	}
	if got := spy.take(); len(got) == 0 || slices.Contains(got, true) {
		t.Fatalf("publishes of a subscribed connection marked %v, want none prompt", got)
	}
}

// holdSpy passes every call on to the real engine; while holding, the completions of
// MessagesAppendAsync (the appends themselves are queued in the engine at once) wait until
// release, and each held append is signalled on heldNow.
type holdSpy struct {
	storage.Engine
	mu      sync.Mutex
	hold    chan struct{} // nil: not holding
	heldNow chan struct{}
}

func (s *holdSpy) MessagesAppendAsync(p *storage.MessagesAppendParams, done func(*storage.MessagesAppendResult, error)) error {
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	ae := s.Engine.(storage.AsyncAppender)
	if hold == nil {
		return ae.MessagesAppendAsync(p, done)
	}
	return ae.MessagesAppendAsync(p, func(res *storage.MessagesAppendResult, err error) {
		s.heldNow <- struct{}{}
		go func() {
			<-hold
			done(res, err)
		}()
	})
}

// TestPublishWorkerDoesNotWaitForItsAppends: the publish worker hands its appends to the engine
// and goes on: a Publish that arrives while the previous ones wait for their commit is appended
// at once (with one goroutine publishing through the connection after another, the next round
// does not wait for the worker), after them, and the engine's completions answer each.
func TestPublishWorkerDoesNotWaitForItsAppends(t *testing.T) {
	t.Parallel()
	spy := &holdSpy{heldNow: make(chan struct{}, 8)}
	e := newEnv(t, nil, func(c *broker.Config) { spy.Engine = c.Engine; c.Engine = spy })
	c := e.dial(nil)
	first := c.publish("worker.t", "m0").Positions[0].Offset // creates the topic

	release := make(chan struct{})
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll) // before the server closes, also when the test fails
	spy.mu.Lock()
	spy.hold = release
	spy.mu.Unlock()
	held := func(what string) {
		t.Helper()
		select {
		case <-spy.heldNow:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never reached the engine", what)
		}
	}
	// Two publishes in one write go to the worker (the first sees the second behind it).
	corrs := c.pipeline(pub("worker.t", "m1"), pub("worker.t", "m2"))
	held("the first round")
	corrs = append(corrs, c.pipeline(pub("worker.t", "m3"))...)
	held("a publish sent while the first round waits for its commit")
	releaseAll()
	got := c.responses(corrs)
	for i, corr := range corrs {
		ok, isOK := got[corr].(*protocol.PublishOK)
		if !isOK || ok.Positions[0].Offset != first+1+int64(i) {
			t.Fatalf("answer to publish %d: %#v, want offset %d", i, got[corr], first+1+int64(i))
		}
	}
}

// pipeSession returns a binary session of the server over an in-memory pipe (nothing reads its
// peer end); both end with the test.
func pipeSession(t *testing.T, e *env) *binarySession {
	t.Helper()
	a, b := net.Pipe()
	c := newConn(e.srv, a)
	t.Cleanup(func() {
		c.cancel()
		a.Close()
		b.Close()
	})
	return &binarySession{c: c}
}

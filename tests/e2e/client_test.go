package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/client"
)

// Tests of the Go client (package client) against the real binary: the client's own integration
// tests run the broker in-process; these run `spool serve` as a separate process.

// createTopic creates a topic through the running broker's admin API (POST /api/v1/topics);
// config holds the topic's configuration fields ("semantics", "ack_wait", ...).
func (b *broker) createTopic(name string, config map[string]any) {
	b.t.Helper()
	body := map[string]any{"name": name}
	for k, v := range config {
		body[k] = v
	}
	raw, err := json.Marshal(body)
	if err != nil {
		b.t.Fatal(err)
	}
	c := http.Client{Timeout: waitTimeout}
	resp, err := c.Post("http://"+b.http+"/api/v1/topics", "application/json", bytes.NewReader(raw))
	if err != nil {
		b.t.Fatalf("create topic %s: %v", name, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		b.t.Fatalf("create topic %s: %d %s", name, resp.StatusCode, answer)
	}
}

// getJSON fetches an HTTP path of the broker and decodes its JSON body into v.
func (b *broker) getJSON(path string, v any) error {
	code, body := b.get(path)
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		return fmt.Errorf("GET %s: %w in %s", path, err, body)
	}
	return nil
}

// groupStats is the part of the admin API's group JSON these tests read.
type groupStats struct {
	Topic        string `json:"topic"`
	Group        string `json:"group"`
	MemberCount  int    `json:"member_count"`
	Pending      int64  `json:"pending"`
	InFlight     int64  `json:"in_flight"`
	Redelivering int64  `json:"redelivering"`
}

// waitSettled waits until every subscription of topic has nothing pending, in flight or waiting
// for redelivery: every message was acked.
func (b *broker) waitSettled(topic string) {
	b.t.Helper()
	eventually(b.t, "every message of "+topic+" acked", func() error {
		var list struct {
			Groups []groupStats `json:"groups"`
		}
		if err := b.getJSON("/api/v1/groups?topic="+url.QueryEscape(topic), &list); err != nil {
			return err
		}
		if len(list.Groups) == 0 {
			return fmt.Errorf("topic %s has no subscription", topic)
		}
		for _, g := range list.Groups {
			if g.Pending != 0 || g.InFlight != 0 || g.Redelivering != 0 {
				return fmt.Errorf("group %+v", g)
			}
		}
		return nil
	})
}

// dialClient connects a client to the broker; the test's cleanup closes it.
func (b *broker) dialClient(opts ...client.Opt) *client.Client {
	b.t.Helper()
	c, err := client.Dial(ctx(b.t), b.tcp, opts...)
	if err != nil {
		b.t.Fatalf("dial %s: %v", b.tcp, err)
	}
	b.t.Cleanup(func() { closeClient(b.t, c) })
	return c
}

// closeClient closes c within waitTimeout (a second Close is a no-op).
func closeClient(t *testing.T, c *client.Client) {
	t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := c.Close(cx); err != nil {
		t.Errorf("close client: %v", err)
	}
}

// subscribe subscribes c and fails the test on error.
func subscribe(t *testing.T, c *client.Client, p client.SubscribeParams, h client.Handler, opts ...client.SubscribeOpt) *client.Subscription {
	t.Helper()
	s, err := c.Subscribe(ctx(t), p, h, opts...)
	if err != nil {
		t.Fatalf("subscribe %+v: %v", p, err)
	}
	return s
}

// publishPayloads publishes one message per payload with the client, one request each.
func publishPayloads(t *testing.T, c *client.Client, topic string, payloads []string) {
	t.Helper()
	cx := ctx(t)
	for _, p := range payloads {
		if _, err := c.Publish(cx, topic, client.Message{Payload: []byte(p)}); err != nil {
			t.Fatalf("publish %s to %s: %v", p, topic, err)
		}
	}
}

// payloads returns prefix-1 .. prefix-n.
func payloads(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i+1)
	}
	return out
}

// received collects the deliveries handled by a set of consumers, by consumer, and signals when
// a number of distinct payloads arrived.
type received struct {
	mu     sync.Mutex
	counts []map[string]int // per consumer: payload -> deliveries
	all    map[string]int   // payload -> deliveries over all consumers
	want   int
	full   chan struct{}
}

func newReceived(consumers, want int) *received {
	r := &received{counts: make([]map[string]int, consumers), all: map[string]int{}, want: want, full: make(chan struct{})}
	for i := range r.counts {
		r.counts[i] = map[string]int{}
	}
	return r
}

// handler returns the handler of consumer i: it records the delivery and acks it (nil return).
func (r *received) handler(i int) client.Handler {
	return func(_ context.Context, d *client.Delivery) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.counts[i][string(d.Payload)]++
		r.all[string(d.Payload)]++
		if len(r.all) == r.want {
			select {
			case <-r.full:
			default:
				close(r.full)
			}
		}
		return nil
	}
}

// wait waits until want distinct payloads arrived.
func (r *received) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.full:
	case <-time.After(waitTimeout):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("%s: %d of %d distinct payloads arrived", what, len(r.all), r.want)
	}
}

// recvDelivery receives from ch within waitTimeout.
func recvDelivery[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// TestClientFanOutToGroups: on a PUB_SUB topic, each of three groups (one subscriber each)
// receives every one of 100 messages exactly once, and acks them all.
func TestClientFanOutToGroups(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	b.createTopic("fanout", map[string]any{"semantics": "PUB_SUB"})
	const groups, n = 3, 100
	rs := make([]*received, groups)
	for g := range groups {
		rs[g] = newReceived(1, n)
		c := b.dialClient(client.ClientName(fmt.Sprintf("fanout-%d", g)))
		subscribe(t, c, client.SubscribeParams{Topic: "fanout", Group: fmt.Sprintf("group-%d", g)}, rs[g].handler(0))
	}
	pub := b.dialClient(client.ClientName("publisher"))
	want := payloads("msg", n)
	publishPayloads(t, pub, "fanout", want)

	for g, r := range rs {
		r.wait(t, fmt.Sprintf("group-%d", g))
	}
	// Once nothing is pending nothing can be redelivered: the counts are final.
	b.waitSettled("fanout")
	for g, r := range rs {
		r.mu.Lock()
		for _, p := range want {
			if k := r.all[p]; k != 1 {
				t.Errorf("group-%d received %s %d times", g, p, k)
			}
		}
		if len(r.all) != n {
			t.Errorf("group-%d received %d distinct payloads, want %d", g, len(r.all), n)
		}
		r.mu.Unlock()
	}
	var list struct {
		Groups []groupStats `json:"groups"`
	}
	if err := b.getJSON("/api/v1/groups?topic=fanout", &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Groups) != groups {
		t.Fatalf("topic fanout has subscriptions %+v, want the %d groups", list.Groups, groups)
	}
}

// TestClientCompetingMembers: two clients in the same group of a QUEUE topic share 100 messages,
// each message to exactly one of them, and both get some.
func TestClientCompetingMembers(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	b.createTopic("work", map[string]any{"semantics": "QUEUE"})
	const n = 100
	r := newReceived(2, n)
	for i := range 2 {
		c := b.dialClient(client.ClientName(fmt.Sprintf("worker-%d", i)))
		subscribe(t, c, client.SubscribeParams{Topic: "work", Group: "workers"}, r.handler(i))
	}
	pub := b.dialClient(client.ClientName("publisher"))
	want := payloads("job", n)
	publishPayloads(t, pub, "work", want)

	r.wait(t, "the workers")
	b.waitSettled("work")
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range want {
		if k := r.all[p]; k != 1 {
			t.Errorf("%s delivered %d times (worker 0: %d, worker 1: %d)", p, k, r.counts[0][p], r.counts[1][p])
		}
	}
	for i, m := range r.counts {
		if len(m) == 0 {
			t.Errorf("worker %d received nothing", i)
		}
	}
	t.Logf("split: %d / %d", len(r.counts[0]), len(r.counts[1]))
}

// TestClientNackRedeliveredToOtherMember: a member whose handler returns an error nacks the
// delivery; the broker redelivers the message at once to the other member of the group, with
// attempt 2.
func TestClientNackRedeliveredToOtherMember(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	b.createTopic("nacks", map[string]any{"semantics": "QUEUE"})
	type event struct {
		member  int
		attempt int
		payload string
	}
	nacked, handled := make(chan event, 4), make(chan event, 4)
	errRefused := errors.New("refused by the test")
	for i := range 2 {
		c := b.dialClient(client.ClientName(fmt.Sprintf("member-%d", i)))
		// Whichever member gets the message first (member A) nacks it.
		subscribe(t, c, client.SubscribeParams{Topic: "nacks", Group: "g"}, func(_ context.Context, d *client.Delivery) error {
			ev := event{member: i, attempt: d.Attempt, payload: string(d.Payload)}
			if d.Attempt == 1 {
				nacked <- ev
				return errRefused
			}
			handled <- ev
			return nil
		})
	}
	pub := b.dialClient()
	publishPayloads(t, pub, "nacks", []string{"nack-me"})

	a := recvDelivery(t, nacked, "the first delivery")
	again := recvDelivery(t, handled, "the redelivery after the nack")
	if again.payload != "nack-me" || again.attempt != 2 || again.member == a.member {
		t.Fatalf("member %d nacked %q; then member %d got %q with attempt %d, want the other member with attempt 2",
			a.member, a.payload, again.member, again.payload, again.attempt)
	}
	b.waitSettled("nacks")
	select {
	case ev := <-nacked:
		t.Fatalf("unexpected second first-attempt delivery %+v", ev)
	case ev := <-handled:
		t.Fatalf("unexpected further delivery %+v", ev)
	default:
	}
}

// TestClientKilledMemberRedelivered: a member of a group that is a separate process (spool sub
// --ack=false, holding its deliveries unsettled) is killed with SIGKILL; the broker releases its
// leases at once (the topic's ack_wait is 5 minutes, so no lease expiry explains it) and a client
// member of the same group receives those messages again, with attempt 2 or more.
func TestClientKilledMemberRedelivered(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	b.createTopic("killme", map[string]any{"semantics": "PUB_SUB", "ack_wait": "5m"})
	pub := b.dialClient()
	publishPayloads(t, pub, "killme", []string{"held-1", "held-2", "never-held"})

	// The member holds at most two deliveries (its credit), in offset order: held-1 and held-2.
	sub := startSub(t, b, "--group", "g", "--from", "beginning", "--ack=false", "--max-in-flight", "2", "killme")
	sub.waitLines(t, "spool sub prints the deliveries it holds", 2)
	held := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(sub.out.String(), "\n"), "\n") {
		if !strings.Contains(l, " attempt=1 ") {
			t.Fatalf("spool sub printed %q", l)
		}
		held[l[strings.LastIndexByte(l, ' ')+1:]] = true
	}
	if !held["held-1"] || !held["held-2"] {
		t.Fatalf("spool sub holds %v, want held-1 and held-2", held)
	}

	_ = sub.signal(t, syscall.SIGKILL) // killed: its exit status says so

	type delivery struct {
		payload string
		attempt int
	}
	got := make(chan delivery, 8)
	c := b.dialClient(client.ClientName("survivor"))
	subscribe(t, c, client.SubscribeParams{Topic: "killme", Group: "g"}, func(_ context.Context, d *client.Delivery) error {
		got <- delivery{string(d.Payload), d.Attempt}
		return nil
	})
	attempts := map[string]int{}
	for len(attempts) < 3 {
		d := recvDelivery(t, got, "the killed member's messages")
		if _, dup := attempts[d.payload]; dup {
			t.Fatalf("%s delivered twice to the surviving member", d.payload)
		}
		attempts[d.payload] = d.attempt
	}
	for p := range held {
		if attempts[p] < 2 {
			t.Errorf("%s (held by the killed member) redelivered with attempt %d, want >= 2", p, attempts[p])
		}
	}
	if a, ok := attempts["never-held"]; !ok || a != 1 {
		t.Errorf("never-held: delivered %v with attempt %d, want attempt 1", ok, a)
	}
	b.waitSettled("killme")
}

// connectHook reports the client's connections.
type connectHook chan client.ConnectEvent

func (h connectHook) OnConnect(ev client.ConnectEvent) { h <- ev }

// TestClientReconnectAfterBrokerRestart: a client in a durable group holds a delivery without
// acking it (its handler blocks); the broker is killed with SIGKILL and restarted on the same data
// directory and ports; the client reconnects by itself, resubscribes, receives the unacked
// message again, and a message published after the restart too. The blocked handler's late ack
// fails with ErrConnectionLost.
func TestClientReconnectAfterBrokerRestart(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	b.createTopic("events", map[string]any{"semantics": "PUB_SUB"})
	connects := make(connectHook, 8)
	c := b.dialClient(client.ClientName("durable"), client.Hooks(connects), client.ReconnectBackoff(20*time.Millisecond, 500*time.Millisecond, 0.2))
	if ev := recvDelivery(t, connects, "first connect"); ev.Reconnect {
		t.Fatalf("first connect event %+v", ev)
	}

	got := make(chan *client.Delivery, 16)
	release := make(chan struct{})
	lateAck := make(chan error, 1)
	var blocked atomic.Bool
	subscribe(t, c, client.SubscribeParams{Topic: "events", Group: "g"}, func(hctx context.Context, d *client.Delivery) error {
		got <- d
		// Only the very first delivery blocks; the redelivery after the crash carries a higher
		// attempt (the engine counts one more attempt for everything in flight at a crash).
		if blocked.CompareAndSwap(false, true) {
			select { // blocks, unacked, across the restart
			case <-release:
			case <-hctx.Done():
			}
			lateAck <- d.Ack(context.Background())
			return nil
		}
		return d.Ack(hctx)
	}, client.ManualAck(), client.Concurrency(2))
	defer close(release)

	publishPayloads(t, c, "events", []string{"before"})
	first := recvDelivery(t, got, "the delivery before the restart")
	if string(first.Payload) != "before" || first.Attempt != 1 {
		t.Fatalf("first delivery %q attempt %d", first.Payload, first.Attempt)
	}

	b.kill()
	b.start() // same data directory and ports
	if ev := recvDelivery(t, connects, "the reconnect"); !ev.Reconnect {
		t.Fatalf("connect event after the restart %+v", ev)
	}
	again := recvDelivery(t, got, "the redelivery after the restart")
	if string(again.Payload) != "before" || again.Offset != first.Offset || again.Partition != first.Partition {
		t.Fatalf("after the restart got %q at %s, want the unacked message at %s", again.Payload, again.MessageID(), first.MessageID())
	}
	// Invariant 3: a duplicate delivery carries a higher attempt number, also across a crash (2,
	// or 3 when the recovery counted one more for a claim that did reach the disk).
	if again.Attempt <= first.Attempt {
		t.Fatalf("redelivered after the restart with attempt %d, want more than %d", again.Attempt, first.Attempt)
	}
	t.Logf("redelivered after the restart with attempt %d", again.Attempt)
	release <- struct{}{}
	if err := recvDelivery(t, lateAck, "the blocked handler's ack"); !errors.Is(err, client.ErrConnectionLost) {
		t.Fatalf("ack of the delivery of the killed connection: %v, want ErrConnectionLost", err)
	}

	publishPayloads(t, c, "events", []string{"after"})
	for {
		d := recvDelivery(t, got, "the message published after the restart")
		if string(d.Payload) == "after" {
			break
		}
		if string(d.Payload) != "before" {
			t.Fatalf("unexpected delivery %q", d.Payload)
		}
	}
	b.waitSettled("events")
}

// TestClientSeedAdminListings is seed 002's M4-2 and M4-3 against the binary: GET /admin/topics
// lists the topic with its subscriber count, GET /admin/groups the groups with their member
// counts.
func TestClientSeedAdminListings(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	b.createTopic("orders.created", map[string]any{"semantics": "PUB_SUB"})
	noop := func(context.Context, *client.Delivery) error { return nil }
	for i, group := range []string{"billing", "billing", "shipping"} {
		c := b.dialClient(client.ClientName(fmt.Sprintf("consumer-%d", i)))
		subscribe(t, c, client.SubscribeParams{Topic: "orders.created", Group: group}, noop)
	}

	eventually(t, "GET /admin/topics", func() error {
		var out struct {
			Topics []struct {
				Name          string `json:"name"`
				Semantics     string `json:"semantics"`
				Subscribers   int    `json:"subscribers"`
				Subscriptions int    `json:"subscriptions"`
			} `json:"topics"`
		}
		if err := b.getJSON("/admin/topics", &out); err != nil {
			return err
		}
		for _, tp := range out.Topics {
			if tp.Name == "orders.created" {
				if tp.Semantics != "PUB_SUB" || tp.Subscribers != 3 || tp.Subscriptions != 2 {
					return fmt.Errorf("topic %+v, want PUB_SUB with 3 subscribers in 2 subscriptions", tp)
				}
				return nil
			}
		}
		return fmt.Errorf("orders.created not listed: %+v", out.Topics)
	})
	eventually(t, "GET /admin/groups", func() error {
		var out struct {
			Groups []struct {
				Topic     string            `json:"topic"`
				Group     string            `json:"group"`
				State     string            `json:"state"`
				Members   int               `json:"members"`
				Consumers []json.RawMessage `json:"consumers"`
			} `json:"groups"`
		}
		if err := b.getJSON("/admin/groups", &out); err != nil {
			return err
		}
		members := map[string]int{}
		for _, g := range out.Groups {
			if g.Topic != "orders.created" || g.State != "ACTIVE" || len(g.Consumers) != g.Members {
				return fmt.Errorf("group %+v", g)
			}
			members[g.Group] = g.Members
		}
		if len(members) != 2 || members["billing"] != 2 || members["shipping"] != 1 {
			return fmt.Errorf("members by group %v, want billing 2 and shipping 1", members)
		}
		return nil
	})
}

// TestClientThousandConnections: 1,000 clients connected to the binary at the same time, each
// publishing one message, all succeed; the broker counts them open, then closes them all. Not
// parallel: it needs the file descriptors and the race detector's goroutine budget to itself.
func TestClientThousandConnections(t *testing.T) {
	const n = 1000
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// This process holds n client sockets; the broker (which inherits the limit) n more.
	const need = n + 512
	if lim.Cur < need {
		lim.Cur = min(lim.Max, 4*need)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("raise RLIMIT_NOFILE to %d: %v", lim.Cur, err)
		}
	}
	if lim.Cur < need {
		t.Fatalf("RLIMIT_NOFILE is %d (hard %d), need %d", lim.Cur, lim.Max, need)
	}
	b := newBroker(t)
	b.start()

	clients := make([]*client.Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	cx := ctx(t)
	for i := range n {
		wg.Go(func() {
			c, err := client.Dial(cx, b.tcp, client.ClientName(fmt.Sprintf("conn-%d", i)))
			if err != nil {
				errs[i] = fmt.Errorf("dial: %w", err)
				return
			}
			clients[i] = c
			if _, err := c.Publish(cx, "many", client.Message{Payload: fmt.Appendf(nil, "from-%d", i)}); err != nil {
				errs[i] = fmt.Errorf("publish: %w", err)
			}
		})
	}
	wg.Wait()
	closeAll := func() {
		var cw sync.WaitGroup
		closeErrs := make([]error, n)
		for i, c := range clients {
			if c == nil {
				continue
			}
			clients[i] = nil
			cw.Go(func() {
				cctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
				defer cancel()
				closeErrs[i] = c.Close(cctx)
			})
		}
		cw.Wait()
		if err := errors.Join(closeErrs...); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	t.Cleanup(closeAll) // when the test fails before closing them itself
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 5 {
				t.Errorf("client %d: %v", i, err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d clients failed", failed, n)
	}

	metric := func(want string) func() error {
		return func() error {
			code, body := b.get("/metrics")
			if code != http.StatusOK || !strings.Contains(body, want) {
				return fmt.Errorf("/metrics %d lacks %q", code, want)
			}
			return nil
		}
	}
	eventually(t, "the broker counts the open connections", metric(fmt.Sprintf("spool_connections{protocol=\"binary\"} %d\n", n)))
	var topic struct {
		Stats struct {
			Messages int64 `json:"messages"`
		} `json:"stats"`
	}
	if err := b.getJSON("/api/v1/topics/many", &topic); err != nil {
		t.Fatal(err)
	}
	if topic.Stats.Messages != n {
		t.Fatalf("topic many holds %d messages, want %d", topic.Stats.Messages, n)
	}

	closeAll()
	eventually(t, "the broker sees every connection closed", metric("spool_connections{protocol=\"binary\"} 0\n"))
}

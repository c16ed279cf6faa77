package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// Tokens of the principals of authEnv.
const (
	aliceToken = "alice-0123456789abcdef" // publish orders.#, consume orders.# in billing-*
	bobToken   = "bob-0123456789abcdef"   // consume everything, any group
	carolToken = "carol-0123456789abcdef" // consume orders.#, any group
	daveToken  = "dave-0123456789abcdef"  // publish orders.#, with priority (backpressure exempt)
)

// authEnv starts a server with authentication on; reg holds its metrics.
func authEnv(t *testing.T, mods ...func(*Config)) (*env, *prometheus.Registry) {
	t.Helper()
	hash := func(tok string) string {
		h, err := auth.HashToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	a, err := auth.New(auth.Config{Principals: []auth.Principal{
		{Name: "alice", TokenHash: hash(aliceToken), Permissions: []auth.Permission{
			{Action: auth.Publish, Topics: "orders.#"},
			{Action: auth.Consume, Topics: "orders.#", Groups: "billing-*"},
		}},
		{Name: "bob", TokenHash: hash(bobToken), Permissions: []auth.Permission{{Action: auth.Consume, Topics: "#"}}},
		{Name: "carol", TokenHash: hash(carolToken), Permissions: []auth.Permission{{Action: auth.Consume, Topics: "orders.#"}}},
		{Name: "dave", TokenHash: hash(daveToken), Permissions: []auth.Permission{
			{Action: auth.Publish, Topics: "orders.#"}, {Action: auth.Priority, Topics: "orders.#"},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	return newEnv(t, func(c *Config) {
		c.Auth, c.Metrics = a, m
		fastPublisherIdle(c)
		for _, mod := range mods {
			mod(c)
		}
	}, nil), reg
}

// deniedCount returns spool_auth_denied_total{reason}.
func deniedCount(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "spool_auth_denied_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// topicExists reports whether the engine has topic.
func (e *env) topicExists(topic string) bool {
	e.t.Helper()
	_, err := e.engine.TopicGet(context.Background(), topic)
	if err != nil && !errors.Is(err, storage.ErrTopicNotFound) {
		e.t.Fatal(err)
	}
	return err == nil
}

func TestAuthBinaryHello(t *testing.T) {
	t.Parallel()
	e, reg := authEnv(t)
	for _, tok := range []string{"", "wrong-0123456789abcdef"} {
		_, err := e.tryDial(&protocol.Hello{ClientName: "test", Token: tok})
		if !errors.Is(err, protocol.ErrNotAuthenticated) {
			t.Errorf("Hello with token %q: got %v, want NOT_AUTHENTICATED", tok, err)
		}
	}
	if n := deniedCount(t, reg, auth.ReasonUnauthenticated); n != 2 {
		t.Errorf("spool_auth_denied_total{reason=unauthenticated} = %v, want 2", n)
	}
	c := e.dial(&protocol.Hello{ClientName: "test", Token: aliceToken})
	c.publish("orders.eu", "one")
	// Publish outside orders.#: refused, and the topic is not auto-created.
	c.expectErr(&protocol.Publish{Topic: "billing.x", Messages: []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte("x")}}}, protocol.CodePermissionDenied)
	if e.topicExists("billing.x") {
		t.Error("a refused publish created billing.x")
	}
	// Consume: only in a billing-* group.
	c.expectErr(&protocol.Subscribe{Topic: "orders.eu", Group: "other", MaxInFlight: 1}, protocol.CodePermissionDenied)
	c.expectErr(&protocol.Subscribe{Topic: "orders.eu", MaxInFlight: 1}, protocol.CodePermissionDenied)
	ok := c.subscribe(&protocol.Subscribe{Topic: "orders.eu", Group: "billing-1", MaxInFlight: 1})
	if len(ok.Subscriptions) != 1 {
		t.Fatalf("SubscribeOK %+v", ok)
	}
	if got := payloadsOf(c.deliveriesN(1)); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("delivered %q", got)
	}
	if n := deniedCount(t, reg, auth.ReasonForbidden); n != 3 {
		t.Errorf("spool_auth_denied_total{reason=forbidden} = %v, want 3", n)
	}
	// The session stays usable after a denial.
	c.publish("orders.eu", "two")
}

// TestAuthWildcardBindsPermittedTopics: a wildcard subscription without a group binds only the
// topics the principal may consume, those that exist and those created later; one in a group
// (a durable binding, which subscribes the group to every matching topic created later) must be
// covered by the principal's permission.
func TestAuthWildcardBindsPermittedTopics(t *testing.T) {
	t.Parallel()
	e, _ := authEnv(t)
	ctx := context.Background()
	publish := func(topic string) {
		t.Helper()
		if _, err := e.b.Publish(ctx, topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte(topic)}}); err != nil {
			t.Fatal(err)
		}
	}
	publish("orders.a")
	publish("billing.a")
	c := e.dial(&protocol.Hello{ClientName: "test", Token: carolToken})
	ok := c.subscribe(&protocol.Subscribe{Topic: "#", MaxInFlight: 10, Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	var topics []string
	for _, s := range ok.Subscriptions {
		topics = append(topics, s.Topic)
	}
	if !slices.Equal(topics, []string{"orders.a"}) {
		t.Fatalf("# bound %q, want only orders.a", topics)
	}
	// Topics created later: billing.b first, then orders.b. Topics are attached in creation
	// order, so once orders.b's message arrived billing.b was considered (and refused).
	publish("billing.b")
	publish("orders.b")
	if got := payloadsOf(c.deliveriesN(2)); !slices.Equal(got, []string{"orders.a", "orders.b"}) {
		t.Fatalf("delivered %q, want orders.a, orders.b", got)
	}
	info, err := e.memberInfo(ok.MemberID + "@carol") // the broker scopes member ids by principal
	if err != nil {
		t.Fatal(err)
	}
	if info.SubscriptionCount != 2 {
		t.Errorf("member attached to %d subscriptions, want 2 (orders.a, orders.b)", info.SubscriptionCount)
	}
	// In a group: # is refused (no binding is created), orders.* is covered.
	c.expectErr(&protocol.Subscribe{Topic: "#", Group: "g", MaxInFlight: 1}, protocol.CodePermissionDenied)
	if bs, err := e.engine.BindingList(ctx); err != nil || len(bs) != 0 {
		t.Fatalf("bindings after a refused subscribe: %v, %v", bs, err)
	}
	c.subscribe(&protocol.Subscribe{Topic: "orders.*", Group: "g", MaxInFlight: 1})
	ac := e.dial(&protocol.Hello{ClientName: "alice", Token: aliceToken})
	ac.expectErr(&protocol.Subscribe{Topic: "orders.*", Group: "other", MaxInFlight: 1}, protocol.CodePermissionDenied)
	ac.subscribe(&protocol.Subscribe{Topic: "orders.*", Group: "billing-1", MaxInFlight: 1})
	// bob may consume everything: the same pattern binds all four topics.
	bc := e.dial(&protocol.Hello{ClientName: "bob", Token: bobToken})
	if ok := bc.subscribe(&protocol.Subscribe{Topic: "#", MaxInFlight: 10}); len(ok.Subscriptions) != 4 {
		t.Errorf("bob's # bound %d topics, want 4", len(ok.Subscriptions))
	}
}

func TestAuthText(t *testing.T) {
	t.Parallel()
	e, reg := authEnv(t)
	// A command before AUTH, a bad token: refused, nothing published; the session stays open
	// (text mode: NOT_AUTHENTICATED does not close).
	c := e.dialText()
	c.send("PUBLISH orders.x hello")
	c.expect("ERR NOT_AUTHENTICATED")
	c.send("VERBOSE ON")
	c.expect("ERR NOT_AUTHENTICATED")
	c.send("AUTH wrong-0123456789abcdef")
	c.expect("ERR NOT_AUTHENTICATED")
	if e.topicExists("orders.x") {
		t.Error("an unauthenticated PUBLISH created orders.x")
	}
	// PING needs no authentication.
	c.send("PING")
	c.expect("OK PONG")
	c.send("AUTH " + aliceToken)
	c.expect("OK authenticated as alice")
	c.send("PUBLISH orders.x hello")
	c.expect("OK ")
	c.send("PUBLISH billing.x hello")
	c.expect("ERR PERMISSION_DENIED")
	c.send("SUBSCRIBE orders.x")
	c.expect("ERR PERMISSION_DENIED") // no group: alice consumes in billing-* groups only
	c.send("JOIN_GROUP billing-1 c1", "SUBSCRIBE orders.x")
	c.expect("OK group billing-1")
	c.expect("OK subscribed orders.x")
	c.expectLine("MESSAGE orders.x hello")
	if e.topicExists("billing.x") {
		t.Error("a refused PUBLISH created billing.x")
	}
	if n := deniedCount(t, reg, auth.ReasonUnauthenticated); n != 3 {
		t.Errorf("unauthenticated denials = %v, want 3", n)
	}
	if n := deniedCount(t, reg, auth.ReasonForbidden); n != 2 {
		t.Errorf("forbidden denials = %v, want 2", n)
	}
}

// TestAuthOffAcceptsAnyToken: without principals nothing changes (tokens are ignored).
func TestAuthOffAcceptsAnyToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	c := e.dial(&protocol.Hello{ClientName: "test", Token: "anything"})
	c.publish("billing.x", "x")
	tc := e.dialText()
	tc.send("AUTH whatever")
	tc.expect("OK authentication is not required")
}

// TestAuthTextUnauthenticatedIsBounded: with authentication on, a text client without credentials
// cannot hold its connection: the handshake deadline stays while it sends PINGs (each answered),
// and its end is answered ERR SESSION_TIMEOUT before the close (docs/protocol.md 11.2); the third
// refused AUTH closes the session.
func TestAuthTextUnauthenticatedIsBounded(t *testing.T) {
	t.Parallel()
	e, _ := authEnv(t, func(c *Config) { c.HandshakeTimeout = 500 * time.Millisecond })
	c := e.dialText()
	for range 3 {
		c.send("AUTH wrong-0123456789abcdef")
		c.expect("ERR NOT_AUTHENTICATED")
	}
	c.expectEOF()

	c = e.dialText()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond): // the pace of the PINGs, not a synchronization
			}
			if _, err := c.nc.Write([]byte("PING\n")); err != nil {
				return
			}
		}
	}()
	got := c.expectEOF()
	if len(got) == 0 || got[len(got)-1] != "ERR SESSION_TIMEOUT not authenticated within 500ms of connecting" {
		t.Fatalf("got %q, want PONGs then ERR SESSION_TIMEOUT", got)
	}
	for _, l := range got[:len(got)-1] {
		if l != "OK PONG" {
			t.Fatalf("got %q, want PONGs then ERR SESSION_TIMEOUT", got)
		}
	}
	if st := e.srv.Stats(); st.SessionTimeouts != 1 {
		t.Fatalf("stats %+v, want 1 session timeout", st)
	}
}

// TestAuthTextInteractiveBeforeAuth: with authentication on, a session started by hand with PING
// (docs/protocol.md 11.5) and then authenticated is interactive: neither text_publisher_idle nor
// the handshake timeout closes it. Without authentication, AUTH would start no deadline either.
func TestAuthTextInteractiveBeforeAuth(t *testing.T) {
	t.Parallel()
	e, _ := authEnv(t, func(c *Config) { c.HandshakeTimeout = 500 * time.Millisecond })
	c := e.dialText()
	c.send("PING")
	c.expect("OK PONG")
	c.send("AUTH " + aliceToken)
	c.expect("OK authenticated as alice")
	// Past the handshake deadline and several times text_publisher_idle (100 ms): a session that
	// is closed by either has its EOF waiting by then.
	time.Sleep(time.Second)
	c.send("PING")
	c.expect("OK PONG")
	if st := e.srv.Stats(); st.SessionTimeouts != 0 {
		t.Fatalf("stats %+v, want no session timeout", st)
	}
}

// TestAuthDenialLogIsRateLimited: a client retrying a bad token, or a forbidden request, in a
// loop logs one WARN line per reason and principal every auth.DenialLogInterval (of the server's
// clock), the next one saying how many were left out; the counter counts them all.
func TestAuthDenialLogIsRateLimited(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Now())
	logs := &testutil.SyncBuffer{}
	e, reg := authEnv(t, func(c *Config) {
		c.Clock = clock
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	lines := func(want string) []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "request denied") && strings.Contains(l, want) {
				out = append(out, l)
			}
		}
		return out
	}
	badHello := func() {
		if _, err := e.tryDial(&protocol.Hello{ClientName: "test", Token: "wrong-0123456789abcdef"}); !errors.Is(err, protocol.ErrNotAuthenticated) {
			t.Fatalf("Hello with a wrong token: %v, want NOT_AUTHENTICATED", err)
		}
	}
	for range 4 {
		badHello()
	}
	c := e.dialText()
	c.send("AUTH " + aliceToken)
	c.expect("OK authenticated as alice")
	for range 3 {
		c.send("PUBLISH billing.x hello")
		c.expect("ERR PERMISSION_DENIED")
	}
	if got := lines("reason=unauthenticated"); len(got) != 1 {
		t.Errorf("4 bad Hellos logged %d lines, want 1: %q", len(got), got)
	}
	if got := lines("reason=forbidden principal=alice"); len(got) != 1 {
		t.Errorf("3 forbidden publishes logged %d lines, want 1: %q", len(got), got)
	}
	// After the interval the next denial is logged with the count of those left out.
	clock.Advance(auth.DenialLogInterval)
	badHello()
	if got := lines("reason=unauthenticated"); len(got) != 2 || !strings.Contains(got[1], "suppressed=3") {
		t.Errorf("after the interval: %q, want a second line with suppressed=3", got)
	}
	if n := deniedCount(t, reg, auth.ReasonUnauthenticated); n != 5 {
		t.Errorf("unauthenticated denials counted %v, want 5", n)
	}
}

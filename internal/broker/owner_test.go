package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// gatedEngine is the real engine whose claims can be held at the door: while armed, a claim
// announces itself on entered and waits for open before it reaches the engine. It lets a test
// act while an owner is inside a claim.
type gatedEngine struct {
	storage.Engine
	armed   chan struct{} // a token per claim to hold
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedEngine) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	select {
	case <-g.armed:
		g.entered <- struct{}{}
		<-g.open
	default:
	}
	return g.Engine.DeliveriesClaim(ctx, p)
}

// gatedEnv is a broker on a real wal engine behind a gatedEngine, with a fake clock and no
// polls, a topic and its first member m1, whose owner o is held inside a claim by holdClaim.
type gatedEnv struct {
	b        *Broker
	g        *gatedEngine
	clock    *fakeClock
	topic    string
	m1       *Member
	subID    int64
	o        *owner
	openGate func() // lets the held claim go on; idempotent
}

// newGatedEnv starts the broker, creates topic and subscribes m1 with credit maxInFlight (0: the
// default). At the test's end the gate opens (a failing test must not leave the owner inside a
// claim), then the broker stops and the engine closes.
func newGatedEnv(t *testing.T, topic string, maxInFlight int) *gatedEnv {
	t.Helper()
	clock := newFakeClock()
	eng, err := wal.Open(t.TempDir(), wal.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	g := &gatedEngine{Engine: eng, armed: make(chan struct{}, 1), entered: make(chan struct{}), open: make(chan struct{})}
	b, err := New(Config{Engine: g, Clock: clock, Logger: testLogger(t), RetentionInterval: -1, PollInterval: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	var opened sync.Once
	e := &gatedEnv{b: b, g: g, clock: clock, topic: topic, openGate: func() { opened.Do(func() { close(g.open) }) }}
	t.Cleanup(e.openGate) // runs first
	if _, err := b.CreateTopic(ctx, topic, storage.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	if e.m1, err = b.Subscribe(ctx, SubscribeParams{Pattern: topic, MemberID: "m1", MaxInFlight: maxInFlight}); err != nil {
		t.Fatal(err)
	}
	e.subID = e.m1.Subscriptions()[0].SubscriptionID
	b.mu.RLock()
	e.o = b.subs[e.subID]
	b.mu.RUnlock()
	return e
}

// holdClaim publishes "x" and returns once the owner is inside the claim it makes for it.
func (e *gatedEnv) holdClaim(t *testing.T) {
	t.Helper()
	e.g.armed <- struct{}{}
	if _, err := e.b.Publish(context.Background(), e.topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	<-e.g.entered
}

// TestLeaveWaitsForClaimInProgress: a member that leaves while its subscription's owner is inside
// a claim for it must not release its leases before that claim finished (leave is the fence):
// otherwise the claim's lease stays held until ack_wait and the other members wait for it. The
// fake clock never moves, so only a release gives the message to the next member.
func TestLeaveWaitsForClaimInProgress(t *testing.T) {
	t.Parallel()
	e := newGatedEnv(t, "fence", 1)
	b, m1, subID, ctx := e.b, e.m1, e.subID, context.Background()
	e.holdClaim(t) // the owner is claiming for m1
	closed := make(chan error, 1)
	go func() { closed <- m1.Close(ctx) }()
	eventually(t, "m1 detached", func() error {
		if m1.AttachedTo(subID) {
			return fmt.Errorf("m1 still attached")
		}
		return nil
	})
	e.openGate() // the claim leases the message to m1, which has left meanwhile
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}

	m2, err := b.Subscribe(ctx, SubscribeParams{Pattern: "fence", MemberID: "m2"})
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, m2, 1)[0]
	if string(d.Payload) != "x" {
		t.Fatalf("m2 got %q, want x", d.Payload)
	}
	ack(t, m2, d)
}

// TestOwnerEndsWithLastMember: a subscription's owner unregisters when its last member leaves, and
// the next member starts a new one that delivers; listings follow.
func TestOwnerEndsWithLastMember(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("life", storage.TopicConfig{})
	owners := func() int {
		e.b.mu.RLock()
		defer e.b.mu.RUnlock()
		return len(e.b.subs)
	}
	m1 := e.subscribe(SubscribeParams{Pattern: "life", MemberID: "m1"})
	m2 := e.subscribe(SubscribeParams{Pattern: "life", MemberID: "m2"})
	if n := owners(); n != 1 {
		t.Fatalf("%d owners with two members of one subscription, want 1", n)
	}
	info, err := e.b.Group(e.ctx(), "life", "")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(info.Members) != "[m1 m2]" {
		t.Fatalf("members %v, want [m1 m2]", info.Members)
	}
	if err := m1.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if info, _ := e.b.Group(e.ctx(), "life", ""); fmt.Sprint(info.Members) != "[m2]" {
		t.Fatalf("members after m1 left %v, want [m2]", info.Members)
	}
	if err := m2.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "owner ended", func() error {
		if n := owners(); n != 0 {
			return fmt.Errorf("%d owners left", n)
		}
		return nil
	})
	m3 := e.subscribe(SubscribeParams{Pattern: "life", MemberID: "m3"})
	e.publishN("life", "l", 2)
	gs := consumeAll(t, 2, m3)
	expectPayloads(t, "m3", gs, "l", 2)
}

// TestOwnersUnderChurn: members join and leave a wildcard's subscriptions while those end under
// them (a group cancelled, a topic deleted and created again), so that joins, leaves and ends
// reach owners in every order: no call hangs, every owner ends with its last member (the package's
// TestMain fails on a goroutine left behind), and a member joining afterwards is served.
func TestOwnersUnderChurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("churn.a", pubSubCfg)
	e.createTopic("churn.b", pubSubCfg)
	ctx := e.ctx()
	stop := make(chan struct{})
	admin := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				admin <- nil
				return
			default:
			}
			var err error
			if i%2 == 0 {
				_, err = e.b.CancelGroup(ctx, "churn.a", "g")
			} else if err = e.b.DeleteTopic(ctx, "churn.b", true); err == nil {
				_, err = e.b.CreateTopic(ctx, "churn.b", pubSubCfg)
			}
			if err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) && !errors.Is(err, storage.ErrInvalidTransition) &&
				!errors.Is(err, storage.ErrTopicNotFound) && !errors.Is(err, storage.ErrTopicExists) {
				admin <- err
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				p := SubscribeParams{Pattern: "churn.*", Group: "g", Notify: make(chan struct{}, 1)}
				if w%2 == 1 {
					p.Group = "" // ephemeral subscriptions, deleted as their member leaves
				}
				m, err := e.b.Subscribe(ctx, p)
				if err != nil {
					errs <- err
					return
				}
				eventually(t, "attachments agree with their owners", func() error { return attachedConsistently(m) })
				m.TakeEnded()
				if err := m.Close(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-admin; err != nil {
		t.Fatalf("admin churn: %v", err)
	}
	close(errs)
	for err := range errs {
		t.Fatalf("member churn: %v", err)
	}
	eventually(t, "every owner ended", func() error {
		e.b.mu.RLock()
		defer e.b.mu.RUnlock()
		if len(e.b.subs) != 0 || len(e.b.members) != 0 {
			return fmt.Errorf("%d owners, %d members left", len(e.b.subs), len(e.b.members))
		}
		return nil
	})
	m := e.subscribe(SubscribeParams{Pattern: "churn.a", Group: "g"})
	e.publishN("churn.a", "after", 1)
	if d := recv(t, m, 1)[0]; string(d.Payload) != "after-0" {
		t.Fatalf("got %q after the churn", d.Payload)
	}
}

// attachedConsistently checks that every subscription m is attached to has an owner that lists m,
// or one that ended and detached m.
func attachedConsistently(m *Member) error {
	m.mu.Lock()
	atts := maps.Clone(m.subs)
	m.mu.Unlock()
	for id, o := range atts {
		if slices.Contains(o.viewMembers(), m) {
			continue
		}
		o.qmu.Lock()
		ended := o.ended
		o.qmu.Unlock()
		m.mu.Lock()
		still := m.subs[id] == o
		m.mu.Unlock()
		if ended && !still {
			continue
		}
		return fmt.Errorf("member %s attached to subscription %d whose owner does not list it (owner ended: %v)", m.id, id, ended)
	}
	return nil
}

// TestJoinQueuedBehindEnd: a member whose join waits in the inbox while the owner finds its
// subscription gone is detached and told, like the members it had: it must not stay attached to
// an owner that ended (it would never receive anything from that subscription again).
func TestJoinQueuedBehindEnd(t *testing.T) {
	t.Parallel()
	e := newGatedEnv(t, "pend", 0)
	b, m1, subID, o, ctx := e.b, e.m1, e.subID, e.o, context.Background()
	queued := func(n int) func() error {
		return func() error {
			o.qmu.Lock()
			defer o.qmu.Unlock()
			if len(o.events) < n {
				return fmt.Errorf("%d events queued, want %d", len(o.events), n)
			}
			return nil
		}
	}
	e.holdClaim(t) // the owner is inside a claim
	joined := make(chan *Member, 1)
	go func() {
		m2, err := b.Subscribe(ctx, SubscribeParams{Pattern: "pend", MemberID: "m2"})
		if err != nil {
			t.Errorf("Subscribe m2: %v", err)
		}
		joined <- m2
	}()
	eventually(t, "m2's join queued", queued(1))
	deleted := make(chan error, 1)
	go func() { deleted <- b.DeleteTopic(ctx, "pend", true) }()
	eventually(t, "the end queued behind the join", queued(2))
	e.openGate() // the claim finds the subscription gone
	m2 := <-joined
	if err := <-deleted; err != nil {
		t.Fatalf("DeleteTopic: %v", err)
	}
	for _, m := range []*Member{m1, m2} {
		if m == nil {
			t.FailNow()
		}
		if m.AttachedTo(subID) {
			t.Fatalf("%s still attached to the deleted topic's subscription", m.ID())
		}
		ended := m.TakeEnded()
		if len(ended) != 1 || ended[0].SubscriptionID != subID || !errors.Is(ended[0].Err, storage.ErrTopicNotFound) {
			t.Fatalf("%s ended %+v, want subscription %d ended by its topic's deletion (topic not found)", m.ID(), ended, subID)
		}
	}
}

// subClaims is the real engine that counts claims per subscription.
type subClaims struct {
	storage.Engine
	mu     sync.Mutex
	claims map[int64]int
}

func (c *subClaims) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	c.mu.Lock()
	c.claims[p.SubscriptionID]++
	c.mu.Unlock()
	return c.Engine.DeliveriesClaim(ctx, p)
}

func (c *subClaims) total(except int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for id, k := range c.claims {
		if id != except {
			n += k
		}
	}
	return n
}

// TestWildcardAckClaimsOnlyItsSubscription: a wildcard member on many topics consumes from one of
// them: its acks give credit back, which must not make the owners of its other, idle
// subscriptions claim (they never lacked credit). Every ack made each of them claim for nothing.
func TestWildcardAckClaimsOnlyItsSubscription(t *testing.T) {
	t.Parallel()
	var ce *subClaims
	b := newEnvWrapped(t, func(eng storage.Engine) storage.Engine {
		ce = &subClaims{Engine: eng, claims: map[int64]int{}}
		return ce
	}, nil).b
	ctx := context.Background()
	const topics = 20
	for i := range topics {
		if _, err := b.CreateTopic(ctx, fmt.Sprintf("wide.t%02d", i), storage.TopicConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := b.Subscribe(ctx, SubscribeParams{Pattern: "wide.*", MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, b: b}
	e.waitIdle()
	var busy int64
	for _, a := range m.Subscriptions() {
		if a.Topic == "wide.t00" {
			busy = a.SubscriptionID
		}
	}
	before := ce.total(busy)
	for i := range 10 {
		if _, err := b.Publish(ctx, "wide.t00", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "w-%d", i)}}); err != nil {
			t.Fatal(err)
		}
		d := recv(t, m, 1)[0]
		ack(t, m, d)
	}
	e.waitIdle()
	if n := ce.total(busy) - before; n != 0 {
		t.Fatalf("10 acks on one topic made the %d other subscriptions claim %d times, want 0", topics-1, n)
	}
}

// TestOwnerHandlesEventsDuringClaimInterval: an owner waiting out its claim interval handles
// joins and leaves at once; it used to sleep through them, so a Subscribe or a Close waited up to
// one interval plus one claim. The interval here is an hour: the test ends only if both are
// handled while the owner still waits.
func TestOwnerHandlesEventsDuringClaimInterval(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.b.claimInterval = time.Hour // beyond Config's bound of 1 s; no owner runs yet
	e.createTopic("pause", storage.TopicConfig{})
	m1 := e.subscribe(SubscribeParams{Pattern: "pause", MemberID: "m1"})
	subID := m1.Subscriptions()[0].SubscriptionID
	e.b.mu.RLock()
	o := e.b.subs[subID]
	e.b.mu.RUnlock()
	// The first pass was just now: the wake-up of a publish makes the owner wait out the interval.
	e.publishN("pause", "p", 1)
	eventually(t, "the owner waits out its claim interval", func() error {
		if !o.pausing.Load() {
			return errors.New("not pausing")
		}
		return nil
	})
	m2 := e.subscribe(SubscribeParams{Pattern: "pause", MemberID: "m2"}) // returns once the join was handled
	if ids := o.memberIDs(); !slices.Equal(ids, []string{"m1", "m2"}) {
		t.Fatalf("members %v after the join, want [m1 m2]", ids)
	}
	if err := m2.Close(e.ctx()); err != nil {
		t.Fatalf("Close during the claim interval: %v", err)
	}
	if ids := o.memberIDs(); !slices.Equal(ids, []string{"m1"}) {
		t.Fatalf("members %v after the leave, want [m1]", ids)
	}
	if !o.pausing.Load() {
		t.Fatal("the claim interval ended before the test did: nothing was shown")
	}
}

// TestJoinAndLeaveWaitsEndWithCtx: Subscribe waiting for its join and Close waiting for its leave
// return the context's error when it ends, while the owner is busy in a claim (they used to wait
// for the owner whatever the context). Once the claim ends, everything settles: the abandoned
// member is closed in the background and a new member gets the message.
func TestJoinAndLeaveWaitsEndWithCtx(t *testing.T) {
	t.Parallel()
	e := newGatedEnv(t, "busy", 1)
	b, m1, o, ctx := e.b, e.m1, e.o, context.Background()
	e.holdClaim(t) // the owner is claiming for m1 and handles no event until the claim ends

	jctx, cancel := context.WithCancel(ctx)
	joined := make(chan error, 1)
	go func() {
		_, err := b.Subscribe(jctx, SubscribeParams{Pattern: "busy", MemberID: "m2"})
		joined <- err
	}()
	eventually(t, "m2's join queued", func() error {
		if !o.queued.Load() {
			return errors.New("inbox empty")
		}
		return nil
	})
	cancel()
	// The owner stays in the claim until the test opens it: a wait that ignores ctx never ends.
	within := func(what string, ch <-chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(waitTimeout):
			t.Fatalf("%s did not return within %s of its ctx ending", what, waitTimeout)
			return nil
		}
	}
	if err := within("Subscribe", joined); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe whose ctx ended while waiting for its join: %v, want context.Canceled", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- m1.Close(jctx) }()
	if err := within("Close", closed); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with an ended ctx while the owner is busy: %v, want context.Canceled", err)
	}
	if _, open := <-m1.Deliveries(); open {
		t.Fatal("m1's channel is open after its Close")
	}

	e.openGate() // the claim ends; the owner handles the join and the two leaves
	m3, err := b.Subscribe(ctx, SubscribeParams{Pattern: "busy", MemberID: "m3"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "only m3 left", func() error {
		// The owner that served m1 retires once its last member left; m3 may have come before
		// that or after, to a new owner of the same subscription.
		b.mu.RLock()
		cur := b.subs[e.subID]
		b.mu.RUnlock()
		if cur == nil {
			return errors.New("no owner")
		}
		if ids := cur.memberIDs(); !slices.Equal(ids, []string{"m3"}) {
			return fmt.Errorf("members %v", ids)
		}
		return nil
	})
	// m1's lease was not given back (its Close gave up): it comes back when it expires.
	e.clock.Advance(time.Hour)
	b.wakeAll()
	if d := recv(t, m3, 1)[0]; string(d.Payload) != "x" {
		t.Fatalf("m3 got %q, want x", d.Payload)
	}
}

// The claim interval applies in full from claimIntervalFull subscriptions with members on the
// instance, a share of it below (a quarter with one); the count follows owners starting and
// ending.
func TestClaimIntervalScalesWithOwners(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ClaimInterval = 20 * time.Millisecond })
	if got := e.b.claimIntervalNow(); got != 5*time.Millisecond {
		t.Fatalf("no subscription: %v, want 5ms", got)
	}
	var ms []*Member
	for i, want := range []time.Duration{5, 10, 15, 20, 20} {
		topic := fmt.Sprintf("t%d", i)
		e.createTopic(topic, storage.TopicConfig{Semantics: storage.PubSub})
		ms = append(ms, e.subscribe(SubscribeParams{Pattern: topic, Group: "g"}))
		e.waitIdle()
		if got := e.b.claimIntervalNow(); got != want*time.Millisecond {
			t.Fatalf("%d subscriptions: %v, want %v", i+1, got, want*time.Millisecond)
		}
	}
	for _, m := range ms[1:] {
		if err := m.Close(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "owners ended", func() error {
		if got := e.b.claimIntervalNow(); got != 5*time.Millisecond {
			return fmt.Errorf("one subscription left: %v, want 5ms", got)
		}
		return nil
	})
}

// TestAttachFoundAttachedWaitsForJoin: two attaches of one member to one topic (the notifier's
// pass for a topic just created, and Subscribe's own) race; the one that finds the topic attached
// by the other must wait like it for the owner to have the member, else Subscribe returns and a
// listing of the group misses the member (seen: TestGroupHealth's "no consumer attached").
func TestAttachFoundAttachedWaitsForJoin(t *testing.T) {
	t.Parallel()
	e := newGatedEnv(t, "race", 1)
	b, ctx := e.b, context.Background()
	e.holdClaim(t) // the owner is inside a claim: a join waits for it
	m2 := newMember(b, "m2", SubscribeParams{Pattern: e.topic, MaxInFlight: 1}, 1, storage.StartPosition{Kind: storage.FromBeginning})
	first := make(chan error, 1)
	go func() { first <- b.attach(ctx, m2, e.topic, false) }()
	eventually(t, "the first attach registers the topic", func() error {
		m2.mu.Lock()
		defer m2.mu.Unlock()
		if _, attached := m2.topics[e.topic]; !attached {
			return errors.New("not attached yet")
		}
		return nil
	})
	second := make(chan error, 1)
	go func() { second <- b.attach(ctx, m2, e.topic, false) }()
	select {
	case err := <-second:
		t.Fatalf("the attach that found the topic attached returned (%v) before the owner had the member", err)
	case <-time.After(100 * time.Millisecond):
	}
	e.openGate()
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if err := m2.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

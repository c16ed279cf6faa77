package broker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// fakeClock is the test clock: it moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// unitBroker is a Broker with only what member accounting needs; no engine is ever called.
func unitBroker(clock storage.Clock) *Broker {
	return &Broker{clock: clock, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// unitMember returns member m1 with credit maxInFlight, attached to subscription 7 of topic "t"
// whose owner s has no goroutine, on a unitBroker with a fake clock.
func unitMember(maxInFlight int) (*fakeClock, *Member, *owner) {
	clock := newFakeClock()
	b := unitBroker(clock)
	m := newMember(b, "m1", SubscribeParams{Pattern: "t"}, maxInFlight, storage.StartPosition{})
	s := newOwner(b, &storage.Subscription{ID: 7, Topic: "t"})
	s.members = []*Member{m}
	m.subs[s.id] = s
	return clock, m, s
}

func delivery(sub int64, offset int64, deadline time.Time) *storage.Delivery {
	return &storage.Delivery{
		Message:        storage.Message{Partition: 0, Offset: offset},
		SubscriptionID: sub,
		Attempt:        1,
		LeaseDeadline:  deadline,
	}
}

func TestMemberCreditAccounting(t *testing.T) {
	t.Parallel()
	clock, m, s := unitMember(3)
	now := clock.Now()
	deadline := now.Add(10 * time.Second)

	if got := m.credit(now); got != 3 {
		t.Fatalf("initial credit = %d, want 3", got)
	}
	k := m.reserve(now, s)
	if k != 3 || m.credit(now) != 0 {
		t.Fatalf("reserve = %d, credit after = %d; want 3 and 0", k, m.credit(now))
	}
	// The claim returned two deliveries for a reservation of three.
	m.deliver(s, []*storage.Delivery{delivery(7, 0, deadline), delivery(7, 1, deadline)}, k)
	if got := m.credit(now); got != 1 {
		t.Fatalf("credit with 2 held = %d, want 1", got)
	}
	// The consumer takes one from the channel: still held, credit unchanged.
	<-m.ch
	if got := m.credit(now); got != 1 {
		t.Fatalf("credit after receive = %d, want 1", got)
	}
	// Acking (forget) gives credit back.
	m.forget(7, []storage.DeliveryRef{{Partition: 0, Offset: 0}})
	if got := m.credit(now); got != 2 {
		t.Fatalf("credit after forget = %d, want 2", got)
	}
	// The lease of the remaining one (still in the channel) expires: it no longer counts as held,
	// but it still occupies the channel, so credit stays 2 until it is received.
	clock.Advance(11 * time.Second)
	now = clock.Now()
	if got := m.credit(now); got != 2 {
		t.Fatalf("credit with an expired delivery in the channel = %d, want 2", got)
	}
	<-m.ch
	if got := m.credit(now); got != 3 {
		t.Fatalf("credit after the expired delivery was received = %d, want 3", got)
	}
	if !m.nextExpiry(now).IsZero() {
		t.Fatalf("nextExpiry = %v, want zero with nothing held", m.nextExpiry(now))
	}
}

func TestMemberDeliverAfterLeaveDrops(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	b := unitBroker(clock)
	m := newMember(b, "m1", SubscribeParams{Pattern: "t"}, 2, storage.StartPosition{})
	s := newOwner(b, &storage.Subscription{ID: 7, Topic: "t"})
	now := clock.Now()
	k := m.reserve(now, s)
	// m is not attached to s (it left while the claim ran): the deliveries are dropped and the
	// reservation ends.
	m.deliver(s, []*storage.Delivery{delivery(7, 0, now.Add(time.Minute))}, k)
	if len(m.ch) != 0 || len(m.inflight) != 0 || m.reserved != 0 {
		t.Fatalf("after deliver to a detached member: channel %d, inflight %d, reserved %d; want 0, 0, 0",
			len(m.ch), len(m.inflight), m.reserved)
	}
	if got := m.credit(now); got != 2 {
		t.Fatalf("credit = %d, want 2", got)
	}
}

func TestEarliest(t *testing.T) {
	t.Parallel()
	t1 := time.Unix(100, 0)
	t2 := time.Unix(200, 0)
	cases := []struct{ a, b, want time.Time }{
		{time.Time{}, time.Time{}, time.Time{}},
		{t1, time.Time{}, t1},
		{time.Time{}, t2, t2},
		{t1, t2, t1},
		{t2, t1, t1},
	}
	for _, c := range cases {
		if got := earliest(c.a, c.b); !got.Equal(c.want) {
			t.Errorf("earliest(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestValidateStart(t *testing.T) {
	t.Parallel()
	p, err := validateStart(storage.StartPosition{})
	if err != nil || p.Kind != storage.FromNow {
		t.Fatalf("zero start = %v, %v; want FROM_NOW", p, err)
	}
	bad := []storage.StartPosition{
		{Kind: "FROM_YESTERDAY"},
		{Kind: storage.FromTimestamp},
		{Kind: storage.FromMessageID, Offset: -1},
	}
	for _, p := range bad {
		if _, err := validateStart(p); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("validateStart(%+v) = %v, want ErrInvalidArgument", p, err)
		}
	}
}

func TestValidateGroupRef(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                 storage.QueueGroup,
		storage.QueueGroup: storage.QueueGroup,
		"billing":          "billing",
		"$ephemeral-12":    "$ephemeral-12",
	} {
		got, err := validateGroupRef(in)
		if err != nil || got != want {
			t.Errorf("validateGroupRef(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"bad group", "$", "$$x", "$a b", "a/b"} {
		if _, err := validateGroupRef(in); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("validateGroupRef(%q) = %v, want ErrInvalidArgument", in, err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("New without engine = %v, want ErrInvalidArgument", err)
	}
	eng := storage.Engine(&wal.Engine{}) // not opened: New does not call it
	for _, d := range []time.Duration{-time.Second, storage.MinMemberTTL - 1, storage.MaxMemberTTL + 1} {
		if _, err := New(Config{Engine: eng, MemberTimeout: d}); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Fatalf("New with MemberTimeout %s = %v, want ErrInvalidArgument", d, err)
		}
	}
}

// Three subscriptions share a member (a wildcard member). While the dispatcher of one has reserved
// the member's credit for a claim, another finds no credit and idles; when the claim comes back
// short, the unused credit must wake that one, and only that one: the third did not look (waking
// every subscription of a member on a thousand topics kept idle dispatchers claiming for ever).
func TestReturnedCreditWakesStarvedSubscription(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	b := unitBroker(clock)
	m := newMember(b, "m1", SubscribeParams{Pattern: "t.*"}, 4, storage.StartPosition{})
	s1 := newOwner(b, &storage.Subscription{ID: 1, Topic: "t.a"})
	s2 := newOwner(b, &storage.Subscription{ID: 2, Topic: "t.b"})
	s3 := newOwner(b, &storage.Subscription{ID: 3, Topic: "t.c"})
	for _, s := range []*owner{s1, s2, s3} {
		s.members = []*Member{m}
		m.subs[s.id] = s
	}
	picked, k, _ := s1.pick(nil)
	if picked != m || k != 4 {
		t.Fatalf("s1 pick = %v, %d; want m1 with 4", picked, k)
	}
	if picked, _, _ := s2.pick(nil); picked != nil {
		t.Fatal("s2 picked a member whose credit s1 has reserved")
	}
	// s1's claim returns one delivery: three credits come back, and s2 must hear of it.
	m.deliver(s1, []*storage.Delivery{delivery(1, 0, clock.Now().Add(time.Minute))}, k)
	select {
	case <-s2.signal:
	default:
		t.Fatal("s2 not woken when the unused credit came back")
	}
	if len(s1.signal) != 0 {
		t.Fatal("s1 woken by its own returned credit")
	}
	if len(s3.signal) != 0 {
		t.Fatal("s3 woken by returned credit it never asked for")
	}
	if picked, k, _ := s2.pick(nil); picked != m || k != 3 {
		t.Fatalf("s2 pick after the return = %v, %d; want m1 with 3", picked, k)
	}
}

// A wildcard member's returned credit (an ack, a nack) wakes only the owners that found it
// without credit, not every subscription it is attached to: an ack of a member on a thousand
// topics woke a thousand owners, each claiming for nothing.
func TestReturnedCreditWakesOnlyWaitingOwners(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	b := unitBroker(clock)
	m := newMember(b, "m1", SubscribeParams{Pattern: "t.*"}, 1, storage.StartPosition{})
	s1 := newOwner(b, &storage.Subscription{ID: 1, Topic: "t.a"})
	s2 := newOwner(b, &storage.Subscription{ID: 2, Topic: "t.b"})
	s3 := newOwner(b, &storage.Subscription{ID: 3, Topic: "t.c"})
	for _, s := range []*owner{s1, s2, s3} {
		s.members = []*Member{m}
		m.subs[s.id] = s
	}
	now := clock.Now()
	picked, k, _ := s1.pick(nil)
	if picked != m || k != 1 {
		t.Fatalf("s1 pick = %v, %d; want m1 with 1", picked, k)
	}
	m.deliver(s1, []*storage.Delivery{delivery(1, 0, now.Add(time.Minute))}, k)
	if picked, _, _ := s2.pick(nil); picked != nil {
		t.Fatal("s2 picked a member without credit")
	}
	// The consumer acks: its credit comes back.
	<-m.ch
	m.forget(1, []storage.DeliveryRef{{Partition: 0, Offset: 0}})
	m.creditReturned()
	if len(s2.signal) != 1 {
		t.Fatal("s2, which found the member without credit, not woken")
	}
	if len(s1.signal) != 0 || len(s3.signal) != 0 {
		t.Fatalf("owners that did not wait for the credit woken: s1 %d, s3 %d", len(s1.signal), len(s3.signal))
	}
	// Once woken, s2 waits no more: the next return wakes nobody.
	<-s2.signal
	m.creditReturned()
	if len(s2.signal) != 0 {
		t.Fatal("s2 woken twice for one wait")
	}
}

// Deliveries whose lease expired while they waited in the channel still take its room: the owner
// that found the member without credit must be woken when the consumer takes them (the sessions'
// Take), or it waits for a poll, up to 16 s.
func TestTakeOfExpiredDeliveriesWakesWaitingOwner(t *testing.T) {
	t.Parallel()
	clock, m, s := unitMember(2)
	now := clock.Now()
	k := m.reserve(now, s)
	m.deliver(s, []*storage.Delivery{delivery(7, 0, now.Add(time.Second)), delivery(7, 1, now.Add(time.Second))}, k)
	clock.Advance(2 * time.Second) // both leases expire in the channel
	if picked, _, _ := s.pick(nil); picked != nil {
		t.Fatal("picked a member whose channel is full")
	}
	if ds, _ := m.Take(nil); len(ds) != 2 {
		t.Fatalf("took %d, want 2", len(ds))
	}
	if len(s.signal) != 1 {
		t.Fatal("the waiting owner not woken when the expired deliveries were taken")
	}
	// Taking deliveries whose leases are live gives no credit back: no wake-up.
	<-s.signal
	now = clock.Now()
	k = m.reserve(now, s)
	m.deliver(s, []*storage.Delivery{delivery(7, 2, now.Add(time.Minute)), delivery(7, 3, now.Add(time.Minute))}, k)
	if picked, _, _ := s.pick(nil); picked != nil {
		t.Fatal("picked a member without credit")
	}
	m.Take(nil)
	if len(s.signal) != 0 {
		t.Fatal("owner woken by taking deliveries that still hold their credit")
	}
}

func TestNewValidatesClaimInterval(t *testing.T) {
	t.Parallel()
	eng, err := wal.Open(t.TempDir(), wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for _, iv := range []time.Duration{-time.Millisecond, 2 * time.Second} {
		if _, err := New(Config{Engine: eng, ClaimInterval: iv}); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("New with ClaimInterval %s = %v, want ErrInvalidArgument", iv, err)
		}
	}
}

// TestClaimIntervalDelivers: with a claim interval, wake-ups that come sooner wait for it, and
// everything published is still delivered (in order, to the one member).
func TestClaimIntervalDelivers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.ClaimInterval = 20 * time.Millisecond })
	e.createTopic("paced", storage.TopicConfig{})
	m := e.subscribe(SubscribeParams{Pattern: "paced", MaxInFlight: 100})
	e.publishN("paced", "p", 30)
	ds := recv(t, m, 30)
	for i, d := range ds {
		if want := fmt.Sprintf("p-%d", i); string(d.Payload) != want {
			t.Fatalf("delivery %d is %q, want %q", i, d.Payload, want)
		}
	}
	ack(t, m, ds...)
}

package broker

import (
	"context"
	"fmt"
	"testing"

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

// TestLeaveWaitsForClaimInProgress: a member that leaves while its subscription's owner is inside
// a claim for it must not release its leases before that claim finished (leave is the fence):
// otherwise the claim's lease stays held until ack_wait and the other members wait for it. The
// fake clock never moves, so only a release gives the message to the next member.
func TestLeaveWaitsForClaimInProgress(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	eng, err := wal.Open(t.TempDir(), wal.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	g := &gatedEngine{Engine: eng, armed: make(chan struct{}, 1), entered: make(chan struct{}), open: make(chan struct{})}
	b, err := New(Config{Engine: g, Clock: clock, Logger: testLogger(t), RetentionInterval: -1, PollInterval: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	if _, err := b.CreateTopic(ctx, "fence", storage.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	m1, err := b.Subscribe(ctx, SubscribeParams{Pattern: "fence", MemberID: "m1", MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	subID := m1.Subscriptions()[0].SubscriptionID
	g.armed <- struct{}{}
	if _, err := b.Publish(ctx, "fence", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	<-g.entered // the owner is claiming for m1

	closed := make(chan error, 1)
	go func() { closed <- m1.Close(ctx) }()
	eventually(t, "m1 detached", func() error {
		if m1.AttachedTo(subID) {
			return fmt.Errorf("m1 still attached")
		}
		return nil
	})
	close(g.open) // the claim leases the message to m1, which has left meanwhile
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

package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// A subscription cancelled without this broker (another broker instance on the same PostgreSQL
// database, or the engine directly) ends this broker's members as a local CancelGroup does: the
// owner notices at its next claim, or at its refresh when none of its members claims.

// waitEnded waits until m is told that subscription sub ended and returns why; m must then be
// detached from it and still open.
func waitEnded(t *testing.T, m *Member, sub int64) error {
	t.Helper()
	var ended []EndedSubscription
	eventually(t, fmt.Sprintf("member %s told that subscription %d ended", m.ID(), sub), func() error {
		ended = append(ended, m.TakeEnded()...)
		if len(ended) == 0 {
			return errors.New("not told")
		}
		return nil
	})
	if len(ended) != 1 || ended[0].SubscriptionID != sub {
		t.Fatalf("ended %+v, want subscription %d", ended, sub)
	}
	if info := m.Info(); slices.Contains(info.Subscriptions, sub) {
		t.Fatalf("member %+v still attached to subscription %d", info, sub)
	}
	select {
	case <-m.Done():
		t.Fatalf("member %s closed: an ended subscription leaves it open", m.ID())
	default:
	}
	return ended[0].Err
}

// cancelledAs fails unless err is what a local CancelGroup tells the members of sub.
func cancelledAs(t *testing.T, err error, sub *storage.Subscription) {
	t.Helper()
	if want := cancelledReason(sub); !errors.Is(err, storage.ErrSubscriptionNotActive) || err.Error() != want.Error() {
		t.Fatalf("ended with %v, want %v", err, want)
	}
}

// TestCancelledInEngineEndsMembers: the subscription of a member with credit (of a shared group,
// an ordered group, or an ephemeral one) is cancelled in the engine; the next claim (a publish
// wakes the owner) is refused, and the owner ends the member's subscription as a local cancel
// would. An ephemeral subscription ended so is deleted, as CancelGroup deletes it.
func TestCancelledInEngineEndsMembers(t *testing.T) {
	for name, p := range map[string]SubscribeParams{
		"shared":    {Group: "g"},
		"ordered":   {Group: "g", Mode: storage.ModeOrdered},
		"ephemeral": {},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.RebalanceDelay = -1 })
			e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
			p.Pattern, p.MaxInFlight = "t", 10
			m := e.subscribe(p)
			id := m.Info().Subscriptions[0]
			e.waitIdle()
			sub, err := e.engine.SubscriptionUpdate(e.ctx(), &storage.SubscriptionUpdateParams{ID: id, State: storage.Cancelled})
			if err != nil {
				t.Fatal(err)
			}
			e.publishN("t", "x", 1)
			cancelledAs(t, waitEnded(t, m, id), sub)
			if p.Group == "" {
				eventually(t, "ephemeral subscription deleted", func() error {
					s, err := e.engine.SubscriptionGet(e.ctx(), id)
					if errors.Is(err, storage.ErrSubscriptionNotFound) || err == nil && s.State == storage.Deleted {
						return nil
					}
					return fmt.Errorf("subscription %+v, %v", s, err)
				})
			}
		})
	}
}

// TestCancelledInEngineEndsMembersWithoutCredit: the member holds all it may (no claim runs for
// it); the owner's refresh of its subscription finds the cancel and ends it all the same.
func TestCancelledInEngineEndsMembersWithoutCredit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PollInterval = 10 * time.Millisecond })
	e.b.refreshInterval = 20 * time.Millisecond // before the owner starts
	e.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub})
	m := e.subscribe(SubscribeParams{Pattern: "t", Group: "g", MaxInFlight: 1})
	e.publishN("t", "x", 2)
	d := recv(t, m, 1)[0]
	sub, err := e.engine.SubscriptionUpdate(e.ctx(), &storage.SubscriptionUpdateParams{ID: d.SubscriptionID, State: storage.Cancelled})
	if err != nil {
		t.Fatal(err)
	}
	cancelledAs(t, waitEnded(t, m, d.SubscriptionID), sub)
}

// TestCancelThroughAnotherInstanceEndsMembers: two broker instances on one PostgreSQL schema;
// group g's member is on A, B cancels the group. A's owner finds the cancel at its next claim
// and ends the member's subscription with what a cancel through A says; a member of g
// subscribing again on A gets a new subscription.
func TestCancelThroughAnotherInstanceEndsMembers(t *testing.T) {
	a, bi := pgPair(t, "t_bcancel_", func(c *Config) { c.PollInterval = 20 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := bi.b.CreateTopic(ctx, "t", storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
		t.Fatal(err)
	}
	m, err := a.b.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	id := m.Info().Subscriptions[0]
	sub, err := bi.b.CancelGroup(ctx, "t", "g")
	if err != nil {
		t.Fatal(err)
	}
	cancelledAs(t, waitEnded(t, m, id), sub)

	again, err := a.b.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	if subs := again.Info().Subscriptions; len(subs) != 1 || subs[0] == id {
		t.Fatalf("member of g subscribing again is on %v, want a new subscription", subs)
	}
}

// TestPausedThenCancelledElsewhereEndsMembers: the subscription of a member with credit is
// paused without this broker (in the engine; through another instance on PostgreSQL), and this
// broker's owner found it so (its claim was refused); then it is cancelled the same way. The
// claims it would make are refused as while paused, so the owner reads the subscription in
// their place and ends the member within its poll interval, not at its once-a-minute reread
// (left at a minute here). Resumed instead, the same read finds it active and the member gets
// messages again.
func TestPausedThenCancelledElsewhereEndsMembers(t *testing.T) {
	stateChangedElsewhere(t, "t_bpausecancel_", testPausedThenCancelledElsewhere)
}

// testPausedThenCancelledElsewhere runs TestPausedThenCancelledElsewhereEndsMembers with a's
// member; other creates the topic and publishes, set changes g's state without a.
func testPausedThenCancelledElsewhere(t *testing.T, a, other *Broker, set setState) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	if a.refreshInterval < waitTimeout {
		t.Fatalf("refresh interval %s: the reread would find the cancel within the test's wait", a.refreshInterval)
	}
	if _, err := other.CreateTopic(ctx, "t", pubSubCfg); err != nil {
		t.Fatal(err)
	}
	m, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	id := m.Info().Subscriptions[0]
	pause := func() {
		t.Helper()
		if _, err := set(ctx, storage.Paused); err != nil {
			t.Fatal(err)
		}
		// A publish wakes a's owner (the polls would too): its claim is refused, it reads PAUSED.
		if _, err := other.Publish(ctx, "t", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a's owner finds g paused", func() error {
			a.mu.RLock()
			o := a.subs[id]
			a.mu.RUnlock()
			if o == nil || !o.inactive.Load() {
				return errors.New("not yet")
			}
			return nil
		})
	}
	// Resumed elsewhere, the owner's read finds it active and claims again.
	pause()
	if _, err := set(ctx, storage.Active); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, m, 1)[0]; string(d.Payload) != "x" {
		t.Fatalf("after the resume got %+v", d)
	}
	pause()
	sub, err := set(ctx, storage.Cancelled)
	if err != nil {
		t.Fatal(err)
	}
	cancelledAs(t, waitEnded(t, m, id), sub)
}

// TestChangedElsewhereReachesMembersWithoutCredit: a's member of g holds all it may (no claim
// runs for it). g is paused, resumed, then cancelled without a (in the engine: wal; through
// another instance: PostgreSQL), with a's once-a-minute reread left as is: the engines notify each
// change (storage.NotifySubscription) and a's owner rereads g at once, finds it paused, then
// active again, and ends the member with the local cancel's reason.
func TestChangedElsewhereReachesMembersWithoutCredit(t *testing.T) {
	stateChangedElsewhere(t, "t_bnocredit_", testChangedElsewhereWithoutCredit)
}

// testChangedElsewhereWithoutCredit runs TestChangedElsewhereReachesMembersWithoutCredit with a's
// member; other creates the topic and publishes, set changes g's state without a.
func testChangedElsewhereWithoutCredit(t *testing.T, a, other *Broker, set setState) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	if a.refreshInterval < waitTimeout {
		t.Fatalf("refresh interval %s: the reread would find the changes within the test's wait", a.refreshInterval)
	}
	if _, err := other.CreateTopic(ctx, "t", pubSubCfg); err != nil {
		t.Fatal(err)
	}
	m, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := m.Info().Subscriptions[0]
	for _, p := range []string{"held", "waiting"} {
		if _, err := other.Publish(ctx, "t", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte(p)}}); err != nil {
			t.Fatal(err)
		}
	}
	if d := recv(t, m, 1)[0]; string(d.Payload) != "held" {
		t.Fatalf("got %+v", d)
	}
	a.mu.RLock()
	o := a.subs[id]
	a.mu.RUnlock()
	inactive := func(want bool) {
		t.Helper()
		eventually(t, fmt.Sprintf("a's owner finds g inactive=%v", want), func() error {
			if o.inactive.Load() != want {
				return errors.New("not yet")
			}
			return nil
		})
	}
	if _, err := set(ctx, storage.Paused); err != nil {
		t.Fatal(err)
	}
	inactive(true)
	if _, err := set(ctx, storage.Active); err != nil {
		t.Fatal(err)
	}
	inactive(false)
	sub, err := set(ctx, storage.Cancelled)
	if err != nil {
		t.Fatal(err)
	}
	cancelledAs(t, waitEnded(t, m, id), sub)
}

// setState changes group g of topic t to a state without the broker under test.
type setState func(context.Context, storage.SubscriptionState) (*storage.Subscription, error)

// stateChangedElsewhere runs test twice: on the embedded engine, changing g's state in the engine
// under the broker; on PostgreSQL with schema prefix, the broker under test and another instance
// that makes the changes (pause, resume, cancel through its admin calls).
func stateChangedElsewhere(t *testing.T, prefix string, test func(t *testing.T, a, other *Broker, set setState)) {
	t.Parallel()
	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		test(t, e.b, e.b, func(ctx context.Context, state storage.SubscriptionState) (*storage.Subscription, error) {
			sub, err := e.engine.SubscriptionGetByGroup(ctx, "t", "g")
			if err != nil {
				return nil, err
			}
			return e.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub.ID, State: state})
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		a, bi := pgPair(t, prefix, func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		test(t, a.b, bi.b, func(ctx context.Context, state storage.SubscriptionState) (*storage.Subscription, error) {
			switch state {
			case storage.Paused:
				return bi.b.PauseGroup(ctx, "t", "g")
			case storage.Active:
				return bi.b.ResumeGroup(ctx, "t", "g")
			}
			return bi.b.CancelGroup(ctx, "t", "g")
		})
	})
}

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

// A topic's semantics changed without this broker (through another broker instance on the same
// PostgreSQL database, or in the engine directly): the owner that finds its subscription renamed
// makes this broker's members of the topic move as after a local UpdateTopic. It finds it at once
// (the engine notifies the rename, storage.NotifySubscription): these tests leave the owners'
// once-a-minute reread as is.

// TestSemanticsChangedElsewhere: topic t is QUEUE and the broker a has members of groups g and h
// and one without a group, all on the queue subscription. The topic becomes PUB_SUB with the
// queue becoming group h, through another instance (PostgreSQL) or in the engine (embedded). a's
// members follow: h's stays on the subscription that is h's now, g's moves to a subscription of
// its own group, the one without a group to an ephemeral one; each then gets every message, and
// counts in the metrics under its subscription's group as named now (h's too, which stayed).
func TestSemanticsChangedElsewhere(t *testing.T) {
	t.Parallel()
	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		testSemanticsChangedElsewhere(t, e.b, e.b, func(ctx context.Context) error {
			_, err := e.engine.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: "t", Config: pubSubCfg, QueueToGroup: "h"})
			return err
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		a, bi := pgPair(t, "t_bsemantics_", func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		testSemanticsChangedElsewhere(t, a.b, bi.b, func(ctx context.Context) error {
			_, err := bi.b.UpdateTopic(ctx, UpdateTopicParams{Name: "t", Config: pubSubCfg, QueueToGroup: "h"})
			return err
		})
	})
}

// testSemanticsChangedElsewhere runs TestSemanticsChangedElsewhere with a's members; other
// creates the topic and publishes, update changes the semantics without a.
func testSemanticsChangedElsewhere(t *testing.T, a, other *Broker, update func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout) // outlives eventually's wait
	defer cancel()
	if _, err := other.CreateTopic(ctx, "t", queueCfg); err != nil {
		t.Fatal(err)
	}
	members := map[string]*Member{}
	for _, g := range []string{"g", "h", ""} {
		m, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: g, MaxInFlight: 10})
		if err != nil {
			t.Fatal(err)
		}
		members[g] = m
	}
	queue := members["h"].Info().Subscriptions[0]
	if err := update(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's members on the subscriptions of their groups", func() error {
		for g, m := range members {
			subs := m.Info().Subscriptions
			if len(subs) != 1 {
				return fmt.Errorf("member of group %q attached to %v", g, subs)
			}
			sub, err := a.engine.SubscriptionGet(ctx, subs[0])
			if err != nil {
				return err
			}
			switch {
			case g == "h" && sub.ID != queue:
				return fmt.Errorf("h's member moved from the queue subscription %d (now h's) to %+v", queue, sub)
			case g != "" && sub.Group != g, g == "" && !sub.Ephemeral:
				return fmt.Errorf("member of group %q on subscription %d of group %q", g, sub.ID, sub.Group)
			case m.SubscriptionGroup(sub.ID) != sub.Group:
				// The label of its deliveries, acks and nacks in the metrics.
				return fmt.Errorf("member of group %q labelled %q on subscription %d of group %q", g, m.SubscriptionGroup(sub.ID), sub.ID, sub.Group)
			}
		}
		return nil
	})
	if _, err := other.Publish(ctx, "t", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("after")}}); err != nil {
		t.Fatal(err)
	}
	for g, m := range members {
		if d := recv(t, m, 1)[0]; string(d.Payload) != "after" || !slices.Contains(m.Info().Subscriptions, d.SubscriptionID) {
			t.Fatalf("member of group %q got %+v", g, d)
		}
	}
}

// TestRenamedSubscriptionRelabelsMembers: the members that stay on the subscription a semantics
// change made through this broker renamed count under its new name at once (Member.
// SubscriptionGroup labels their deliveries, acks and nacks in the metrics, OnDeadLettered its
// dead-letters), both ways: QUEUE to PUB_SUB (the queue's subscription becomes h's) and back.
func TestRenamedSubscriptionRelabelsMembers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("t", queueCfg)
	m := e.subscribe(SubscribeParams{Pattern: "t", Group: "h", MaxInFlight: 10})
	id := m.Info().Subscriptions[0]
	if g := m.SubscriptionGroup(id); g != storage.QueueGroup {
		t.Fatalf("member of the queue labelled %q, want %q", g, storage.QueueGroup)
	}
	for _, step := range []struct {
		cfg   storage.TopicConfig
		group string
	}{{pubSubCfg, "h"}, {queueCfg, storage.QueueGroup}} {
		if _, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "t", Config: step.cfg, QueueToGroup: "h"}); err != nil {
			t.Fatal(err)
		}
		if subs := m.Info().Subscriptions; len(subs) != 1 || subs[0] != id {
			t.Fatalf("member on %v after the change to %s, want it still on subscription %d", subs, step.cfg.Semantics, id)
		}
		if g := m.SubscriptionGroup(id); g != step.group {
			t.Fatalf("member labelled %q after the change to %s, want %q", g, step.cfg.Semantics, step.group)
		}
	}
}

// TestPubSubToQueueWithAnOrderedGroup: PUB_SUB to QUEUE renames the topic's one live subscription
// to the queue's, which every consumer shares; when that one is an ordered group's (ACTIVE or
// PAUSED) the change is refused with storage.ErrTopicHasSubscriptions and changes nothing, made
// through the instance of the group's member or another one (PostgreSQL). A cancelled ordered
// group (and a cancelled shared one) does not block it: the queue's subscription is then a new,
// shared one.
func TestPubSubToQueueWithAnOrderedGroup(t *testing.T) {
	t.Parallel()
	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		testPubSubToQueueWithAnOrderedGroup(t, e.b, e.b)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		a, bi := pgPair(t, "t_btoqueue_", func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		testPubSubToQueueWithAnOrderedGroup(t, a.b, bi.b)
	})
}

// testPubSubToQueueWithAnOrderedGroup runs TestPubSubToQueueWithAnOrderedGroup: a holds the
// members, other makes the changes.
func testPubSubToQueueWithAnOrderedGroup(t *testing.T, a, other *Broker) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	if _, err := other.CreateTopic(ctx, "t", pubSubCfg); err != nil {
		t.Fatal(err)
	}
	// Group h: a shared group, cancelled (not live).
	h, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "h", MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.CancelGroup(ctx, "t", "h"); err != nil {
		t.Fatal(err)
	}
	g, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", Mode: storage.ModeOrdered, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	gid := g.Info().Subscriptions[0]
	for _, state := range []storage.SubscriptionState{storage.Active, storage.Paused} {
		if state == storage.Paused {
			if _, err := other.PauseGroup(ctx, "t", "g"); err != nil {
				t.Fatal(err)
			}
		}
		_, err := other.UpdateTopic(ctx, UpdateTopicParams{Name: "t", Config: queueCfg})
		if !errors.Is(err, storage.ErrTopicHasSubscriptions) {
			t.Fatalf("PUB_SUB to QUEUE with the ordered group %s: %v, want ErrTopicHasSubscriptions", state, err)
		}
		t.Logf("refused: %v", err)
		if tp, err := other.TopicConfig(ctx, "t"); err != nil || tp.Config.Semantics != storage.PubSub {
			t.Fatalf("topic after the refused change: %+v, %v", tp, err)
		}
		if sub, err := other.engine.SubscriptionGet(ctx, gid); err != nil || sub.Group != "g" || sub.State != state {
			t.Fatalf("g's subscription after the refused change: %+v, %v", sub, err)
		}
	}
	if _, err := other.ResumeGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Publish(ctx, "t", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, g, 1)[0]; d.SubscriptionID != gid {
		t.Fatalf("g's member got %+v, want a delivery of subscription %d", d, gid)
	}

	// Cancelled, g does not block the change: the queue gets a new, shared subscription.
	if _, err := other.CancelGroup(ctx, "t", "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.UpdateTopic(ctx, UpdateTopicParams{Name: "t", Config: queueCfg}); err != nil {
		t.Fatalf("PUB_SUB to QUEUE with no live group: %v", err)
	}
	q, err := other.engine.SubscriptionGetByGroup(ctx, "t", storage.QueueGroup)
	if err != nil || q.ID == gid || q.Mode == storage.ModeOrdered {
		t.Fatalf("queue subscription %+v, %v: want a new shared one", q, err)
	}
}

// TestFailedMoveEndsMember: a QUEUE topic becomes PUB_SUB with the queue becoming group h; the
// member of group g on broker a cannot join a subscription of g (a's MaxSubscriptions is
// reached). It is told that the queue subscription ended, with a reason that says why
// (LIMIT_EXCEEDED), and closed, so that its client subscribes again or ends; it is never left
// open and detached. h's member stays and consumes. The change is made through a (wal), in the
// engine (wal: a follows), or through another instance (PostgreSQL: a follows).
func TestFailedMoveEndsMember(t *testing.T) {
	t.Parallel()
	limit := func(c *Config) { c.MaxSubscriptions = 1 } // the queue's, which becomes h's
	t.Run("local", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, limit)
		testFailedMoveEndsMember(t, e.b, e.b, func(ctx context.Context) error {
			_, err := e.b.UpdateTopic(ctx, UpdateTopicParams{Name: "t", Config: pubSubCfg, QueueToGroup: "h"})
			return err
		})
	})
	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, func(c *Config) { limit(c); c.PollInterval = 20 * time.Millisecond })
		testFailedMoveEndsMember(t, e.b, e.b, func(ctx context.Context) error {
			_, err := e.engine.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: "t", Config: pubSubCfg, QueueToGroup: "h"})
			return err
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		a, bi := pgPair(t, "t_bmovefail_", limit, func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		testFailedMoveEndsMember(t, a.b, bi.b, func(ctx context.Context) error {
			_, err := bi.b.UpdateTopic(ctx, UpdateTopicParams{Name: "t", Config: pubSubCfg, QueueToGroup: "h"})
			return err
		})
	})
}

// testFailedMoveEndsMember runs TestFailedMoveEndsMember with a's members; other creates the
// topic and publishes, update changes its semantics.
func testFailedMoveEndsMember(t *testing.T, a, other *Broker, update func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	if _, err := other.CreateTopic(ctx, "t", queueCfg); err != nil {
		t.Fatal(err)
	}
	members := map[string]*Member{}
	for _, g := range []string{"g", "h"} {
		m, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: g, MaxInFlight: 10})
		if err != nil {
			t.Fatal(err)
		}
		members[g] = m
	}
	queue := members["h"].Info().Subscriptions[0]
	if err := update(ctx); err != nil {
		t.Fatal(err)
	}
	g := members["g"]
	var ended []EndedSubscription
	eventually(t, "g's member told and closed", func() error {
		ended = append(ended, g.TakeEnded()...)
		select {
		case <-g.Done():
		default:
			return fmt.Errorf("member open on %v, told %+v", g.Info().Subscriptions, ended)
		}
		if len(ended) == 0 {
			return errors.New("member closed, not told why")
		}
		return nil
	})
	if len(ended) != 1 || ended[0].SubscriptionID != queue || ended[0].Topic != "t" || !errors.Is(ended[0].Err, storage.ErrLimitExceeded) {
		t.Fatalf("g's member told %+v, want subscription %d of t ended with ErrLimitExceeded", ended, queue)
	}
	t.Logf("told: %v", ended[0].Err)
	h := members["h"]
	if _, err := other.Publish(ctx, "t", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("after")}}); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, h, 1)[0]; string(d.Payload) != "after" || d.SubscriptionID != queue {
		t.Fatalf("h's member got %+v, want it on subscription %d", d, queue)
	}
	if e := h.TakeEnded(); len(e) != 0 {
		t.Fatalf("h's member told %+v", e)
	}
}

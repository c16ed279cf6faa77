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

// A member whose pattern matches a topic created after it subscribed and that cannot join that
// topic's subscription is told why (EndedSubscription with SubscriptionID 0, the topic and the
// reason) and closed (attachFailed): never left open without the topic.

// waitToldClosed waits until m is told that it could not join topic's subscription, with an error
// wrapping want, and is closed.
func waitToldClosed(t *testing.T, m *Member, topic string, want error) {
	t.Helper()
	var ended []EndedSubscription
	eventually(t, fmt.Sprintf("member %s told and closed", m.ID()), func() error {
		ended = append(ended, m.TakeEnded()...)
		select {
		case <-m.Done():
		default:
			return fmt.Errorf("member open on %v, told %+v", m.Info().Subscriptions, ended)
		}
		if len(ended) == 0 {
			return errors.New("member closed, not told why")
		}
		return nil
	})
	if len(ended) != 1 || ended[0].SubscriptionID != 0 || ended[0].Topic != topic || !errors.Is(ended[0].Err, want) {
		t.Fatalf("member %s told %+v, want subscription 0 of %s with %v", m.ID(), ended, topic, want)
	}
	t.Logf("told: %v", ended[0].Err)
}

// waitAttachedTo waits until m is attached to a subscription of topic and fails if it was told
// anything or closed.
func waitAttachedTo(t *testing.T, m *Member, topic string) {
	t.Helper()
	eventually(t, fmt.Sprintf("member %s attached to %s", m.ID(), topic), func() error {
		for _, a := range m.Subscriptions() {
			if a.Topic == topic {
				return nil
			}
		}
		return errors.New("not attached")
	})
	if e := m.TakeEnded(); len(e) != 0 {
		t.Fatalf("member %s told %+v", m.ID(), e)
	}
	select {
	case <-m.Done():
		t.Fatalf("member %s closed", m.ID())
	default:
	}
}

// TestNewTopicAttachFailureClosesMember: broker a's two pattern members without a group match a
// QUEUE topic created later, but a takes one member per shared subscription (maxSharedMembers 1,
// as past storage.MaxRenewMembers): the one that cannot join is told LIMIT_EXCEEDED for that
// topic and closed, the other joins. The topic is created through a (wal), in the engine (wal: a's
// notifier attaches), or through another instance (PostgreSQL).
func TestNewTopicAttachFailureClosesMember(t *testing.T) {
	t.Parallel()
	shared := func(c *Config) { c.SharedEngine, c.LifecycleInterval = true, time.Hour }
	t.Run("local", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, shared)
		e.b.maxSharedMembers = 1
		testNewTopicAttachFailure(t, e.b, func(ctx context.Context) error {
			_, err := e.b.CreateTopic(ctx, "q.x", queueCfg)
			return err
		})
	})
	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, shared)
		e.b.maxSharedMembers = 1
		testNewTopicAttachFailure(t, e.b, func(ctx context.Context) error {
			_, err := e.engine.TopicCreate(ctx, &storage.TopicCreateParams{Name: "q.x", Config: queueCfg})
			return err
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		a, bi := pgPair(t, "t_bnewtopic_", func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		a.b.maxSharedMembers = 1
		testNewTopicAttachFailure(t, a.b, func(ctx context.Context) error {
			_, err := bi.b.CreateTopic(ctx, "q.x", queueCfg)
			return err
		})
	})
}

func testNewTopicAttachFailure(t *testing.T, a *Broker, create func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	var ms []*Member
	for _, id := range []string{"p1", "p2"} {
		m, err := a.Subscribe(ctx, SubscribeParams{Pattern: "q.*", MemberID: id, MaxInFlight: 10})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	if err := create(ctx); err != nil {
		t.Fatal(err)
	}
	var joined, refused *Member
	eventually(t, "one member attached, the other closed", func() error {
		joined, refused = nil, nil
		for _, m := range ms {
			select {
			case <-m.Done():
				refused = m
				continue
			default:
			}
			if slices.ContainsFunc(m.Subscriptions(), func(a Attachment) bool { return a.Topic == "q.x" }) {
				joined = m
			}
		}
		if joined == nil || refused == nil {
			return fmt.Errorf("attached %v, closed %v", joined != nil, refused != nil)
		}
		return nil
	})
	waitToldClosed(t, refused, "q.x", storage.ErrLimitExceeded)
	waitAttachedTo(t, joined, "q.x")
}

// TestNewTopicModeConflictClosesMember: an ordered member of group g waits for topic t, which does
// not exist yet (an ordered group has no binding); a shared member of g subscribing to t
// registers g's binding, so t's creation gives g a shared subscription. The ordered member
// cannot join it: it is told SUBSCRIPTION_EXISTS (storage.ErrModeConflict) for t and closed; the
// shared member joins. Through the broker (wal) and through another instance (PostgreSQL).
func TestNewTopicModeConflictClosesMember(t *testing.T) {
	t.Parallel()
	t.Run("wal", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		testNewTopicModeConflict(t, e.b, e.b)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		a, bi := pgPair(t, "t_bnewmode_", func(c *Config) { c.PollInterval = 20 * time.Millisecond })
		testNewTopicModeConflict(t, a.b, bi.b)
	})
}

func testNewTopicModeConflict(t *testing.T, a, other *Broker) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	ord, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", MemberID: "o", Mode: storage.ModeOrdered})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := a.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", MemberID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateTopic(ctx, "t", pubSubCfg); err != nil {
		t.Fatal(err)
	}
	waitToldClosed(t, ord, "t", storage.ErrModeConflict)
	waitAttachedTo(t, sh, "t")
}

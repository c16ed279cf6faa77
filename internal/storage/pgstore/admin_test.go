package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// adminFixture is the state every TestAdminTimeout case starts from: PUB_SUB topic "adm.t" (one
// partition) holding messages a and b, and subscription "g" of it from the beginning.
type adminFixture struct {
	e   *Engine
	sub *storage.Subscription
}

// TestAdminTimeout: catalog operations, reads and statistics that wait for a lock another session
// holds fail after Config.TxTimeout with a retryable TIMEOUT instead of waiting for that session;
// once it lets go, nothing of the timed-out call was applied, and the same call succeeds. The
// locks are tables held ACCESS EXCLUSIVE (which blocks plain SELECTs too) or the rows a call
// locks. For the deletes, the locks are taken before the deadline ends (the delete itself is
// not bounded: TestAdminDeleteAfterLocksNotBounded).
func TestAdminTimeout(t *testing.T) {
	t.Parallel()
	const topic = "adm.t"
	cases := []struct {
		name string
		lock func(t *testing.T, f *adminFixture) *blocker
		op   func(t *testing.T, f *adminFixture) (any, error)
		// unchanged checks, after the timed-out call, that it changed nothing.
		unchanged func(t *testing.T, f *adminFixture)
		// done checks the result of the same call once the lock is released.
		done func(t *testing.T, f *adminFixture, res any)
	}{{
		name: "TopicCreate",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`LOCK TABLE spool.bindings IN ACCESS EXCLUSIVE MODE`))
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.TopicCreate(t.Context(), &storage.TopicCreateParams{Name: "adm.new", Config: storage.TopicConfig{Semantics: storage.PubSub}})
		},
		unchanged: func(t *testing.T, f *adminFixture) {
			if tp, err := f.e.TopicGet(t.Context(), "adm.new"); !errors.Is(err, storage.ErrTopicNotFound) {
				t.Errorf("topic after the timed-out create: %+v, %v; want storage.ErrTopicNotFound", tp, err)
			}
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if tp := res.(*storage.Topic); tp.Name != "adm.new" {
				t.Errorf("created topic %q, want adm.new", tp.Name)
			}
		},
	}, {
		name: "TopicUpdate",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`SELECT 1 FROM spool.topics WHERE name = $1 FOR UPDATE`), topic)
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.TopicUpdate(t.Context(), &storage.TopicUpdateParams{Name: topic,
				Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}})
		},
		unchanged: func(t *testing.T, f *adminFixture) {
			if n := len(must(f.e.TopicStats(t.Context(), topic))(t).Partitions); n != 1 {
				t.Errorf("partitions after the timed-out update: %d, want 1", n)
			}
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if n := res.(*storage.Topic).Config.Partitions; n != 2 {
				t.Errorf("partitions after the update: %d, want 2", n)
			}
		},
	}, {
		name: "SubscriptionCreate",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`SELECT 1 FROM spool.topics WHERE name = $1 FOR UPDATE`), topic)
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.SubscriptionCreate(t.Context(), &storage.SubscriptionCreateParams{Topic: topic, Group: "g2",
				Start: storage.StartPosition{Kind: storage.FromBeginning}})
		},
		unchanged: func(t *testing.T, f *adminFixture) {
			if s, err := f.e.SubscriptionGetByGroup(t.Context(), topic, "g2"); !errors.Is(err, storage.ErrSubscriptionNotFound) {
				t.Errorf("subscription after the timed-out create: %+v, %v; want storage.ErrSubscriptionNotFound", s, err)
			}
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if s := res.(*storage.Subscription); s.Group != "g2" || s.State != storage.Active {
				t.Errorf("created subscription of group %q, %s; want g2, ACTIVE", s.Group, s.State)
			}
		},
	}, {
		name: "MessagesRead",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`LOCK TABLE spool.messages IN ACCESS EXCLUSIVE MODE`))
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.MessagesRead(t.Context(), &storage.MessagesReadParams{Topic: topic})
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if ms := res.([]*storage.Message); len(ms) != 2 || string(ms[0].Payload) != "a" || string(ms[1].Payload) != "b" {
				t.Errorf("read %d messages, want a and b", len(ms))
			}
		},
	}, {
		name: "TopicStats",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`LOCK TABLE spool.partitions IN ACCESS EXCLUSIVE MODE`))
		},
		op: func(t *testing.T, f *adminFixture) (any, error) { return f.e.TopicStats(t.Context(), topic) },
		done: func(t *testing.T, f *adminFixture, res any) {
			if st := res.(*storage.TopicStats); st.Messages != 2 {
				t.Errorf("topic stats: %d messages, want 2", st.Messages)
			}
		},
	}, {
		name: "SubscriptionStats",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`LOCK TABLE spool.deliveries IN ACCESS EXCLUSIVE MODE`))
		},
		op: func(t *testing.T, f *adminFixture) (any, error) { return f.e.SubscriptionStats(t.Context(), f.sub.ID) },
		done: func(t *testing.T, f *adminFixture, res any) {
			if st := res.(*storage.SubscriptionStats); st.Lag != 2 || st.Pending != 2 {
				t.Errorf("subscription stats: lag %d, pending %d; want 2, 2", st.Lag, st.Pending)
			}
		},
	}, {
		name: "SubscriptionUpdate",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`SELECT 1 FROM spool.subscriptions WHERE id = $1 FOR UPDATE`), f.sub.ID)
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.SubscriptionUpdate(t.Context(), &storage.SubscriptionUpdateParams{ID: f.sub.ID, State: storage.Paused})
		},
		unchanged: func(t *testing.T, f *adminFixture) {
			if s := must(f.e.SubscriptionGet(t.Context(), f.sub.ID))(t); s.State != storage.Active {
				t.Errorf("subscription after the timed-out update: %s, want ACTIVE", s.State)
			}
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if s := res.(*storage.Subscription); s.State != storage.Paused {
				t.Errorf("subscription after the update: %s, want PAUSED", s.State)
			}
		},
	}, {
		name: "SubscriptionDelete", // waits for the sub_partitions rows, as for a delivery transaction
		lock: func(t *testing.T, f *adminFixture) *blocker { return lockSub(t, f.e, f.sub.ID) },
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return nil, f.e.SubscriptionDelete(t.Context(), f.sub.ID)
		},
		unchanged: func(t *testing.T, f *adminFixture) {
			if s := must(f.e.SubscriptionGet(t.Context(), f.sub.ID))(t); s.State != storage.Active {
				t.Errorf("subscription after the timed-out delete: %s, want ACTIVE", s.State)
			}
			if st := must(f.e.SubscriptionStats(t.Context(), f.sub.ID))(t); st.Lag != 2 || len(st.Partitions) != 1 {
				t.Errorf("subscription stats after the timed-out delete: lag %d, %d partitions; want its delivery state (lag 2, 1 partition)",
					st.Lag, len(st.Partitions))
			}
		},
		done: func(t *testing.T, f *adminFixture, _ any) {
			if s, err := f.e.SubscriptionGet(t.Context(), f.sub.ID); !errors.Is(err, storage.ErrSubscriptionNotFound) {
				t.Errorf("subscription after the delete: %+v, %v; want storage.ErrSubscriptionNotFound", s, err)
			}
		},
	}, {
		name: "TopicDelete", // waits for the partition rows, as for a publisher in flight
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id WHERE t.name = $1 FOR UPDATE OF p`), topic)
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return nil, f.e.TopicDelete(t.Context(), &storage.TopicDeleteParams{Name: topic, Force: true})
		},
		unchanged: func(t *testing.T, f *adminFixture) {
			must(f.e.TopicGet(t.Context(), topic))(t)
			if s := must(f.e.SubscriptionGet(t.Context(), f.sub.ID))(t); s.State != storage.Active {
				t.Errorf("subscription after the timed-out topic delete: %s, want ACTIVE", s.State)
			}
		},
		done: func(t *testing.T, f *adminFixture, _ any) {
			if tp, err := f.e.TopicGet(t.Context(), topic); !errors.Is(err, storage.ErrTopicNotFound) {
				t.Errorf("topic after the delete: %+v, %v; want storage.ErrTopicNotFound", tp, err)
			}
		},
	}, {
		name: "SubscriptionAssignment", // an ordered group's owner rebalancing, the group listing
		lock: func(t *testing.T, f *adminFixture) *blocker {
			f.sub = must(f.e.SubscriptionCreate(t.Context(), &storage.SubscriptionCreateParams{Topic: topic, Group: "o",
				Mode: storage.ModeOrdered, Start: storage.StartPosition{Kind: storage.FromBeginning}}))(t)
			return lockRows(t, f.e.sql(`LOCK TABLE spool.sub_assignments IN ACCESS EXCLUSIVE MODE`))
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.SubscriptionAssignment(t.Context(), f.sub.ID)
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if a := res.(*storage.Assignment); a.SubscriptionID != f.sub.ID {
				t.Errorf("assignment of subscription %d, want %d", a.SubscriptionID, f.sub.ID)
			}
		},
	}, {
		name: "MessageCompletion",
		lock: func(t *testing.T, f *adminFixture) *blocker {
			logTopic(t, f.e, "adm.rc", storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount})
			logPublish(t, f.e, "adm.rc", 0, "c")
			return lockRows(t, f.e.sql(`LOCK TABLE spool.completions IN ACCESS EXCLUSIVE MODE`))
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.MessageCompletion(t.Context(), &storage.MessageCompletionParams{Topic: "adm.rc"})
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if c := res.(*storage.MessageCompletion); c == nil {
				t.Error("no completion record")
			}
		},
	}, {
		name: "SubscriptionsMaintain", // the lifecycle loop
		lock: func(t *testing.T, f *adminFixture) *blocker {
			return lockRows(t, f.e.sql(`LOCK TABLE spool.subscriptions IN ACCESS EXCLUSIVE MODE`))
		},
		op: func(t *testing.T, f *adminFixture) (any, error) {
			return f.e.SubscriptionsMaintain(t.Context(), &storage.SubscriptionsMaintainParams{})
		},
		unchanged: func(t *testing.T, f *adminFixture) {
			if s := must(f.e.SubscriptionGet(t.Context(), f.sub.ID))(t); s.State != storage.Active {
				t.Errorf("subscription after the timed-out maintenance: %s, want ACTIVE", s.State)
			}
		},
		done: func(t *testing.T, f *adminFixture, res any) {
			if r := res.(*storage.SubscriptionsMaintainResult); len(r.Dead) != 0 {
				t.Errorf("maintenance made %d subscriptions DEAD, want none", len(r.Dead))
			}
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := openTxTimeout(t, 4)
			logTopic(t, e, topic, storage.TopicConfig{Semantics: storage.PubSub})
			f := &adminFixture{e: e, sub: logSub(t, e, topic, "g")}
			logPublish(t, e, topic, 0, "a", "b")

			b := c.lock(t, f)
			t0 := time.Now()
			checkTimeoutErr(t, awaitOut(t, goOp(c.name, func() (any, error) { return c.op(t, f) }), t0, c.name))
			checkPoolIdle(t, e)
			b.release()
			if c.unchanged != nil {
				c.unchanged(t, f)
			}
			c.done(t, f, must(c.op(t, f))(t))
		})
	}
}

// TestAdminDeleteAfterLocksNotBounded: the calls that change as many rows as a subscription's DLQ
// holds (a subscription delete, a DLQ purge or replay) bound only the wait for their locks, not
// the statement that follows: a DLQ of millions of entries must stay deletable. Here the statement
// waits for a DLQ row another session holds, past three deadlines, and the call still succeeds
// once the row is let go.
func TestAdminDeleteAfterLocksNotBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		op    func(ctx context.Context, e *Engine, sub *storage.Subscription) (int, error)
		check func(t *testing.T, e *Engine, sub *storage.Subscription, n int)
	}{{
		name: "SubscriptionDelete",
		op: func(ctx context.Context, e *Engine, sub *storage.Subscription) (int, error) {
			return 0, e.SubscriptionDelete(ctx, sub.ID)
		},
		check: func(t *testing.T, e *Engine, sub *storage.Subscription, _ int) {
			if s, err := e.SubscriptionGet(t.Context(), sub.ID); !errors.Is(err, storage.ErrSubscriptionNotFound) {
				t.Errorf("subscription after the delete: %+v, %v; want storage.ErrSubscriptionNotFound", s, err)
			}
		},
	}, {
		name: "DLQPurge",
		op: func(ctx context.Context, e *Engine, sub *storage.Subscription) (int, error) {
			return e.DLQPurge(ctx, &storage.DLQPurgeParams{SubscriptionID: sub.ID})
		},
		check: func(t *testing.T, e *Engine, sub *storage.Subscription, n int) {
			left := must(e.DLQList(t.Context(), &storage.DLQListParams{SubscriptionID: sub.ID}))(t)
			if n != 2 || len(left) != 0 {
				t.Errorf("purge: %d purged, %d left; want 2 and 0", n, len(left))
			}
		},
	}, {
		name: "DLQReplay",
		op: func(ctx context.Context, e *Engine, sub *storage.Subscription) (int, error) {
			return e.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: sub.ID})
		},
		check: func(t *testing.T, e *Engine, sub *storage.Subscription, n int) {
			res := must(e.DeliveriesClaim(t.Context(), &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: 10}))(t)
			if got := storagetest.OffsetsOf(res.Deliveries); n != 2 || len(got) != 2 {
				t.Errorf("replay: %d replayed, then claimed offsets %v; want 2 and the 2 replayed messages", n, got)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, sub, held := openHeld(t, "adm.dlq", "a", "b")
			ctx := t.Context()
			must(e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: sub.ID, Member: "m", Refs: storagetest.RefsOf(held), ToDLQ: true}))(t)

			b := lockRows(t, e.sql(`SELECT 1 FROM spool.dlq WHERE sub_id = $1 FOR UPDATE`), sub.ID)
			t0 := time.Now()
			out := goOp(tc.name, func() (int, error) { return tc.op(ctx, e, sub) })
			awaitBlockedBy(t, e, b.pid())
			// The call cannot finish while the DLQ row is held: an answer now is the deadline's.
			select {
			case o := <-out:
				t.Fatalf("%s while a DLQ row is held: %v after %s, want it to wait past the deadline %s", tc.name, o.err, time.Since(t0), testTxTimeout)
			case <-time.After(time.Until(t0.Add(3 * testTxTimeout))):
			}
			b.release()
			o := awaitOut(t, out, time.Now(), tc.name)
			if o.err != nil {
				t.Fatalf("%s once the DLQ row was let go: %v", tc.name, o.err)
			}
			tc.check(t, e, sub, o.res.(int))
		})
	}
}

package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
	spooltest "github.com/spoolmq/spool/internal/testutil"
)

// TestExpiredMetric: the broker's retention job, wired to ObserveRetention as serve wires it,
// counts in spool_messages_expired_total{topic,reason} exactly the messages retention removed
// while a subscription had not completed them, on both engines; messages no subscription needed
// are not counted, and later runs do not count them again.
func TestExpiredMetric(t *testing.T) {
	t.Parallel()
	t.Run("wal", func(t *testing.T) {
		t.Parallel()
		testExpiredMetric(t, func(clock storage.Clock) storage.Engine {
			eng, err := wal.Open(t.TempDir(), wal.Config{Clock: clock})
			if err != nil {
				t.Fatalf("wal.Open: %v", err)
			}
			return eng
		})
	})
	t.Run("pgstore", func(t *testing.T) {
		t.Parallel()
		url := spooltest.DatabaseURL(t)
		testExpiredMetric(t, func(clock storage.Clock) storage.Engine {
			schema := spooltest.PGSchema(t, url, "t_metrics_")
			eng, err := pgstore.Open(context.Background(), pgstore.Config{URL: url, Schema: schema, Clock: clock, Migrate: true,
				MaxConns: 4, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("pgstore.Open: %v", err)
			}
			return eng
		})
	})
}

func testExpiredMetric(t *testing.T, open func(storage.Clock) storage.Engine) {
	ctx := context.Background()
	clock := storagetest.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	eng := open(clock)
	reg := prometheus.NewRegistry()
	m := New(reg)
	var runs atomic.Int64
	b, err := broker.New(broker.Config{Engine: eng, Clock: clock, Logger: testLogger(t), RetentionInterval: 5 * time.Millisecond,
		OnRetention: func(res *storage.RetentionResult) {
			m.ObserveRetention(res)
			runs.Add(1)
		}})
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, waitTimeout)
		defer cancel()
		if err := b.Stop(sctx); err != nil {
			t.Errorf("broker.Stop: %v", err)
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine.Close: %v", err)
		}
	})
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	publish := func(topic string, n int) {
		t.Helper()
		msgs := make([]storage.AppendMessage, n)
		for i := range msgs {
			msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("x")}
		}
		_, err := b.Publish(ctx, topic, msgs)
		must(err, "publish to "+topic)
	}
	short := storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Second, ZeroSubscriptionRetention: 2 * time.Second,
		MaxRetention: 3 * time.Second}
	subscribe := func(topic, group string) *storage.Subscription {
		t.Helper()
		s, err := eng.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: group,
			Start: storage.StartPosition{Kind: storage.FromBeginning}})
		must(err, "subscribe "+group)
		return s
	}
	// exp.max: 5 messages group g never completed, past max_retention.
	_, err = b.CreateTopic(ctx, "exp.max", short)
	must(err, "create exp.max")
	subscribe("exp.max", "g")
	publish("exp.max", 5)
	// exp.zero: 4 messages a DEAD group had not completed, past zero_subscription_retention.
	zero := short
	zero.MaxRetention = time.Hour // else max_retention, which comes first, would be the reason
	_, err = b.CreateTopic(ctx, "exp.zero", zero)
	must(err, "create exp.zero")
	d := subscribe("exp.zero", "d")
	_, err = eng.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: d.ID, State: storage.Dead})
	must(err, "DEAD")
	publish("exp.zero", 4)
	// exp.none: 3 messages no subscription needed: deleted, not expired.
	_, err = b.CreateTopic(ctx, "exp.none", short)
	must(err, "create exp.none")
	publish("exp.none", 3)

	clock.Advance(4 * time.Second)
	want := []struct {
		topic, reason string
		n             float64
	}{{"exp.max", "max_retention", 5}, {"exp.zero", "zero_subscription", 4}}
	check := func() error {
		for _, w := range want {
			got, ok := sample(t, reg, "spool_messages_expired_total", map[string]string{"topic": w.topic, "reason": w.reason})
			if !ok || got != w.n {
				return fmt.Errorf("spool_messages_expired_total{topic=%q,reason=%q} = %v (present %v), want %v", w.topic, w.reason, got, ok, w.n)
			}
		}
		if n := countSeries(t, reg, "spool_messages_expired_total"); n != len(want) {
			return fmt.Errorf("%d series of spool_messages_expired_total, want %d (exp.none is never counted)", n, len(want))
		}
		return nil
	}
	waitFor(t, "the retention job counted the expired messages", func() error {
		for _, topic := range []string{"exp.max", "exp.zero", "exp.none"} {
			st, err := eng.TopicStats(ctx, topic)
			if err != nil {
				return err
			}
			if st.Messages != 0 {
				return fmt.Errorf("%s: %d messages retained", topic, st.Messages)
			}
		}
		return check()
	})
	// Later runs count nothing again.
	after := runs.Load() + 3
	waitFor(t, "three more retention runs", func() error {
		if n := runs.Load(); n < after {
			return fmt.Errorf("%d runs, waiting for %d", n, after)
		}
		return nil
	})
	if err := check(); err != nil {
		t.Fatal(err)
	}
}

// countSeries returns the number of series of the metric name.
func countSeries(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// TestCleanupFailureMetric: a failed run of the broker's retention job counts in
// spool_cleanup_job_failures_total{task="retention"} (the series the alert rules read; it replaced
// spool_cleanup_failures_total, which counted the same runs), which exists at 0 from the broker's
// start (so that increase() in the alert rule sees the first failure). The failure is real: the
// PostgreSQL table retention reads is renamed under the engine. Only the cleanup collector is
// registered: the broker collector would fail its scrapes on the renamed table.
func TestCleanupFailureMetric(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := spooltest.DatabaseURL(t)
	schema := spooltest.PGSchema(t, url, "t_metrics_")
	eng, err := pgstore.Open(ctx, pgstore.Config{URL: url, Schema: schema, Migrate: true, MaxConns: 4,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	b, err := broker.New(broker.Config{Engine: eng, Logger: slog.New(slog.DiscardHandler), RetentionInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, waitTimeout)
		defer cancel()
		if err := b.Stop(sctx); err != nil {
			t.Errorf("broker.Stop: %v", err)
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine.Close: %v", err)
		}
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCleanupCollector(b))
	task := map[string]string{"task": broker.JobRetention}
	if got := mustSample(t, reg, "spool_cleanup_job_failures_total", task); got != 0 {
		t.Fatalf("spool_cleanup_job_failures_total = %v before any failure, want 0", got)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, "topics"}.Sanitize()+" RENAME TO topics_gone"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed retention run counted", func() error {
		if got := mustSample(t, reg, "spool_cleanup_job_failures_total", task); got < 1 {
			return fmt.Errorf("spool_cleanup_job_failures_total = %v", got)
		}
		return nil
	})
}

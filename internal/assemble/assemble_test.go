package assemble

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

const waitTimeout = 15 * time.Second

// TestMain fails the package when goroutines outlive the tests.
func TestMain(m *testing.M) {
	os.Exit(testutil.RunLeakChecked(m, 5*time.Second))
}

// instance is one broker instance built as spool serve builds it: engine, metrics and broker.
type instance struct {
	b   *broker.Broker
	m   *metrics.Metrics
	reg *prometheus.Registry
}

// startInstance opens the engine of cfg with OpenEngine and starts a broker on it with
// BrokerConfig; both stop at cleanup.
func startInstance(t *testing.T, cfg config.Config) *instance {
	t.Helper()
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	in := &instance{reg: prometheus.NewRegistry()}
	in.m = metrics.New(in.reg)
	eng, err := OpenEngine(ctx, cfg, logger, in.m)
	if err != nil {
		t.Fatal(err)
	}
	if in.b, err = broker.New(BrokerConfig(cfg, eng, logger, in.m)); err != nil {
		_ = eng.Close()
		t.Fatal(err)
	}
	if err := in.b.Start(ctx); err != nil {
		_ = eng.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := in.b.Stop(ctx); err != nil {
			t.Errorf("broker stop: %v", err)
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine close: %v", err)
		}
	})
	return in
}

// pgConfig is the configuration of an instance on a fresh schema of the test database; the
// background jobs are off (the test reports what they would).
func pgConfig(t *testing.T) config.Config {
	url := testutil.DatabaseURL(t)
	cfg := config.Defaults()
	cfg.Store = url
	cfg.Postgres.Schema = testutil.PGSchema(t, url, "t_assemble_")
	cfg.Postgres.MaxConns = 4
	cfg.Broker.RetentionInterval = -1
	cfg.Broker.LifecycleInterval = -1
	return cfg
}

// TestTopicDeletedElsewhereForgotten: two instances share a PostgreSQL schema. B counts a topic's
// publishes, deliveries and acks; A deletes the topic: B's registry loses the topic's series (B
// has no broker collector, so the engine's notification is what tells it), and the expiry of the
// deleted topic's staged messages that B's next retention run would report, or an ack that raced
// the deletion, does not make them again.
func TestTopicDeletedElsewhereForgotten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := pgConfig(t)
	a, b := startInstance(t, cfg), startInstance(t, cfg)
	const topic = "orders.gone"
	if _, err := b.b.Publish(ctx, topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	// What B's server records for that publish, a delivery and its ack.
	b.m.ObservePublish(topic, 1, time.Millisecond)
	b.m.ObserveDelivery(topic, storage.QueueGroup, 1, time.Now())
	b.m.ObserveAck(topic, storage.QueueGroup, 1)
	published := map[string]string{"topic": topic}
	acked := map[string]string{"topic": topic, "group": storage.QueueGroup}
	testutil.ExpectMetric(t, b.reg, "spool_messages_published_total", published, 1)

	if err := a.b.DeleteTopic(ctx, topic, true); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "B forgets the topic A deleted", func() error {
		for _, name := range []string{"spool_messages_published_total", "spool_messages_acked_total", "spool_messages_delivered_total"} {
			labels := acked
			if name == "spool_messages_published_total" {
				labels = published
			}
			if _, ok := testutil.MetricValue(t, b.reg, name, labels); ok {
				return fmt.Errorf("%s%v still exported", name, labels)
			}
		}
		return nil
	})

	b.m.ObserveRetention(&storage.RetentionResult{MessagesExpired: 3,
		Expired: []storage.ExpiredCount{{Topic: topic, Reason: storage.ExpiredTopicDeleted, Messages: 3}}})
	b.m.ObserveAck(topic, storage.QueueGroup, 1)
	if _, ok := testutil.MetricValue(t, b.reg, "spool_messages_expired_total", map[string]string{"topic": topic, "reason": "topic_deleted"}); ok {
		t.Error("an expiry after the deletion made the topic's expired series again")
	}
	if _, ok := testutil.MetricValue(t, b.reg, "spool_messages_acked_total", acked); ok {
		t.Error("an ack after the deletion made the topic's acked series again")
	}
	testutil.ExpectMetric(t, b.reg, "spool_messages_expired_total", map[string]string{"topic": metrics.TopicDeleted, "reason": "topic_deleted"}, 3)
}

// TestGroupRemovedElsewhereForgotten: two instances share a PostgreSQL schema and B exports its
// broker metrics as serve does. B counts acks of two groups; A removes one: B's scrapes stop
// exporting that group's series and keep the other's.
func TestGroupRemovedElsewhereForgotten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := pgConfig(t)
	a, b := startInstance(t, cfg), startInstance(t, cfg)
	if err := b.m.RegisterBroker(b.b, metrics.CollectorOptions{}); err != nil {
		t.Fatal(err)
	}
	const topic = "orders"
	if _, err := a.b.CreateTopic(ctx, topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"billing", "shipping"} {
		if _, err := a.b.CreateGroup(ctx, broker.CreateGroupParams{Topic: topic, Group: g}); err != nil {
			t.Fatal(err)
		}
		b.m.ObserveAck(topic, g, 1)
	}
	shipping := map[string]string{"topic": topic, "group": "shipping"}
	testutil.ExpectMetric(t, b.reg, "spool_messages_acked_total", shipping, 1)

	if _, err := a.b.RemoveGroup(ctx, topic, "shipping"); err != nil {
		t.Fatal(err)
	}
	// The scrape that sweeps may have collected the hook series already: a later one has not.
	testutil.Eventually(t, waitTimeout, "B forgets the group A removed", func() error {
		if _, ok := testutil.MetricValue(t, b.reg, "spool_messages_acked_total", shipping); ok {
			return fmt.Errorf("spool_messages_acked_total%v still exported", shipping)
		}
		return nil
	})
	testutil.ExpectMetric(t, b.reg, "spool_messages_acked_total", map[string]string{"topic": topic, "group": "billing"}, 1)
}

// TestEngineDeadLettersCounted: the dead-letters the engine makes on its own, not in a nack, are
// counted in spool_messages_dead_lettered_total with the subscription's labels, on both engines
// built as serve builds them: a lease that expired on its last attempt (max_deliveries 1),
// dead-lettered by the claim that follows its deadline (shared and ordered groups), and a lease on
// its last attempt that a member leaving releases.
func TestEngineDeadLettersCounted(t *testing.T) {
	t.Parallel()
	t.Run("wal", func(t *testing.T) {
		t.Parallel()
		cfg := config.Defaults()
		cfg.DataDir = t.TempDir()
		cfg.WAL.UnsafeNoSync = true
		cfg.Broker.RetentionInterval = -1
		cfg.Broker.LifecycleInterval = -1
		testEngineDeadLettersCounted(t, cfg)
	})
	t.Run("pgstore", func(t *testing.T) {
		t.Parallel()
		testEngineDeadLettersCounted(t, pgConfig(t))
	})
}

func testEngineDeadLettersCounted(t *testing.T, cfg config.Config) {
	ctx := context.Background()
	in := startInstance(t, cfg)
	const topic = "jobs"
	if _, err := in.b.CreateTopic(ctx, topic, storage.TopicConfig{Semantics: storage.Queue, MaxDeliveries: 1}); err != nil {
		t.Fatal(err)
	}
	publish := func() {
		t.Helper()
		if _, err := in.b.Publish(ctx, topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
	}
	receive := func(m *broker.Member) *storage.Delivery {
		t.Helper()
		select {
		case d := <-m.Deliveries():
			return d
		case <-time.After(waitTimeout):
			t.Fatal("no delivery")
			return nil
		}
	}
	labels := map[string]string{"topic": topic, "group": storage.QueueGroup}

	// A lease of 100 ms on the last attempt: the owner's claim at its deadline dead-letters it.
	publish()
	short, err := in.b.Subscribe(ctx, broker.SubscribeParams{Pattern: topic, MaxInFlight: 1, LeaseDuration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if d := receive(short); d.Attempt != 1 {
		t.Fatalf("attempt %d, want 1", d.Attempt)
	}
	testutil.Eventually(t, waitTimeout, "the expired lease counted as dead-lettered", func() error {
		if v, _ := testutil.MetricValue(t, in.reg, "spool_messages_dead_lettered_total", labels); v != 1 {
			return fmt.Errorf("spool_messages_dead_lettered_total%v = %v, want 1", labels, v)
		}
		return nil
	})
	if err := short.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// A lease on the last attempt released by its member leaving.
	publish()
	long, err := in.b.Subscribe(ctx, broker.SubscribeParams{Pattern: topic, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	receive(long)
	if err := long.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.ExpectMetric(t, in.reg, "spool_messages_dead_lettered_total", labels, 2)
	if _, ok := testutil.MetricValue(t, in.reg, "spool_messages_nacked_total", labels); ok {
		t.Error("dead-letters without a nack counted as nacked")
	}

	// An ordered group's claims dead-letter its expired leases the same way.
	const ordered = "jobs.ordered"
	if _, err := in.b.CreateTopic(ctx, ordered, storage.TopicConfig{Semantics: storage.PubSub, MaxDeliveries: 1}); err != nil {
		t.Fatal(err)
	}
	member, err := in.b.Subscribe(ctx, broker.SubscribeParams{Pattern: ordered, Group: "o", Mode: storage.ModeOrdered,
		Start: storage.StartPosition{Kind: storage.FromBeginning}, LeaseDuration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = member.Close(ctx) }()
	if _, err := in.b.Publish(ctx, ordered, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	receive(member)
	labels = map[string]string{"topic": ordered, "group": "o"}
	testutil.Eventually(t, waitTimeout, "the ordered group's expired lease counted as dead-lettered", func() error {
		if v, _ := testutil.MetricValue(t, in.reg, "spool_messages_dead_lettered_total", labels); v != 1 {
			return fmt.Errorf("spool_messages_dead_lettered_total%v = %v, want 1", labels, v)
		}
		return nil
	})
}

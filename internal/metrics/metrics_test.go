package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	spooltest "github.com/spoolmq/spool/internal/testutil"
)

const waitTimeout = 15 * time.Second

// TestMain fails the package when goroutines outlive the tests.
func TestMain(m *testing.M) {
	os.Exit(spooltest.RunLeakChecked(m, 5*time.Second))
}

// newBroker starts a broker on a real wal engine in a temporary directory; both stop at cleanup.
func newBroker(t *testing.T) *broker.Broker {
	t.Helper()
	return newBrokerIn(t, t.TempDir())
}

// newBrokerIn is newBroker on the data directory dir.
func newBrokerIn(t *testing.T, dir string) *broker.Broker {
	t.Helper()
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	b, err := broker.New(broker.Config{Engine: eng, Logger: testLogger(t), RetentionInterval: -1})
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("broker.Stop: %v", err)
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine.Close: %v", err)
		}
	})
	return b
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SPOOL_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// sample returns the value of the series name{labels} and whether it exists.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := make(map[string]string)
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

func mustSample(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := sample(t, g, name, labels)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// waitFor polls cond until it returns nil or waitTimeout passes.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	spooltest.Eventually(t, waitTimeout, what, cond)
}

func TestHooks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.ObservePublish("orders", 3, 2*time.Millisecond)
	m.ObservePublish("orders", 2, time.Millisecond)
	m.ObservePublishError("TOPIC_NOT_FOUND")
	m.ObserveDelivery("orders", "billing", 1, time.Now().Add(-time.Second))
	m.ObserveDelivery("orders", "billing", 2, time.Now())
	m.ObserveDelivery("orders", "$ephemeral-17", 1, time.Now())
	m.ObserveAck("orders", "billing", 4)
	m.ObserveNack("orders", "billing", 0, 2)
	m.ObserveNack("orders", "billing", 1, 1)
	m.ObserveFsync(300*time.Microsecond, 12, 1)
	m.ConnectionOpened(ProtocolBinary)
	m.ConnectionOpened(ProtocolBinary)
	m.ConnectionClosed(ProtocolBinary)
	m.ObserveHTTPRequest("GET /healthz", 200, time.Millisecond)
	m.ObserveRetention(&storage.RetentionResult{MessagesDeleted: 9, MessagesExpired: 7, Expired: []storage.ExpiredCount{
		{Topic: "orders", Reason: storage.ExpiredMaxRetention, Messages: 4},
		{Topic: "orders", Reason: storage.ExpiredDeadSubscription, Messages: 3},
	}})
	m.ObserveRetention(&storage.RetentionResult{MessagesExpired: 2, Expired: []storage.ExpiredCount{
		{Topic: "orders", Reason: storage.ExpiredMaxRetention, Messages: 2},
	}, Zombies: []storage.ZombieCount{{Topic: "orders", Group: "billing", SubscriptionID: 7, Messages: 5}},
		SizeRemoved: []storage.SizeRemoval{{Topic: "orders", Messages: 8, Bytes: 800}}})

	topic := map[string]string{"topic": "orders"}
	billing := map[string]string{"topic": "orders", "group": "billing"}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spool_messages_published_total", topic, 5},
		{"spool_publish_duration_seconds", nil, 2},
		{"spool_publish_errors_total", map[string]string{"code": "TOPIC_NOT_FOUND"}, 1},
		{"spool_messages_delivered_total", billing, 2},
		{"spool_messages_redelivered_total", billing, 1},
		{"spool_messages_delivered_total", map[string]string{"topic": "orders", "group": GroupEphemeral}, 1},
		{"spool_end_to_end_latency_seconds", topic, 2},
		{"spool_messages_acked_total", billing, 4},
		{"spool_messages_nacked_total", billing, 4},
		{"spool_messages_dead_lettered_total", billing, 3},
		{"spool_messages_expired_total", map[string]string{"topic": "orders", "reason": "max_retention"}, 6},
		{"spool_messages_expired_total", map[string]string{"topic": "orders", "reason": "dead_subscription"}, 3},
		{"spool_zombie_messages_total", billing, 5},
		{"spool_retention_size_removed_total", topic, 8},
		{"spool_wal_fsync_duration_seconds", nil, 1},
		{"spool_wal_fsync_records", nil, 1},
		{"spool_connections", map[string]string{"protocol": "binary"}, 1},
		{"spool_connections_total", map[string]string{"protocol": "binary"}, 2},
		{"spool_http_requests_total", map[string]string{"route": "GET /healthz", "code": "200"}, 1},
		{"spool_http_request_duration_seconds", map[string]string{"route": "GET /healthz"}, 1},
	}
	for _, c := range checks {
		if got := mustSample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	m.ForgetTopic("orders")
	for _, name := range []string{"spool_messages_published_total", "spool_messages_delivered_total", "spool_end_to_end_latency_seconds", "spool_messages_expired_total", "spool_zombie_messages_total",
		"spool_retention_size_removed_total"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 0 {
			t.Errorf("after ForgetTopic: %d series of %s (err %v)", n, name, err)
		}
	}
}

// TestDeliveryObserver: a batch whose deliveries change topic and group counts each in its own
// series, as ObserveDelivery would.
func TestDeliveryObserver(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	o := m.Deliveries()
	now := time.Now()
	for _, d := range []struct {
		topic, group string
		attempt      int
	}{{"a", "g1", 1}, {"a", "g1", 2}, {"b", "g1", 1}, {"b", "g1", 3}, {"a", "g2", 1}, {"a", "g1", 1}, {"a", "$ephemeral-3", 1}} {
		o.Observe(d.topic, d.group, d.attempt, now)
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spool_messages_delivered_total", map[string]string{"topic": "a", "group": "g1"}, 3},
		{"spool_messages_redelivered_total", map[string]string{"topic": "a", "group": "g1"}, 1},
		{"spool_messages_delivered_total", map[string]string{"topic": "b", "group": "g1"}, 2},
		{"spool_messages_redelivered_total", map[string]string{"topic": "b", "group": "g1"}, 1},
		{"spool_messages_delivered_total", map[string]string{"topic": "a", "group": "g2"}, 1},
		{"spool_messages_delivered_total", map[string]string{"topic": "a", "group": GroupEphemeral}, 1},
		{"spool_end_to_end_latency_seconds", map[string]string{"topic": "a"}, 4},
		{"spool_end_to_end_latency_seconds", map[string]string{"topic": "b"}, 1},
	}
	for _, c := range checks {
		if got := mustSample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "spool_messages_redelivered_total"); err != nil || n != 2 {
		t.Errorf("%d redelivered series (err %v), want 2", n, err)
	}
}

func TestNilMetricsRecordNothing(t *testing.T) {
	t.Parallel()
	var m *Metrics
	m.ObservePublish("a", 1, time.Millisecond)
	m.ObservePublishError("X")
	m.ObserveDelivery("a", "", 1, time.Now())
	o := m.Deliveries()
	o.Observe("a", "", 1, time.Now())
	m.ObserveAck("a", "", 1)
	m.ObserveNack("a", "", 1, 1)
	m.ObserveDeadLettered("a", "", 1)
	m.ObserveFsync(time.Millisecond, 1, 1)
	m.ObserveRetention(&storage.RetentionResult{MessagesExpired: 1, Expired: []storage.ExpiredCount{{Topic: "a", Reason: storage.ExpiredMaxRetention, Messages: 1}}})
	m.ConnectionOpened(ProtocolText)
	m.ConnectionClosed(ProtocolText)
	m.ObserveHTTPRequest("x", 200, 0)
	m.ForgetTopic("a")
	if err := m.RegisterBroker(nil, CollectorOptions{}); err == nil {
		t.Fatal("RegisterBroker on a nil *Metrics succeeded")
	}
}

func TestNewWithoutRegisterer(t *testing.T) {
	t.Parallel()
	m := New(nil)
	m.ObservePublish("a", 1, time.Millisecond)
	if err := m.RegisterBroker(newBroker(t), CollectorOptions{}); err == nil {
		t.Fatal("RegisterBroker without a registerer succeeded")
	}
}

// TestLint checks the exposition with promlint: only the three names the seed fixes may break the
// conventions (message_throughput is a counter without _total).
func TestLint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	b := newBroker(t)
	if err := m.RegisterBroker(b, CollectorOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.Publish(ctx, "lint.topic", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	m.ObservePublish("lint.topic", 1, time.Millisecond)
	m.ObserveDelivery("lint.topic", "g", 1, time.Now())
	m.ObserveAck("lint.topic", "g", 1)
	m.ObserveNack("lint.topic", "g", 0, 1)
	m.ObserveFsync(time.Millisecond, 1, 1)
	m.ConnectionOpened(ProtocolBinary)
	m.ObserveHTTPRequest("GET /x", 200, time.Millisecond)
	m.ObservePublishError("CLOSED")
	m.ObserveRetention(&storage.RetentionResult{MessagesExpired: 1, Expired: []storage.ExpiredCount{{Topic: "lint.topic", Reason: storage.ExpiredZeroSubscription, Messages: 1}}})
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if p.Metric == "message_throughput" {
			continue
		}
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestRegisterBrokerTwiceFails(t *testing.T) {
	t.Parallel()
	m := New(prometheus.NewRegistry())
	b := newBroker(t)
	if err := m.RegisterBroker(b, CollectorOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterBroker(b, CollectorOptions{}); err == nil {
		t.Fatal("second RegisterBroker succeeded")
	}
}

func TestBrokerCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	b := newBroker(t)
	if err := m.RegisterBroker(b, CollectorOptions{Logger: testLogger(t)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	if got := mustSample(t, reg, "spool_broker_up", nil); got != 1 {
		t.Fatalf("spool_broker_up = %v, want 1", got)
	}
	// orders has a size bound its queue keeps it above (nobody consumes: keep_needed).
	if _, err := b.CreateTopic(ctx, "orders", storage.TopicConfig{MaxMessages: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic(ctx, "events", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	// Two durable groups and two ephemeral subscribers on events; nobody consumes orders yet.
	var members []*broker.Member
	for _, p := range []broker.SubscribeParams{
		{Pattern: "events", Group: "billing", MaxInFlight: 2},
		{Pattern: "events", Group: "audit"},
		{Pattern: "events"},
		{Pattern: "events"},
	} {
		mem, err := b.Subscribe(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, mem)
	}
	publish := func(topic string, n int) {
		t.Helper()
		msgs := make([]storage.AppendMessage, n)
		for i := range msgs {
			msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "m%d", i)}
		}
		if _, err := b.Publish(ctx, topic, msgs); err != nil {
			t.Fatal(err)
		}
	}
	publish("orders", 3)
	publish("events", 5)

	orders := map[string]string{"topic": "orders"}
	events := map[string]string{"topic": "events"}
	queueSub := map[string]string{"topic": "orders", "group": storage.QueueGroup}
	billing := map[string]string{"topic": "events", "group": "billing"}
	audit := map[string]string{"topic": "events", "group": "audit"}
	eph := map[string]string{"topic": "events", "group": GroupEphemeral}

	if got := mustSample(t, reg, "message_throughput", orders); got != 3 {
		t.Errorf("message_throughput{orders} = %v, want 3", got)
	}
	if got := mustSample(t, reg, "message_throughput", events); got != 5 {
		t.Errorf("message_throughput{events} = %v, want 5", got)
	}
	if got := mustSample(t, reg, "queue_depth", orders); got != 3 {
		t.Errorf("queue_depth{orders} = %v, want 3", got)
	}
	if got := mustSample(t, reg, "consumer_lag", queueSub); got != 3 {
		t.Errorf("consumer_lag{orders,$queue} = %v, want 3", got)
	}
	if got := mustSample(t, reg, "spool_topic_partitions", events); got != 2 {
		t.Errorf("spool_topic_partitions{events} = %v, want 2", got)
	}
	if got := mustSample(t, reg, "spool_topic_subscriptions", events); got != 4 {
		t.Errorf("spool_topic_subscriptions{events} = %v, want 4", got)
	}
	if got := mustSample(t, reg, "spool_topic_messages", orders); got != 3 {
		t.Errorf("spool_topic_messages{orders} = %v, want 3", got)
	}
	if got := mustSample(t, reg, "spool_topic_bytes", orders); got <= 0 {
		t.Errorf("spool_topic_bytes{orders} = %v, want > 0", got)
	}
	if got := mustSample(t, reg, "spool_topic_size_bound_exceeded", orders); got != 1 {
		t.Errorf("spool_topic_size_bound_exceeded{orders} = %v, want 1 (3 messages, max_messages 2)", got)
	}
	if _, ok := sample(t, reg, "spool_topic_size_bound_exceeded", events); ok {
		t.Error("spool_topic_size_bound_exceeded{events} present without a bound")
	}
	if got := mustSample(t, reg, "spool_subscription_members", eph); got != 2 {
		t.Errorf("spool_subscription_members{events,$ephemeral} = %v, want 2", got)
	}
	if got := mustSample(t, reg, "spool_subscription_state", map[string]string{"topic": "events", "group": GroupEphemeral, "state": "ACTIVE"}); got != 2 {
		t.Errorf("ephemeral ACTIVE subscriptions = %v, want 2", got)
	}
	if got := mustSample(t, reg, "spool_broker_members", nil); got != 4 {
		t.Errorf("spool_broker_members = %v, want 4", got)
	}
	// The ephemeral subscribers leave: their subscriptions end with them.
	for _, mem := range members[2:] {
		if err := mem.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := sample(t, reg, "spool_subscription_pending", eph); ok {
		t.Error("ephemeral series still exported after the subscribers left")
	}

	// billing (credit 2) holds 2 leases without acking: its lag drops to 3, pending stays 5; audit
	// acks everything: its pending drops to 0; queue_depth{events} is billing's 5.
	waitFor(t, "billing holds two leases", func() error {
		if lag := mustSample(t, reg, "consumer_lag", billing); lag != 3 {
			return fmt.Errorf("consumer_lag{billing} = %v", lag)
		}
		return nil
	})
	for range 5 {
		select {
		case d := <-members[1].Deliveries():
			if err := members[1].Ack(ctx, d.SubscriptionID, d.Ref()); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("audit got fewer than 5 deliveries")
		}
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spool_subscription_in_flight", billing, 2},
		{"spool_subscription_pending", billing, 5},
		{"consumer_lag", audit, 0},
		{"spool_subscription_pending", audit, 0},
		{"spool_subscription_members", audit, 1},
		{"queue_depth", events, 5},
	}
	for _, c := range checks {
		if got := mustSample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// Dead-lettering one of billing's messages completes it for billing: depth 4.
	d := <-members[0].Deliveries()
	if err := members[0].Nack(ctx, d.SubscriptionID, []storage.DeliveryRef{d.Ref()}, broker.NackOptions{ToDLQ: true}); err != nil {
		t.Fatal(err)
	}
	if got := mustSample(t, reg, "spool_subscription_dead_lettered", billing); got != 1 {
		t.Errorf("dead_lettered{billing} = %v, want 1", got)
	}
	if got := mustSample(t, reg, "queue_depth", events); got != 4 {
		t.Errorf("queue_depth{events} = %v, want 4", got)
	}
	// A PAUSED group still holds retention and counts for the depth.
	if _, err := b.PauseGroup(ctx, "events", "billing"); err != nil {
		t.Fatal(err)
	}
	state := func(group, s string) float64 {
		return mustSample(t, reg, "spool_subscription_state", map[string]string{"topic": "events", "group": group, "state": s})
	}
	if got := state("billing", "PAUSED"); got != 1 {
		t.Errorf("state{billing,PAUSED} = %v, want 1", got)
	}
	if got := state("billing", "ACTIVE"); got != 0 {
		t.Errorf("state{billing,ACTIVE} = %v, want 0", got)
	}
	if got := mustSample(t, reg, "queue_depth", events); got != 4 {
		t.Errorf("queue_depth{events} with billing paused = %v, want 4", got)
	}
	// A CANCELLED group does not: the depth is audit's 0.
	if _, err := b.CancelGroup(ctx, "events", "billing"); err != nil {
		t.Fatal(err)
	}
	if got := state("billing", "CANCELLED"); got != 1 {
		t.Errorf("state{billing,CANCELLED} = %v, want 1", got)
	}
	if got := mustSample(t, reg, "queue_depth", events); got != 0 {
		t.Errorf("queue_depth{events} with billing cancelled = %v, want 0", got)
	}

	for _, mem := range members[:2] {
		if err := mem.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A stopped broker: the scrape still works and says so.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustSample(t, reg, "spool_broker_up", nil); got != 0 {
		t.Errorf("spool_broker_up after Stop = %v, want 0", got)
	}
	if _, ok := sample(t, reg, "queue_depth", orders); ok {
		t.Error("queue_depth still exported after Stop")
	}
	if got := mustSample(t, reg, "spool_metrics_collect_errors_total", nil); got < 1 {
		t.Errorf("collect errors = %v, want >= 1", got)
	}
}

// TestPartitionDamagedMetric: a partition whose log is damaged shows as spool_partition_damaged
// 1; the healthy ones have no series.
func TestPartitionDamagedMetric(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: "t", Config: storage.TopicConfig{Partitions: 2}}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "t",
			Messages: []storage.AppendMessage{{Partition: 1, Payload: []byte("payload")}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, "topics", "t", "1", "00000000000000000000.seg")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[wlog.SegmentHeaderBytes+wlog.FrameHeaderBytes+1] ^= 1
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(strings.TrimSuffix(seg, ".seg") + ".idx"); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	m := New(reg)
	if err := m.RegisterBroker(newBrokerIn(t, dir), CollectorOptions{Logger: testLogger(t)}); err != nil {
		t.Fatal(err)
	}
	if got := mustSample(t, reg, "spool_partition_damaged", map[string]string{"topic": "t", "partition": "1"}); got != 1 {
		t.Fatalf("spool_partition_damaged{t,1} = %v, want 1", got)
	}
	if _, ok := sample(t, reg, "spool_partition_damaged", map[string]string{"topic": "t", "partition": "0"}); ok {
		t.Fatal("spool_partition_damaged of a healthy partition")
	}
}

// A topic at its backlog bound: spool_topic_backpressure_state 2, its backlog, and the refused
// and throttled publishes counted.
func TestBackpressureMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	b := newBroker(t)
	if err := m.RegisterBroker(b, CollectorOptions{Logger: testLogger(t)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.CreateTopic(ctx, "bp", storage.TopicConfig{MaxBacklogMessages: 2}); err != nil {
		t.Fatal(err)
	}
	msg := []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}
	for range 2 {
		if _, err := b.Publish(ctx, "bp", msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.RefreshBackpressure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(ctx, "bp", msg); !errors.Is(err, storage.ErrRateLimited) {
		t.Fatalf("publish at the bound: %v", err)
	}
	topic := map[string]string{"topic": "bp"}
	for name, want := range map[string]float64{"spool_topic_backpressure_state": 2, "spool_topic_backlog_messages": 2,
		"spool_publishes_rejected_total": 1, "spool_publishes_throttled_total": 0} {
		if got := mustSample(t, reg, name, topic); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

package metrics

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// The lifecycle job's runs and transitions are counted; a DELETED subscription leaves a count
// behind (it is gone from every listing); ForgetTopic drops the topic's series.
func TestObserveLifecycle(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	orders := &storage.Subscription{ID: 1, Topic: "orders", Group: "g"}
	m.ObserveLifecycle(&broker.LifecycleResult{Dead: []*storage.Subscription{orders, orders}, Took: time.Millisecond})
	m.ObserveLifecycle(&broker.LifecycleResult{Resurrected: []*storage.Subscription{orders}, Deleted: []*storage.Subscription{orders},
		Err: errors.New("boom")})
	m.ObserveForceComplete("orders", "g", 3)
	m.ObserveForceComplete("orders", "g", 0)
	m.ObserveForceComplete("orders", "$ephemeral-x1", 5)
	m.ObserveForceComplete("orders", "$ephemeral-x2", 1)
	m.ObserveFiltered("orders", "g", 4)
	m.ObserveFiltered("orders", "$ephemeral-x1", 2)
	m.ObserveFiltered("orders", "g", 0)
	nilMetrics0 := (*Metrics)(nil)
	nilMetrics0.ObserveFiltered("orders", "g", 1)
	var nilMetrics *Metrics
	nilMetrics.ObserveLifecycle(&broker.LifecycleResult{Dead: []*storage.Subscription{orders}})
	nilMetrics.ObserveForceComplete("orders", "g", 1)
	topic := map[string]string{"topic": "orders"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spool_subscriptions_dead_total", topic, 2},
		{"spool_subscriptions_resurrected_total", topic, 1},
		{"spool_subscriptions_deleted_total", topic, 1},
		{"spool_messages_force_completed_total", map[string]string{"topic": "orders", "group": "g"}, 3},
		{"spool_messages_force_completed_total", map[string]string{"topic": "orders", "group": GroupEphemeral}, 6},
		{"spool_messages_filtered_total", map[string]string{"topic": "orders", "group": "g"}, 4},
		{"spool_messages_filtered_total", map[string]string{"topic": "orders", "group": GroupEphemeral}, 2},
	} {
		if got := mustSample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	m.ForgetTopic("orders")
	if n, err := testutil.GatherAndCount(reg, "spool_subscriptions_dead_total", "spool_messages_force_completed_total"); err != nil || n != 0 {
		t.Errorf("after ForgetTopic: %d series (err %v)", n, err)
	}
}

type fakeCleanup []broker.CleanupJobStatus

func (f fakeCleanup) CleanupJobs() []broker.CleanupJobStatus { return f }

// The cleanup jobs' figures are exported per job.
func TestCleanupCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	at := time.Unix(1700000000, 0)
	reg.MustRegister(newCleanupCollector(fakeCleanup{
		{Job: broker.JobRetention, Runs: 5, Failures: 2, Removed: 40, LastDuration: 1500 * time.Millisecond, LastSuccess: at, Behind: true, Backlog: 1234},
		{Job: broker.JobSubscriptionLifecycle, Runs: 1},
	}))
	ret := map[string]string{"task": broker.JobRetention}
	life := map[string]string{"task": broker.JobSubscriptionLifecycle}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spool_cleanup_job_runs_total", ret, 5},
		{"spool_cleanup_job_failures_total", ret, 2},
		{"spool_cleanup_job_removed_total", ret, 40},
		{"spool_cleanup_job_last_duration_seconds", ret, 1.5},
		{"spool_cleanup_job_last_success_timestamp_seconds", ret, 1700000000},
		{"spool_cleanup_job_behind", ret, 1},
		{"spool_cleanup_job_runs_total", life, 1},
		{"spool_cleanup_job_last_success_timestamp_seconds", life, 0},
		{"spool_cleanup_job_behind", life, 0},
		{"spool_cleanup_job_backlog", ret, 1234},
		{"spool_cleanup_job_backlog", life, 0},
	} {
		if got := mustSample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// The transitions made outside the lifecycle job reach the counters through the same path serve
// wires (OnLifecycle: ObserveLifecycle), once each: a member attaching to a DEAD group and the
// admin's ResurrectGroup count as resurrections, RemoveGroup's immediate delete as a deletion.
func TestLifecycleMetricsOutsideJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := storagetest.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	eng, err := wal.Open(t.TempDir(), wal.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := New(reg)
	b, err := broker.New(broker.Config{Engine: eng, Clock: clock, Logger: testLogger(t), OnLifecycle: m.ObserveLifecycle})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, waitTimeout)
		defer cancel()
		_ = b.Stop(sctx)
		_ = eng.Close()
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.CreateTopic(ctx, "orders", storage.TopicConfig{Semantics: storage.PubSub})
	must(err)
	sub, err := b.CreateGroup(ctx, broker.CreateGroupParams{Topic: "orders", Group: "g"})
	must(err)
	kill := func() {
		_, err := eng.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub.ID, State: storage.Dead})
		must(err)
	}
	kill()
	_, err = b.ResurrectGroup(ctx, "orders", "g", false)
	must(err)
	kill()
	mem, err := b.Subscribe(ctx, broker.SubscribeParams{Pattern: "orders", Group: "g"})
	must(err)
	must(mem.Close(ctx))
	_, err = b.RemoveGroup(ctx, "orders", "g")
	must(err)
	topic := map[string]string{"topic": "orders"}
	if got := mustSample(t, reg, "spool_subscriptions_resurrected_total", topic); got != 2 {
		t.Errorf("spool_subscriptions_resurrected_total = %v, want 2", got)
	}
	if got := mustSample(t, reg, "spool_subscriptions_deleted_total", topic); got != 1 {
		t.Errorf("spool_subscriptions_deleted_total = %v, want 1", got)
	}
}

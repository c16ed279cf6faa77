package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
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
	var nilMetrics *Metrics
	nilMetrics.ObserveLifecycle(&broker.LifecycleResult{Dead: []*storage.Subscription{orders}})
	topic := map[string]string{"topic": "orders"}
	job := map[string]string{"job": JobSubscriptionLifecycle}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spool_subscriptions_dead_total", topic, 2},
		{"spool_subscriptions_resurrected_total", topic, 1},
		{"spool_subscriptions_deleted_total", topic, 1},
		{"spool_cleanup_job_runs_total", job, 2},
		{"spool_cleanup_job_failures_total", job, 1},
		{"spool_cleanup_job_duration_seconds", job, 2},
	} {
		if got := mustSample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	m.ForgetTopic("orders")
	if n, err := testutil.GatherAndCount(reg, "spool_subscriptions_dead_total"); err != nil || n != 0 {
		t.Errorf("after ForgetTopic: %d series (err %v)", n, err)
	}
}

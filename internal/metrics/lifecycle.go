package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
)

// lifecycleMetrics count the subscription lifecycle job's transitions (broker/lifecycle.go) and
// its runs, as spool_cleanup_job_* series with job="subscription_lifecycle".
type lifecycleMetrics struct {
	dead, resurrected, deleted *prometheus.CounterVec
	runs, failures             *prometheus.CounterVec
	duration                   *prometheus.HistogramVec
}

func newLifecycleMetrics(reg prometheus.Registerer) *lifecycleMetrics {
	l := &lifecycleMetrics{
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_subscriptions_dead_total",
			Help: "Subscriptions the lifecycle job of this process made DEAD (no live member for their heartbeat timeout).",
		}, []string{"topic"}),
		resurrected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_subscriptions_resurrected_total",
			Help: "DEAD subscriptions a heartbeat of this process made ACTIVE again (a member is attached).",
		}, []string{"topic"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_subscriptions_deleted_total",
			Help: "CANCELLED subscriptions the lifecycle job of this process made DELETED after subscription_retention.",
		}, []string{"topic"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_cleanup_job_runs_total",
			Help: "Runs of a cleanup job of this process, by job.",
		}, []string{"job"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_cleanup_job_failures_total",
			Help: "Failed runs of a cleanup job of this process, by job.",
		}, []string{"job"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spool_cleanup_job_duration_seconds",
			Help: "Duration of one run of a cleanup job of this process, by job, in seconds.",
			// 1 ms to about 65 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}, []string{"job"}),
	}
	if reg != nil {
		reg.MustRegister(l.dead, l.resurrected, l.deleted, l.runs, l.failures, l.duration)
	}
	return l
}

// JobSubscriptionLifecycle is the job label of the subscription lifecycle job.
const JobSubscriptionLifecycle = "subscription_lifecycle"

// ObserveLifecycle records one run of the subscription lifecycle job. Its signature is that of
// broker.Config.OnLifecycle. It never blocks.
func (m *Metrics) ObserveLifecycle(r *broker.LifecycleResult) {
	if m == nil || r == nil {
		return
	}
	l := m.lifecycle
	l.runs.WithLabelValues(JobSubscriptionLifecycle).Inc()
	l.duration.WithLabelValues(JobSubscriptionLifecycle).Observe(r.Took.Seconds())
	if r.Err != nil {
		l.failures.WithLabelValues(JobSubscriptionLifecycle).Inc()
	}
	for _, s := range r.Dead {
		l.dead.WithLabelValues(s.Topic).Inc()
	}
	for _, s := range r.Resurrected {
		l.resurrected.WithLabelValues(s.Topic).Inc()
	}
	for _, s := range r.Deleted {
		l.deleted.WithLabelValues(s.Topic).Inc()
	}
}

func (l *lifecycleMetrics) topicVecs() []*prometheus.MetricVec {
	return []*prometheus.MetricVec{l.dead.MetricVec, l.resurrected.MetricVec, l.deleted.MetricVec}
}

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
)

// lifecycleMetrics count the subscription lifecycle job's transitions (broker/lifecycle.go); its
// runs are spool_cleanup_job_*{task="subscription_lifecycle"} (cleanup.go).
type lifecycleMetrics struct {
	dead, resurrected, deleted *prometheus.CounterVec
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
	}
	if reg != nil {
		reg.MustRegister(l.dead, l.resurrected, l.deleted)
	}
	return l
}

// ObserveLifecycle records the transitions of one run of the subscription lifecycle job. Its
// signature is that of broker.Config.OnLifecycle. It never blocks.
func (m *Metrics) ObserveLifecycle(r *broker.LifecycleResult) {
	if m == nil || r == nil {
		return
	}
	l := m.lifecycle
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

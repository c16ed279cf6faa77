package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// lifecycleMetrics count the subscription lifecycle job's transitions (broker/lifecycle.go); its
// runs are spool_cleanup_job_*{task="subscription_lifecycle"} (cleanup.go).
// spool_messages_force_completed_total counts the admin's force-complete (broker/groupadmin.go),
// spool_messages_filtered_total what member filters completed (broker/filtered.go).
type lifecycleMetrics struct {
	dead, resurrected, deleted *prometheus.CounterVec
	forceCompleted, filtered   *prometheus.CounterVec
}

func newLifecycleMetrics(reg prometheus.Registerer) *lifecycleMetrics {
	l := &lifecycleMetrics{
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_subscriptions_dead_total",
			Help: "Subscriptions the lifecycle job of this process made DEAD (no live member for their heartbeat timeout).",
		}, []string{"topic"}),
		resurrected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_subscriptions_resurrected_total",
			Help: "DEAD subscriptions this process made ACTIVE again: a member attached (or its heartbeat), or an admin resume or resurrect.",
		}, []string{"topic"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_subscriptions_deleted_total",
			Help: "CANCELLED subscriptions this process made DELETED: the lifecycle job after subscription_retention, or an admin group removal at once.",
		}, []string{"topic"}),
		forceCompleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_force_completed_total",
			Help: "Messages an admin force-complete of this process completed for a group without the group processing them.",
		}, []string{"topic", "group"}),
		filtered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_filtered_total",
			Help: "Messages this process completed for a subscription without a delivery because no member's filter matched them.",
		}, []string{"topic", "group"}),
	}
	if reg != nil {
		reg.MustRegister(l.dead, l.resurrected, l.deleted, l.forceCompleted, l.filtered)
	}
	return l
}

// ObserveLifecycle records the transitions of one run of the subscription lifecycle job, or one
// made outside it (the broker reports each once). Its signature is that of
// broker.Config.OnLifecycle. It never blocks.
func (m *Metrics) ObserveLifecycle(r *broker.LifecycleResult) {
	if m == nil || r == nil {
		return
	}
	l := m.lifecycle
	for _, x := range []struct {
		vec  *prometheus.CounterVec
		subs []*storage.Subscription
	}{{l.dead, r.Dead}, {l.resurrected, r.Resurrected}, {l.deleted, r.Deleted}} {
		for _, s := range x.subs {
			if m.idx.isGone(s.Topic) {
				continue
			}
			x.vec.WithLabelValues(s.Topic).Inc()
			m.idx.note(s.Topic, labelNone, "")
		}
	}
}

// ObserveForceComplete counts the messages one force-complete completed for a group. Its signature
// is that of broker.Config.OnForceComplete. It never blocks. A topic's force-complete also covers
// its ephemeral subscriptions ("$ephemeral-<id>"), folded into "$ephemeral" (GroupLabel) so that
// they do not make one series each.
func (m *Metrics) ObserveForceComplete(topic, group string, n int) {
	if m == nil || n <= 0 || m.idx.isGone(topic) {
		return
	}
	g := GroupLabel(group)
	m.lifecycle.forceCompleted.WithLabelValues(topic, g).Add(float64(n))
	m.idx.note(topic, labelGroup, g)
}

// ObserveFiltered counts the messages of a subscription that no member's filter matched and
// that were completed without a delivery. Its signature is that of broker.Config.OnFiltered. It
// never blocks.
func (m *Metrics) ObserveFiltered(topic, group string, n int) {
	if m == nil || n <= 0 || m.idx.isGone(topic) {
		return
	}
	g := GroupLabel(group)
	m.lifecycle.filtered.WithLabelValues(topic, g).Add(float64(n))
	m.idx.note(topic, labelGroup, g)
}

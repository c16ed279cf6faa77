package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
)

// rebalanceMetrics describe the rebalances of ordered groups this process stored
// (broker/ordered.go).
type rebalanceMetrics struct {
	count      *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	generation *prometheus.GaugeVec
}

func newRebalanceMetrics(reg prometheus.Registerer) *rebalanceMetrics {
	r := &rebalanceMetrics{
		count: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_rebalances_total",
			Help: "Rebalances of ordered groups this process stored (each incremented the group's generation).",
		}, []string{"topic", "group"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "spool_rebalance_duration_seconds",
			Help:    "Time from the start of a rebalance of an ordered group to its assignment stored (debounce not included).",
			Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5},
		}, []string{"topic"}),
		generation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spool_group_generation",
			Help: "Generation of an ordered group's assignment as last stored by this process.",
		}, []string{"topic", "group"}),
	}
	if reg != nil {
		reg.MustRegister(r.count, r.duration, r.generation)
	}
	return r
}

// ObserveRebalance records one rebalance. Its signature is that of broker.Config.OnRebalance.
// It never blocks.
func (m *Metrics) ObserveRebalance(info broker.RebalanceInfo) {
	if m == nil || m.idx.isGone(info.Topic) {
		return
	}
	r := m.rebalance
	r.count.WithLabelValues(info.Topic, info.Group).Inc()
	r.duration.WithLabelValues(info.Topic).Observe(info.Took.Seconds())
	r.generation.WithLabelValues(info.Topic, info.Group).Set(float64(info.Generation))
	m.idx.note(info.Topic, labelGroup, info.Group)
}

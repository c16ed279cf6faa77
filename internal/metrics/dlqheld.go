package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

var descDLQHeld = prometheus.NewDesc("spool_wal_dlq_held_bytes",
	"Bytes of dead-lettered messages the embedded engine keeps in memory because their DLQ logs could not make their next segment (a full disk); past 64 MiB the engine stops.",
	nil, nil)

// RegisterDLQHeld registers a collector that calls read at every scrape and exports
// spool_wal_dlq_held_bytes (wal.Engine.DLQHeld) with the registerer given to New.
func (m *Metrics) RegisterDLQHeld(read func() int64) error {
	if m == nil || m.reg == nil {
		return errors.New("metrics: register DLQ held collector: no registerer")
	}
	if read == nil {
		return errors.New("metrics: register DLQ held collector: nil source")
	}
	return m.reg.Register(dlqHeldCollector{read: read})
}

type dlqHeldCollector struct{ read func() int64 }

func (c dlqHeldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descDLQHeld }

func (c dlqHeldCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descDLQHeld, prometheus.GaugeValue, float64(c.read()))
}

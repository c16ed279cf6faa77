package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descOpenFiles = prometheus.NewDesc("spool_wal_open_files",
		"Segment files the embedded engine holds open now (idle ones beyond wal.max_open_files are closed).", nil, nil)
	descMaxOpenFiles = prometheus.NewDesc("spool_wal_max_open_files",
		"The embedded engine's bound of open segment files (wal.max_open_files, 0: none).", nil, nil)
	descOpenFilesShed = prometheus.NewDesc("spool_wal_open_files_shed_total",
		"Idle segment files the embedded engine closed because opening a file failed for lack of descriptors (EMFILE, ENFILE) while it was under its bound: the process's other descriptors (connections) reached ulimit -n.",
		nil, nil)
	descDLQHeld = prometheus.NewDesc("spool_wal_dlq_held_bytes",
		"Bytes of dead-lettered messages the embedded engine keeps in memory because their DLQ logs could not make their next segment (a full disk); past 64 MiB the engine stops.",
		nil, nil)
)

// WALStats is what the embedded engine's collector reads at every scrape: its segment files
// (wal.Engine.OpenFiles) and its dead letters waiting for room (wal.Engine.DLQHeld).
type WALStats struct {
	Open         int   // files open now
	Max          int   // the bound, wal.max_open_files (0: none)
	Shed         int64 // idle files closed because an open lacked descriptors, since start
	DLQHeldBytes int64 // dead letters kept in memory while a DLQ log waits for room
}

// RegisterWAL registers a collector that calls read at every scrape and exports
// spool_wal_open_files, spool_wal_max_open_files, spool_wal_open_files_shed_total and
// spool_wal_dlq_held_bytes with the registerer given to New.
func (m *Metrics) RegisterWAL(read func() WALStats) error {
	if m == nil || m.reg == nil {
		return errors.New("metrics: register wal collector: no registerer")
	}
	if read == nil {
		return errors.New("metrics: register wal collector: nil source")
	}
	return m.reg.Register(walCollector{read: read})
}

type walCollector struct{ read func() WALStats }

func (c walCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descOpenFiles
	ch <- descMaxOpenFiles
	ch <- descOpenFilesShed
	ch <- descDLQHeld
}

func (c walCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.read()
	ch <- prometheus.MustNewConstMetric(descOpenFiles, prometheus.GaugeValue, float64(st.Open))
	ch <- prometheus.MustNewConstMetric(descMaxOpenFiles, prometheus.GaugeValue, float64(st.Max))
	ch <- prometheus.MustNewConstMetric(descOpenFilesShed, prometheus.CounterValue, float64(st.Shed))
	ch <- prometheus.MustNewConstMetric(descDLQHeld, prometheus.GaugeValue, float64(st.DLQHeldBytes))
}

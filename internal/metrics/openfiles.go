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
)

// OpenFilesStats is what the open files collector reads at every scrape: the embedded engine's
// segment files (wal.Engine.OpenFiles).
type OpenFilesStats struct {
	Open int   // files open now
	Max  int   // the bound, wal.max_open_files (0: none)
	Shed int64 // idle files closed because an open lacked descriptors, since start
}

// RegisterOpenFiles registers a collector that calls read at every scrape and exports
// spool_wal_open_files, spool_wal_max_open_files and spool_wal_open_files_shed_total with the
// registerer given to New.
func (m *Metrics) RegisterOpenFiles(read func() OpenFilesStats) error {
	if m == nil || m.reg == nil {
		return errors.New("metrics: register open files collector: no registerer")
	}
	if read == nil {
		return errors.New("metrics: register open files collector: nil source")
	}
	return m.reg.Register(openFilesCollector{read: read})
}

type openFilesCollector struct{ read func() OpenFilesStats }

func (c openFilesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descOpenFiles
	ch <- descMaxOpenFiles
	ch <- descOpenFilesShed
}

func (c openFilesCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.read()
	ch <- prometheus.MustNewConstMetric(descOpenFiles, prometheus.GaugeValue, float64(st.Open))
	ch <- prometheus.MustNewConstMetric(descMaxOpenFiles, prometheus.GaugeValue, float64(st.Max))
	ch <- prometheus.MustNewConstMetric(descOpenFilesShed, prometheus.CounterValue, float64(st.Shed))
}

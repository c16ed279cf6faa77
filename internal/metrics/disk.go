package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descDiskAvailable = prometheus.NewDesc("spool_storage_available_bytes",
		"Bytes available to the broker on the file system of the embedded engine's data directory (statfs at scrape time).", nil, nil)
	descDiskSize = prometheus.NewDesc("spool_storage_size_bytes",
		"Size in bytes of the file system of the embedded engine's data directory.", nil, nil)
)

// RegisterDiskSpace registers a collector of the free and total space of the file system holding
// dir (the embedded engine's data directory) with the registerer given to New: the figures of the
// "disk nearly full" alert, before publishes fail with STORAGE_FULL. Where the space cannot be
// read (another OS, a statfs error) the two series are absent at that scrape.
func (m *Metrics) RegisterDiskSpace(dir string) error {
	if m == nil || m.reg == nil {
		return errors.New("metrics: register disk space collector: no registerer")
	}
	return m.reg.Register(diskCollector{dir: dir})
}

type diskCollector struct{ dir string }

func (c diskCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDiskAvailable
	ch <- descDiskSize
}

func (c diskCollector) Collect(ch chan<- prometheus.Metric) {
	avail, size, ok := diskSpace(c.dir)
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(descDiskAvailable, prometheus.GaugeValue, float64(avail))
	ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, float64(size))
}

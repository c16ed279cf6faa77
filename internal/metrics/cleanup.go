package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
)

// cleanupSource is the part of the broker the cleanup collector reads (Broker.CleanupJobs).
type cleanupSource interface {
	CleanupJobs() []broker.CleanupJobStatus
}

// cleanupCollector exports the broker's cleanup jobs (retention, subscription_lifecycle) as
// spool_cleanup_job_* series, read from Broker.CleanupJobs at each scrape.
type cleanupCollector struct {
	src                                                                 cleanupSource
	runs, failures, removed, lastDuration, lastSuccess, behind, backlog *prometheus.Desc
}

func newCleanupCollector(src cleanupSource) *cleanupCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"task"}, nil)
	}
	return &cleanupCollector{
		src:          src,
		runs:         d("spool_cleanup_job_runs_total", "Runs of a cleanup job of this process (retention: message cleanup; subscription_lifecycle: dead detection and CANCELLED -> DELETED)."),
		failures:     d("spool_cleanup_job_failures_total", "Failed runs of a cleanup job of this process."),
		removed:      d("spool_cleanup_job_removed_total", "What a cleanup job of this process removed: messages (retention), subscriptions made DEAD or DELETED (subscription_lifecycle)."),
		lastDuration: d("spool_cleanup_job_last_duration_seconds", "Duration of the last run of a cleanup job, in seconds."),
		lastSuccess:  d("spool_cleanup_job_last_success_timestamp_seconds", "Start of the last successful run of a cleanup job (Unix time; 0: none yet)."),
		behind:       d("spool_cleanup_job_behind", "1 when a cleanup job falls behind (seed 000's CRITICAL rule: no successful run for 3 intervals, a run longer than its interval, or a backlog that grew at each of the last 3 runs), else 0."),
		backlog:      d("spool_cleanup_job_backlog", "What a cleanup job could remove now and has not, after its last successful run: messages in whole segments or buckets (retention; seed 000's cleanupBacklog, WARNING above 1,000,000), 0 for subscription_lifecycle."),
	}
}

// Describe sends the descriptors.
func (c *cleanupCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.runs, c.failures, c.removed, c.lastDuration, c.lastSuccess, c.behind, c.backlog} {
		ch <- d
	}
}

// Collect reads the jobs once.
func (c *cleanupCollector) Collect(ch chan<- prometheus.Metric) {
	for _, j := range c.src.CleanupJobs() {
		success := 0.0
		if !j.LastSuccess.IsZero() {
			success = float64(j.LastSuccess.UnixNano()) / 1e9
		}
		behind := 0.0
		if j.Behind {
			behind = 1
		}
		ch <- prometheus.MustNewConstMetric(c.runs, prometheus.CounterValue, float64(j.Runs), j.Job)
		ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(j.Failures), j.Job)
		ch <- prometheus.MustNewConstMetric(c.removed, prometheus.CounterValue, float64(j.Removed), j.Job)
		ch <- prometheus.MustNewConstMetric(c.lastDuration, prometheus.GaugeValue, j.LastDuration.Seconds(), j.Job)
		ch <- prometheus.MustNewConstMetric(c.lastSuccess, prometheus.GaugeValue, success, j.Job)
		ch <- prometheus.MustNewConstMetric(c.behind, prometheus.GaugeValue, behind, j.Job)
		ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(j.Backlog), j.Job)
	}
}

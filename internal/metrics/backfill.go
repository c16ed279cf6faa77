package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// backfillSource is the part of the broker the backfill collector reads.
type backfillSource interface {
	BackfillCounters() broker.BackfillCounters
	ActiveBackfills() []broker.ActiveBackfill
}

// backfillCollector exports the broker's backfill figures (broker/backfill.go), read at each
// scrape: process counters, and per group this instance paces (its members are here) the
// progress, rate and rate limit.
type backfillCollector struct {
	src                                             backfillSource
	missed, claimed, failures                       *prometheus.Desc
	processed, total, rate, limit, inFlight, failed *prometheus.Desc
}

func newBackfillCollector(src backfillSource) *backfillCollector {
	tg := []string{"topic", "group"}
	return &backfillCollector{
		src: src,
		missed: prometheus.NewDesc("spool_backfill_missed_messages_total",
			"Messages groups will not get: reason bound (a backfill range cut to max_backfill_messages, the newest kept) or skipped (cancel with skip, resurrect without backfill).",
			[]string{"reason"}, nil),
		claimed:   prometheus.NewDesc("spool_backfill_messages_total", "Backfill range messages claimed (delivered) by this process.", nil, nil),
		failures:  prometheus.NewDesc("spool_backfill_failures_total", "Backfills this process made FAILED: their range claims kept failing (each is logged; spool group backfill resume restarts one).", nil, nil),
		processed: prometheus.NewDesc("spool_backfill_processed_messages", "Messages of a group's backfill range that are done (IN_PROGRESS backfills paced here).", tg, nil),
		total:     prometheus.NewDesc("spool_backfill_total_messages", "Messages of a group's backfill range.", tg, nil),
		rate:      prometheus.NewDesc("spool_backfill_rate", "Backfill messages processed per second, as this instance measured.", tg, nil),
		limit:     prometheus.NewDesc("spool_backfill_rate_limit", "The adaptive claim rate limit of a group's backfill range on this instance (messages/s).", tg, nil),
		inFlight:  prometheus.NewDesc("spool_backfill_in_progress", "1 for a group whose backfill is IN_PROGRESS here, 0 when CANCELLED or FAILED with its range held back.", tg, nil),
		failed:    prometheus.NewDesc("spool_backfill_failed", "1 for a group whose backfill is FAILED (its range held back here until resumed), 0 otherwise.", tg, nil),
	}
}

// Describe sends the descriptors.
func (c *backfillCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.missed, c.claimed, c.failures, c.processed, c.total, c.rate, c.limit, c.inFlight, c.failed} {
		ch <- d
	}
}

// Collect reads the broker once.
func (c *backfillCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.src.BackfillCounters()
	ch <- prometheus.MustNewConstMetric(c.missed, prometheus.CounterValue, float64(n.MissedBound), "bound")
	ch <- prometheus.MustNewConstMetric(c.missed, prometheus.CounterValue, float64(n.MissedSkipped), "skipped")
	ch <- prometheus.MustNewConstMetric(c.claimed, prometheus.CounterValue, float64(n.Claimed))
	ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(n.Failed))
	for _, a := range c.src.ActiveBackfills() {
		in, failed := 0.0, 0.0
		switch a.Info.State {
		case storage.BackfillInProgress:
			in = 1
		case storage.BackfillFailed:
			failed = 1
		}
		ch <- prometheus.MustNewConstMetric(c.processed, prometheus.GaugeValue, float64(a.Info.Processed), a.Topic, a.Group)
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(a.Info.Total), a.Topic, a.Group)
		ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, a.Info.Rate, a.Topic, a.Group)
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, a.Info.RateLimit, a.Topic, a.Group)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, in, a.Topic, a.Group)
		ch <- prometheus.MustNewConstMetric(c.failed, prometheus.GaugeValue, failed, a.Topic, a.Group)
	}
}

package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

type fakeBackfill struct {
	c broker.BackfillCounters
	a []broker.ActiveBackfill
}

func (f fakeBackfill) BackfillCounters() broker.BackfillCounters { return f.c }
func (f fakeBackfill) ActiveBackfills() []broker.ActiveBackfill  { return f.a }

// The backfill figures are exported: missed messages by reason, claims, and per paced group.
func TestBackfillCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(newBackfillCollector(fakeBackfill{
		c: broker.BackfillCounters{MissedBound: 6, MissedSkipped: 3, Claimed: 40, Failed: 2},
		a: []broker.ActiveBackfill{{Topic: "orders", Group: "g", Info: broker.BackfillInfo{
			State: storage.BackfillInProgress, Processed: 10, Total: 50, Rate: 2.5, RateLimit: 5000}},
			{Topic: "orders", Group: "f", Info: broker.BackfillInfo{State: storage.BackfillFailed, Total: 7}}},
	}))
	tg := map[string]string{"topic": "orders", "group": "g"}
	tf := map[string]string{"topic": "orders", "group": "f"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"spool_backfill_missed_messages_total", map[string]string{"reason": "bound"}, 6},
		{"spool_backfill_missed_messages_total", map[string]string{"reason": "skipped"}, 3},
		{"spool_backfill_messages_total", nil, 40},
		{"spool_backfill_processed_messages", tg, 10},
		{"spool_backfill_total_messages", tg, 50},
		{"spool_backfill_rate", tg, 2.5},
		{"spool_backfill_rate_limit", tg, 5000},
		{"spool_backfill_in_progress", tg, 1},
		{"spool_backfill_failed", tg, 0},
		{"spool_backfill_failures_total", nil, 2},
		{"spool_backfill_in_progress", tf, 0},
		{"spool_backfill_failed", tf, 1},
	} {
		if got := mustSample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

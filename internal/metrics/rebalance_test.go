package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spoolmq/spool/internal/broker"
)

// Rebalances are counted and timed, the generation shown; ForgetTopic drops the series.
func TestObserveRebalance(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.ObserveRebalance(broker.RebalanceInfo{Topic: "o", Group: "g", Generation: 1, Took: time.Millisecond})
	m.ObserveRebalance(broker.RebalanceInfo{Topic: "o", Group: "g", Generation: 2, Took: 3 * time.Millisecond})
	var nilMetrics *Metrics
	nilMetrics.ObserveRebalance(broker.RebalanceInfo{Topic: "o"})
	tg := map[string]string{"topic": "o", "group": "g"}
	if got := mustSample(t, reg, "spool_rebalances_total", tg); got != 2 {
		t.Errorf("spool_rebalances_total = %v, want 2", got)
	}
	if got := mustSample(t, reg, "spool_group_generation", tg); got != 2 {
		t.Errorf("spool_group_generation = %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "spool_rebalance_duration_seconds"); err != nil || n != 1 {
		t.Errorf("duration series %d (err %v)", n, err)
	}
	m.ForgetTopic("o")
	if n, err := testutil.GatherAndCount(reg, "spool_rebalances_total", "spool_group_generation"); err != nil || n != 0 {
		t.Errorf("after ForgetTopic: %d series (err %v)", n, err)
	}
}

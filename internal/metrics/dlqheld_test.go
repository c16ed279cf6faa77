package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDLQHeld: the collector exports what its source reads at each scrape.
func TestDLQHeld(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	held := int64(4096)
	if err := New(reg).RegisterDLQHeld(func() int64 { return held }); err != nil {
		t.Fatal(err)
	}
	if got := mustSample(t, reg, "spool_wal_dlq_held_bytes", nil); got != 4096 {
		t.Fatalf("spool_wal_dlq_held_bytes = %v, want 4096", got)
	}
	held = 0
	if got := mustSample(t, reg, "spool_wal_dlq_held_bytes", nil); got != 0 {
		t.Fatalf("spool_wal_dlq_held_bytes = %v at the next scrape, want 0", got)
	}
	if err := New(nil).RegisterDLQHeld(func() int64 { return held }); err == nil {
		t.Fatal("RegisterDLQHeld without a registerer succeeded")
	}
}

package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestWAL: the embedded engine's collector exports what its source reads at each scrape.
func TestWAL(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	st := WALStats{Open: 12, Max: 512, Shed: 3, DLQHeldBytes: 4096}
	if err := New(reg).RegisterWAL(func() WALStats { return st }); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"spool_wal_open_files": 12, "spool_wal_max_open_files": 512, "spool_wal_open_files_shed_total": 3, "spool_wal_dlq_held_bytes": 4096} {
		if got := mustSample(t, reg, name, nil); got != want {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
	}
	st.Open, st.DLQHeldBytes = 40, 0
	if got := mustSample(t, reg, "spool_wal_open_files", nil); got != 40 {
		t.Fatalf("spool_wal_open_files = %v at the next scrape, want 40", got)
	}
	if got := mustSample(t, reg, "spool_wal_dlq_held_bytes", nil); got != 0 {
		t.Fatalf("spool_wal_dlq_held_bytes = %v at the next scrape, want 0", got)
	}
	if err := New(nil).RegisterWAL(func() WALStats { return st }); err == nil {
		t.Fatal("RegisterWAL without a registerer succeeded")
	}
}

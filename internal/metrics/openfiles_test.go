package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestOpenFiles: the open files collector exports what its source reads at each scrape.
func TestOpenFiles(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	st := OpenFilesStats{Open: 12, Max: 512, Shed: 3}
	if err := New(reg).RegisterOpenFiles(func() OpenFilesStats { return st }); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"spool_wal_open_files": 12, "spool_wal_max_open_files": 512, "spool_wal_open_files_shed_total": 3} {
		if got := mustSample(t, reg, name, nil); got != want {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
	}
	st.Open = 40
	if got := mustSample(t, reg, "spool_wal_open_files", nil); got != 40 {
		t.Fatalf("spool_wal_open_files = %v at the next scrape, want 40", got)
	}
	if err := New(nil).RegisterOpenFiles(func() OpenFilesStats { return st }); err == nil {
		t.Fatal("RegisterOpenFiles without a registerer succeeded")
	}
}

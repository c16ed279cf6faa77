package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDiskSpace: the disk collector exports the available and total bytes of the data
// directory's file system, the first at most the second, and nothing for a directory it cannot
// read.
func TestDiskSpace(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	if err := m.RegisterDiskSpace(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	avail := mustSample(t, reg, "spool_storage_available_bytes", nil)
	size := mustSample(t, reg, "spool_storage_size_bytes", nil)
	if size <= 0 || avail < 0 || avail > size {
		t.Fatalf("available %v of %v bytes", avail, size)
	}
	gone := prometheus.NewRegistry()
	if err := New(gone).RegisterDiskSpace("/no/such/dir"); err != nil {
		t.Fatal(err)
	}
	if n := countSeries(t, gone, "spool_storage_size_bytes"); n != 0 {
		t.Fatalf("%d series for a directory that does not exist", n)
	}
	if err := New(nil).RegisterDiskSpace("."); err == nil {
		t.Fatal("RegisterDiskSpace without a registerer succeeded")
	}
}

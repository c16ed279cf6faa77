//go:build linux

package wlog_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// dropCache evicts the files of dir from the page cache (posix_fadvise DONTNEED after fsync), so
// that a benchmark reads them from the disk, without touching anyone else's cache.
func dropCache(tb testing.TB, dir string) {
	tb.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			tb.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			tb.Fatal(err)
		}
		f.Close()
	}
}

package wal

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// diskBytes is what the files under dir take on disk (allocated blocks, preallocation included).
func diskBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// TestEmptyTopicsTakeLittleDisk: with the default segment sizes, an empty topic partition reserves
// its first segment (64 KiB), not a whole 64 MiB segment: 1,000 empty topics take at most 100 MiB
// (issue 16). CI creates 100 topics and checks the same bound per topic; SPOOL_WAL_SCALE=1 creates
// 1,000.
func TestEmptyTopicsTakeLittleDisk(t *testing.T) {
	t.Parallel()
	n := scaleSize("SPOOL_WAL_SCALE_TOPICS", 1000, 100)
	h := newHarness(t, func(c *Config) { c.SegmentBytes = DefaultSegmentBytes })
	base := diskBytes(t, h.dir)
	for i := range n {
		h.createTopic(fmt.Sprintf("empty.%d", i), storage.TopicConfig{})
	}
	used := diskBytes(t, h.dir) - base
	t.Logf("%d empty topics: %d KiB on disk (%d KiB each)", n, used>>10, used/int64(n)>>10)
	if limit := int64(n) * (100 << 20) / 1000; used > limit {
		t.Fatalf("%d empty topics take %d KiB on disk, want at most %d KiB", n, used>>10, limit>>10)
	}
}

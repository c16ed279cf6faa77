package wlog_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"testing"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// segSizes returns the file size of every segment of l, oldest first.
func segSizes(t *testing.T, l *wlog.Log) []int64 {
	t.Helper()
	var out []int64
	for _, s := range l.Segments() {
		st, err := os.Stat(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, st.Size())
	}
	return out
}

// appendUntilSegments appends records of 1 KiB bodies until the log has n segments.
func appendUntilSegments(t *testing.T, c *wlog.Committer, l *wlog.Log, n int) {
	t.Helper()
	b := make([]byte, 1024)
	for len(l.Segments()) < n {
		if _, err := c.Append(context.Background(), l, []wlog.Record{{Timestamp: 1, Body: b}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSegmentsStartSmallAndGrow: a new log reserves FirstSegmentBytes on disk, not SegmentBytes;
// each segment cut because it was full is followed by one four times as large, up to
// SegmentBytes. This is what keeps 1,000 empty topics from reserving 64 GB.
func TestSegmentsStartSmallAndGrow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const first, max = 4 << 10, 256 << 10
	l := openLog(t, dir, wlog.Options{SegmentBytes: max, FirstSegmentBytes: first})
	sizes := segSizes(t, l)
	if len(sizes) != 1 || sizes[0] != first {
		t.Fatalf("new log: segment sizes %v, want [%d]", sizes, first)
	}
	st, err := os.Stat(l.Segments()[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	if blocks := st.Sys().(*syscall.Stat_t).Blocks * 512; blocks > first {
		t.Fatalf("new log reserves %d bytes on disk, want at most %d", blocks, first)
	}
	c := newCommitter(t, wlog.CommitterOptions{})
	appendUntilSegments(t, c, l, 7)
	got := fmt.Sprint(segSizes(t, l))
	if want := fmt.Sprint([]int64{first, 4 * first, 16 * first, max, max, max, max}); got != want {
		t.Fatalf("segment sizes %s, want %s", got, want)
	}
}

// TestCutSegmentDoesNotGrow: a segment cut early (Cut: retention of a quiet log) is followed by
// one no larger than twice what it used, so a quiet log with short retention keeps small segments.
func TestCutSegmentDoesNotGrow(t *testing.T) {
	t.Parallel()
	const first = 4 << 10
	l := openLog(t, t.TempDir(), wlog.Options{SegmentBytes: 1 << 20, FirstSegmentBytes: first})
	c := newCommitter(t, wlog.CommitterOptions{})
	for i := range int64(5) {
		appendRange(t, c, l, i, i+1)
		if err := l.Cut(); err != nil {
			t.Fatal(err)
		}
	}
	for i, size := range segSizes(t, l) {
		if size != first {
			t.Fatalf("segment %d after cuts of small segments: %d bytes, want %d", i, size, first)
		}
	}
}

// TestReopenKeepsSegmentSizes: a log reopened (after a crash) with another SegmentBytes keeps its segments as they
// are (nothing is rewritten or extended, though the setting grew) and cuts the active one at its
// own size; the segments after follow the new setting.
func TestReopenKeepsSegmentSizes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newCommitter(t, wlog.CommitterOptions{})
	const old = 16 << 10
	l := openLog(t, dir, wlog.Options{SegmentBytes: old, FirstSegmentBytes: old})
	appendUntilSegments(t, c, l, 3)
	before := segSizes(t, l)
	next := l.NextIndex()
	dir = copyDir(t, dir) // as after a crash: the active segment has no index and is scanned

	sink, logger := newSink(t)
	l = openLog(t, dir, wlog.Options{SegmentBytes: 256 << 10, FirstSegmentBytes: 4 << 10, Logger: logger})
	if sink.has(slog.LevelWarn, "wal segment shorter than preallocated; extended") {
		t.Fatal("a segment was extended at reopen")
	}
	if got := segSizes(t, l); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("segment sizes after reopen %v, want %v (unchanged)", got, before)
	}
	appendUntilSegments(t, c, l, 5)
	sizes := segSizes(t, l)
	if sizes[2] != old {
		t.Fatalf("active segment changed size to %d, want %d", sizes[2], old)
	}
	// Full at its own size: followed by the smallest 4 KiB x 4^k of twice that, then x4.
	if sizes[3] != 64<<10 || sizes[4] != 256<<10 {
		t.Fatalf("segments after the reopen: %v, want 64 KiB then 256 KiB", sizes[3:])
	}
	if err := l.Verify(); err != nil {
		t.Fatal(err)
	}
	if l.NextIndex() <= next {
		t.Fatalf("NextIndex %d, want more than %d", l.NextIndex(), next)
	}
}

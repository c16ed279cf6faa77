package wlog_test

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
)

// TestNoRoomForNextSegment: an append that needs a new segment the log cannot make (the disk is
// full) fails alone with ErrNoSegment, writes nothing (a batch whose first records fitted in the
// active segment included: they are cleared, also for a reopen after a crash) and leaves the log
// working: appends that fit go on, and the same append succeeds once space is back (issue 16:
// writes resume by themselves, no restart).
func TestNoRoomForNextSegment(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	dir := t.TempDir()
	l := openLog(t, dir, wlog.Options{FS: efs, SegmentBytes: 1024, FirstSegmentBytes: 1024})
	c := newCommitter(t, wlog.CommitterOptions{})
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpAllocate {
			return syscall.ENOSPC
		}
		return nil
	})
	var n int64
	var err error
	for ; ; n++ {
		if _, err = c.Append(context.Background(), l, []wlog.Record{rec(n)}); err != nil {
			break
		}
	}
	if !errors.Is(err, wlog.ErrNoSegment) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append %d with no room for a segment: %v, want ErrNoSegment wrapping ENOSPC", n, err)
	}
	if l.Err() != nil || len(l.Segments()) != 1 || l.NextIndex() != n {
		t.Fatalf("after the refused append: Err %v, %d segments, NextIndex %d (want nil, 1, %d)", l.Err(), len(l.Segments()), l.NextIndex(), n)
	}
	// A batch whose first records still fit: nothing of it is kept.
	var batch []wlog.Record
	for i := range int64(40) {
		batch = append(batch, rec(n+i))
	}
	if _, err := c.Append(context.Background(), l, batch); !errors.Is(err, wlog.ErrNoSegment) {
		t.Fatalf("batch: %v, want ErrNoSegment", err)
	}
	checkRecords(t, l, 0, n)
	checkRecords(t, openLog(t, copyDir(t, dir), wlog.Options{SegmentBytes: 1024}), 0, n) // as after a crash now

	efs.SetInjector(nil) // space is back
	if first, err := c.Append(context.Background(), l, batch); err != nil || first != n {
		t.Fatalf("batch once space is back: first %d, %v (want %d)", first, err, n)
	}
	checkRecords(t, l, 0, n+40)
	if len(l.Segments()) < 2 {
		t.Fatalf("segments %+v, want the new ones", l.Segments())
	}
}

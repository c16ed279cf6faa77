package wlog_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
	"github.com/spoolmq/spool/internal/testutil"
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

// TestKeepSpareGivesRoomOnAFullDisk: a log with KeepSpare prepares its next segment from Open on,
// so that when the disk fills it can still cut one segment (the engine's state log: acks and
// claims go on); the cut after that one finds no room and fails alone (ErrNoSegment).
func TestKeepSpareGivesRoomOnAFullDisk(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	dir := t.TempDir()
	l := openLog(t, dir, wlog.Options{FS: efs, SegmentBytes: 16 << 10, FirstSegmentBytes: 1024, KeepSpare: true})
	c := newCommitter(t, wlog.CommitterOptions{})
	spare := filepath.Join(dir, "spare.seg.tmp")
	testutil.Eventually(t, 10*time.Second, "the spare prepared at Open", func() error {
		if st, err := os.Stat(spare); err != nil || st.Size() != 4096 {
			return fmt.Errorf("spare: %v %v", st, err)
		}
		return nil
	})
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpAllocate {
			return syscall.ENOSPC // the disk is full from now on
		}
		return nil
	})
	var n int64
	for len(l.Segments()) < 2 {
		if _, err := c.Append(context.Background(), l, []wlog.Record{rec(n)}); err != nil {
			t.Fatalf("append %d on a full disk, with a spare ready: %v", n, err)
		}
		n++
	}
	var err error
	for ; err == nil; n++ {
		_, err = c.Append(context.Background(), l, []wlog.Record{rec(n)})
	}
	if !errors.Is(err, wlog.ErrNoSegment) || l.Err() != nil {
		t.Fatalf("append %d once the spare is used: %v (log error %v), want ErrNoSegment", n, err, l.Err())
	}
	checkRecords(t, l, 0, n-1)
}

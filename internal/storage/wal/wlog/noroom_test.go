package wlog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage/storagetest"
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

// TestFailedSpareIsPreparedAgain: a spare whose preparation failed (EMFILE) is prepared again by a
// later round, at most once per second of the log's clock, so that the roll after it needs no new
// descriptor: the engine's state log, whose failed append stops the engine, cuts at every snapshot.
// Before, a failed spare stayed failed until the next roll, which then had to create its segment
// and failed with ErrNoSegment when descriptors were still short.
func TestFailedSpareIsPreparedAgain(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Unix(1_700_000_000, 0))
	dir := t.TempDir()
	spare := filepath.Join(dir, "spare.seg.tmp")
	var spareOpens atomic.Int64
	var failSpare, noFiles atomic.Bool
	failSpare.Store(true)
	efs := wlogtest.NewErrorFS(nil, func(op wlogtest.Op, path string) error {
		if op != wlogtest.OpOpen {
			return nil
		}
		if path == spare {
			spareOpens.Add(1)
		}
		if noFiles.Load() || path == spare && failSpare.Load() {
			return syscall.EMFILE
		}
		return nil
	})
	sink, logger := newSink(t)
	l := openLog(t, dir, wlog.Options{FS: efs, Clock: clock, Logger: logger, SegmentBytes: 16 << 10,
		FirstSegmentBytes: 1024, KeepSpare: true, PinActive: true})
	c := newCommitter(t, wlog.CommitterOptions{})
	testutil.Eventually(t, 10*time.Second, "the spare tried at Open", func() error {
		if n := spareOpens.Load(); n != 1 {
			return fmt.Errorf("%d opens of the spare", n)
		}
		return nil
	})
	failSpare.Store(false)
	appendRange(t, c, l, 0, 3)
	if n := spareOpens.Load(); n != 1 {
		t.Fatalf("spare prepared %d times within a second of its failure, want once", n)
	}
	clock.Advance(time.Second)
	n := int64(3)
	testutil.Eventually(t, 10*time.Second, "the spare prepared again by a round", func() error {
		appendRange(t, c, l, n, n+1)
		n++
		if len(l.Segments()) > 1 {
			t.Fatal("the log rolled before its failed spare was prepared again")
		}
		if n := spareOpens.Load(); n != 2 {
			return fmt.Errorf("%d opens of the spare", n)
		}
		return nil
	})
	testutil.Eventually(t, 10*time.Second, "the spare ready", func() error {
		if st, err := os.Stat(spare); err != nil || st.Size() != 4096 {
			return fmt.Errorf("spare: %v %v", st, err)
		}
		return nil
	})
	if !sink.has(slog.LevelWarn, "wal segment preparation failed; preparing it again") {
		t.Fatal("no warning of the failed spare")
	}
	noFiles.Store(true) // the process has no descriptor left, and the pool nothing idle to close
	if err := l.Cut(); err != nil {
		t.Fatalf("cut with a spare ready and no descriptor left: %v", err)
	}
	appendRange(t, c, l, n, n+1)
	noFiles.Store(false)
	checkRecords(t, l, 0, n+1)
}

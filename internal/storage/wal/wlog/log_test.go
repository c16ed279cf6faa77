package wlog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
	"github.com/spoolmq/spool/internal/testutil"
)

func TestAppendReadReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := wlog.Options{SegmentBytes: 1024}
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, opts)
	appendRange(t, c, l, 0, 100)
	checkRecords(t, l, 0, 100)
	segs := l.Segments()
	if len(segs) < 3 {
		t.Fatalf("want several segments of 1 KiB, got %d", len(segs))
	}
	var total int64
	for i, s := range segs {
		total += s.Count
		if s.Sealed != (i < len(segs)-1) {
			t.Errorf("segment %d Sealed = %v", i, s.Sealed)
		}
		if s.Count > 0 && (s.MinTime != ts(s.BaseIndex) || s.MaxTime != ts(s.BaseIndex+s.Count-1)) {
			t.Errorf("segment %d times [%d, %d], want [%d, %d]", i, s.MinTime, s.MaxTime, ts(s.BaseIndex), ts(s.BaseIndex+s.Count-1))
		}
		if i > 0 && s.BaseIndex != segs[i-1].BaseIndex+segs[i-1].Count {
			t.Errorf("segment %d base %d does not follow the previous one", i, s.BaseIndex)
		}
	}
	if total != 100 {
		t.Fatalf("segments count %d records, want 100", total)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l2 := openLog(t, dir, opts)
	checkRecords(t, l2, 0, 100)
	appendRange(t, c, l2, 100, 150)
	checkRecords(t, l2, 0, 150)
	if err := l2.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestEmptyLogEdges(t *testing.T) {
	t.Parallel()
	l := openLog(t, t.TempDir(), wlog.Options{FirstIndex: 100})
	if l.FirstIndex() != 100 || l.NextIndex() != 100 {
		t.Fatalf("FirstIndex, NextIndex = %d, %d; want 100, 100", l.FirstIndex(), l.NextIndex())
	}
	recs, err := l.Read(100, 10, 0)
	if err != nil || len(recs) != 0 {
		t.Fatalf("Read(NextIndex) = %v, %v; want nothing", recs, err)
	}
	for _, idx := range []int64{99, 101, -1} {
		if _, err := l.Read(idx, 10, 0); !errors.Is(err, storage.ErrOffsetOutOfRange) {
			t.Errorf("Read(%d) error = %v, want ErrOffsetOutOfRange", idx, err)
		}
		if err := l.Scan(idx, func(int64, wlog.Record) (bool, error) { return true, nil }); !errors.Is(err, storage.ErrOffsetOutOfRange) {
			t.Errorf("Scan(%d) error = %v, want ErrOffsetOutOfRange", idx, err)
		}
	}
	if _, err := l.Read(100, 0, 0); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("Read max 0 error = %v, want ErrInvalidArgument", err)
	}
	if got, err := l.SearchTime(5); err != nil || got != 100 {
		t.Errorf("SearchTime on empty log = %d, %v; want 100", got, err)
	}
	if err := l.Cut(); err != nil || len(l.Segments()) != 1 {
		t.Errorf("Cut of an empty segment: %v, %d segments; want a no-op", err, len(l.Segments()))
	}
	if n, b, err := l.DeleteBefore(1000); err != nil || n != 0 || b != 0 {
		t.Errorf("DeleteBefore on empty log = %d, %d, %v", n, b, err)
	}
	segs := l.Segments()
	if len(segs) != 1 || segs[0].BaseIndex != 100 || segs[0].Count != 0 || segs[0].Bytes != wlog.SegmentHeaderBytes {
		t.Errorf("Segments = %+v", segs)
	}
}

func TestReadLimits(t *testing.T) {
	t.Parallel()
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, t.TempDir(), wlog.Options{SegmentBytes: 1024})
	appendRange(t, c, l, 0, 60)

	// max spans segments.
	recs, err := l.Read(0, 60, 0)
	if err != nil || len(recs) != 60 {
		t.Fatalf("Read(0, 60) = %d records, %v", len(recs), err)
	}
	// maxBytes bounds the bodies, but at least one record comes back.
	recs, err = l.Read(5, 60, 1)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read(5, maxBytes 1) = %d records, %v; want 1", len(recs), err)
	}
	recs, err = l.Read(5, 60, 200)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		n += len(r.Body)
	}
	if n > 200 || len(recs) < 2 {
		t.Fatalf("Read(5, maxBytes 200) = %d records of %d bytes", len(recs), n)
	}
	// The last record, and max larger than what is there.
	recs, err = l.Read(59, 10, 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read(59, 10) = %d records, %v; want 1", len(recs), err)
	}
	// Bodies do not overlap: appending to one must not change the next.
	recs, _ = l.Read(0, 2, 0)
	_ = append(recs[0].Body, 0xEE)
	if string(recs[1].Body) != string(body(1)) {
		t.Fatal("appending to a returned body changed the next one")
	}

	// Scan stops when fn says so and returns fn's error as is.
	var seen []int64
	if err := l.Scan(10, func(i int64, r wlog.Record) (bool, error) {
		seen = append(seen, i)
		return len(seen) < 3, nil
	}); err != nil || len(seen) != 3 || seen[0] != 10 || seen[2] != 12 {
		t.Fatalf("Scan stopped after %v, %v", seen, err)
	}
	errStop := errors.New("stop")
	if err := l.Scan(0, func(int64, wlog.Record) (bool, error) { return true, errStop }); err != errStop {
		t.Fatalf("Scan error = %v, want fn's error", err)
	}
	count := 0
	if err := l.Scan(0, func(i int64, r wlog.Record) (bool, error) {
		if r.Timestamp != ts(i) || string(r.Body) != string(body(i)) {
			t.Fatalf("Scan record %d differs", i)
		}
		count++
		return true, nil
	}); err != nil || count != 60 {
		t.Fatalf("Scan visited %d records, %v", count, err)
	}
}

func TestSearchTime(t *testing.T) {
	t.Parallel()
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, t.TempDir(), wlog.Options{SegmentBytes: 1024, FirstIndex: 7})
	appendRange(t, c, l, 7, 107) // ts(i) = 1e6 + 10 i
	cases := []struct {
		ts   int64
		want int64
	}{
		{0, 7},
		{ts(7), 7},
		{ts(7) + 1, 8},
		{ts(50), 50},
		{ts(50) - 5, 50},
		{ts(106), 106},
		{ts(106) + 1, 107},
		{1 << 62, 107},
	}
	// Every boundary between segments too.
	for _, s := range l.Segments() {
		if s.Count > 0 {
			cases = append(cases, struct{ ts, want int64 }{s.MinTime, s.BaseIndex}, struct{ ts, want int64 }{s.MaxTime, s.BaseIndex + s.Count - 1})
		}
	}
	for _, tc := range cases {
		got, err := l.SearchTime(tc.ts)
		if err != nil || got != tc.want {
			t.Errorf("SearchTime(%d) = %d, %v; want %d", tc.ts, got, err, tc.want)
		}
	}
	// After a Cut the active segment is empty: searches past the end still give NextIndex.
	if err := l.Cut(); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.SearchTime(ts(106) + 1); got != 107 {
		t.Errorf("SearchTime past the end after Cut = %d, want 107", got)
	}
	if got, _ := l.SearchTime(ts(106)); got != 106 {
		t.Errorf("SearchTime(last) after Cut = %d, want 106", got)
	}
}

func TestDeleteBeforeAndCut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := wlog.Options{SegmentBytes: 1024}
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, opts)
	appendRange(t, c, l, 0, 80)
	segs := l.Segments()
	if len(segs) < 4 {
		t.Fatalf("want at least 4 segments, got %d", len(segs))
	}

	// An index inside segment 2 deletes segments 0 and 1 only.
	mid := segs[2].BaseIndex + 1
	n, b, err := l.DeleteBefore(mid)
	if err != nil {
		t.Fatal(err)
	}
	if want := segs[0].Count + segs[1].Count; n != want || b != segs[0].Bytes+segs[1].Bytes {
		t.Fatalf("DeleteBefore removed %d records %d bytes, want %d, %d", n, b, want, segs[0].Bytes+segs[1].Bytes)
	}
	if l.FirstIndex() != segs[2].BaseIndex {
		t.Fatalf("FirstIndex = %d, want %d", l.FirstIndex(), segs[2].BaseIndex)
	}
	for _, s := range segs[:2] {
		if _, err := os.Stat(s.Path); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", s.Path, err)
		}
	}
	if _, err := l.Read(segs[2].BaseIndex-1, 1, 0); !errors.Is(err, storage.ErrOffsetOutOfRange) {
		t.Fatalf("Read below FirstIndex: %v, want ErrOffsetOutOfRange", err)
	}
	checkRecords(t, l, l.FirstIndex(), 80)

	// Far beyond NextIndex: every sealed segment goes, the active one stays.
	if _, _, err := l.DeleteBefore(1 << 40); err != nil {
		t.Fatal(err)
	}
	if got := l.Segments(); len(got) != 1 || got[0].Sealed {
		t.Fatalf("after DeleteBefore(huge) segments = %+v, want the active one", got)
	}
	active := l.Segments()[0]
	checkRecords(t, l, active.BaseIndex, 80)

	// Cut seals it; then it can be deleted.
	if err := l.Cut(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "00000000000000000080.seg")); err != nil {
		t.Fatalf("Cut did not create the next segment: %v", err)
	}
	if _, _, err := l.DeleteBefore(80); err != nil {
		t.Fatal(err)
	}
	if l.FirstIndex() != 80 || l.NextIndex() != 80 {
		t.Fatalf("FirstIndex, NextIndex = %d, %d; want 80, 80", l.FirstIndex(), l.NextIndex())
	}
	appendRange(t, c, l, 80, 85)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, dir, opts)
	if l2.FirstIndex() != 80 {
		t.Fatalf("FirstIndex after reopen = %d, want 80", l2.FirstIndex())
	}
	checkRecords(t, l2, 80, 85)
}

func TestLargeRecordGetsItsOwnSegment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := wlog.Options{SegmentBytes: 1024}
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, opts)
	big := make([]byte, 5000)
	for i := range big {
		big[i] = byte(i)
	}
	recs := []wlog.Record{{Timestamp: 1, Body: []byte("small")}, {Timestamp: 2, Body: big}, {Timestamp: 3, Body: []byte("after")}}
	if _, err := c.Append(context.Background(), l, recs); err != nil {
		t.Fatal(err)
	}
	check := func(l *wlog.Log) {
		t.Helper()
		got, err := l.Read(0, 3, 0)
		if err != nil || len(got) != 3 {
			t.Fatalf("Read = %d records, %v", len(got), err)
		}
		for i := range recs {
			if got[i].Timestamp != recs[i].Timestamp || string(got[i].Body) != string(recs[i].Body) {
				t.Fatalf("record %d differs", i)
			}
		}
	}
	check(l)
	if n := len(l.Segments()); n != 3 {
		t.Fatalf("want 3 segments (small, big alone, after), got %d", n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	check(openLog(t, dir, opts))
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	for _, o := range []wlog.Options{
		{SegmentBytes: 100},
		{SegmentBytes: 1 << 40},
		{MaxRecordBytes: -1},
		{MaxRecordBytes: 2 << 30},
		{FirstIndex: -5},
	} {
		dir := filepath.Join(t.TempDir(), "log")
		if _, err := wlog.Open(dir, o); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("Open(%+v) error = %v, want ErrInvalidArgument", o, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("Open(%+v) created the directory", o)
		}
	}
}

func TestRemove(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "topic")
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, wlog.Options{SegmentBytes: 1024})
	appendRange(t, c, l, 0, 40)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := wlog.Remove(dir, wlog.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory still there: %v", err)
	}
	if err := wlog.Remove(dir, wlog.Options{}); err != nil {
		t.Fatalf("Remove of a missing directory: %v", err)
	}
}

func TestClosedLog(t *testing.T) {
	t.Parallel()
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, t.TempDir(), wlog.Options{})
	appendRange(t, c, l, 0, 3)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Append(context.Background(), l, []wlog.Record{rec(3)}); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("Append after Close: %v, want ErrClosed", err)
	}
	if _, err := l.Read(0, 1, 0); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("Read after Close: %v, want ErrClosed", err)
	}
	if err := l.Cut(); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("Cut after Close: %v, want ErrClosed", err)
	}
	if _, _, err := l.DeleteBefore(1); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("DeleteBefore after Close: %v, want ErrClosed", err)
	}
}

func TestCleanCloseIndexIsRemovedBeforeAppend(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, wlog.Options{})
	appendRange(t, c, l, 0, 10)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	idx := filepath.Join(dir, "00000000000000000000.idx")
	if _, err := os.Stat(idx); err != nil {
		t.Fatalf("clean Close left no index of the active segment: %v", err)
	}
	l2 := openLog(t, dir, wlog.Options{})
	checkRecords(t, l2, 0, 10)
	if _, err := os.Stat(idx); err != nil {
		t.Fatalf("Open removed the index before any append: %v", err)
	}
	appendRange(t, c, l2, 10, 11)
	if _, err := os.Stat(idx); !os.IsNotExist(err) {
		t.Fatalf("the index of the active segment survived an append: %v", err)
	}
	// A crash now (copy of the files while open): Open scans and finds all 11.
	crashed := copyDir(t, dir)
	checkRecords(t, openLog(t, crashed, wlog.Options{}), 0, 11)
}

// TestOpenSyncsNewDirectories checks that Open fsyncs the parent of every directory it creates:
// without it a crash could lose a new log's directory with acknowledged records in it.
func TestOpenSyncsNewDirectories(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b", "log")
	efs := wlogtest.NewErrorFS(nil, nil)
	var mu sync.Mutex
	var synced []string
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpSyncDir {
			mu.Lock()
			synced = append(synced, path)
			mu.Unlock()
		}
		return nil
	})
	openLog(t, dir, wlog.Options{FS: efs})
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{root, filepath.Join(root, "a"), filepath.Join(root, "a", "b"), dir} {
		if !slices.Contains(synced, want) {
			t.Errorf("directory %s not synced (synced: %v)", want, synced)
		}
	}
}

// TestReadAtNextIndexDuringRoll reads at NextIndex while a round that wrote records into the
// active segment and then cut a new one is still syncing: the sealed segment's last records and
// the new segment are not published yet, and Read must return nothing (it once indexed the new
// segment with a negative position and panicked).
func TestReadAtNextIndexDuringRoll(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, t.TempDir(), wlog.Options{FS: efs, SegmentBytes: 1024})
	var rolled, blocked atomic.Bool
	var syncsAfterRoll atomic.Int32
	blockedCh, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseAll()
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpRename && strings.HasSuffix(path, ".seg") {
			rolled.Store(true) // a new segment was installed
		}
		// The first sync after that is the sealed segment's (the roll's, before the new segment
		// becomes active); hold every one from the second on: the round's own sync among them.
		if op == wlogtest.OpSync && rolled.Load() && syncsAfterRoll.Add(1) >= 2 {
			if blocked.CompareAndSwap(false, true) {
				close(blockedCh)
			}
			<-release
		}
		return nil
	})
	// Three records per append, so that a round fills the segment and rolls in the middle.
	done := make(chan error, 1)
	for i := int64(0); !blocked.Load(); i += 3 {
		c.AppendAsync(l, []wlog.Record{rec(i), rec(i + 1), rec(i + 2)}, func(_ int64, err error) { done <- err })
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-blockedCh:
		}
	}
	if len(l.Segments()) < 2 {
		t.Fatalf("no new segment while the round is syncing: %+v", l.Segments())
	}
	next := l.NextIndex()
	recs, err := func() (recs []wlog.Record, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("Read panicked: %v", p)
			}
		}()
		return l.Read(next, 10, 0)
	}()
	if err != nil || len(recs) != 0 {
		t.Fatalf("Read(NextIndex %d) during the round = %d records, %v; want nothing", next, len(recs), err)
	}
	if _, err := l.SearchTime(ts(next)); err != nil {
		t.Fatalf("SearchTime during the round: %v", err)
	}
	releaseAll()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkRecords(t, l, 0, l.NextIndex())
}

// TestSpareWithAFailedWritebackIsNotUsed: when writing the zeros of the next segment back fails
// (a disk error), that file is not used: after a failed writeback its page cache cannot be
// trusted. The roll creates a fresh segment instead, says why, and leaves no spare behind.
func TestSpareWithAFailedWritebackIsNotUsed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var logBuf testutil.SyncBuffer
	opened, failed := make(chan struct{}), make(chan struct{})
	var openOnce, failOnce sync.Once
	efs := wlogtest.NewErrorFS(nil, func(op wlogtest.Op, path string) error {
		if !strings.HasPrefix(filepath.Base(path), "spare") {
			return nil
		}
		switch op {
		case wlogtest.OpOpen:
			openOnce.Do(func() { close(opened) })
		case wlogtest.OpSyncRange:
			failOnce.Do(func() { close(failed) })
			return wlogtest.ErrInjected
		}
		return nil
	})
	l := openLog(t, dir, wlog.Options{FS: efs, SegmentBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	c := newCommitter(t, wlog.CommitterOptions{Sync: wlog.SyncAlways})
	body := make([]byte, 1000)
	appendOne := func() {
		t.Helper()
		if _, err := c.Append(context.Background(), l, []wlog.Record{{Body: body}}); err != nil {
			t.Fatal(err)
		}
	}
	for waited := false; len(l.Segments()) < 2; {
		appendOne()
		select {
		case <-opened:
			if !waited { // the spare is being prepared: let its first chunk fail before the roll
				select {
				case <-failed:
				case <-time.After(30 * time.Second):
					t.Fatal("the spare's zeros were not written back in 30 s")
				}
				waited = true
			}
		default:
		}
	}
	if !strings.Contains(logBuf.String(), "wal segment preparation failed") || !strings.Contains(logBuf.String(), wlogtest.ErrInjected.Error()) {
		t.Fatalf("log after the roll:\n%s\nwant the failed preparation reported", logBuf.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "spare.seg.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("spare file after the roll: %v, want it removed", err)
	}
	recs, err := l.Read(0, int(l.NextIndex()), 0)
	if err != nil || int64(len(recs)) != l.NextIndex() {
		t.Fatalf("Read = %d records, %v; want %d", len(recs), err, l.NextIndex())
	}
}

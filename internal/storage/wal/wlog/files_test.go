package wlog_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
)

// openCounter counts the files opened under each path.
type openCounter struct {
	wlog.FS
	mu    sync.Mutex
	opens map[string]int
}

func newOpenCounter() *openCounter { return &openCounter{FS: wlog.OSFS(), opens: map[string]int{}} }

func (c *openCounter) OpenFile(name string, flag int, perm fs.FileMode) (wlog.File, error) {
	c.mu.Lock()
	c.opens[name]++
	c.mu.Unlock()
	return c.FS.OpenFile(name, flag, perm)
}

func (c *openCounter) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opens[name]
}

// TestFilesBoundIdleSegments: logs sharing a Files of 4 keep at most 4 segment files open
// between operations, however many logs and segments there are; every record reads back after
// its file was closed and opened again, and closing the logs closes everything.
func TestFilesBoundIdleSegments(t *testing.T) {
	const logs, bound, n = 20, 4, 200
	files := wlog.NewFiles(bound)
	c := newCommitter(t, wlog.CommitterOptions{})
	dir := t.TempDir()
	opts := wlog.Options{SegmentBytes: 4 << 10, FirstSegmentBytes: 4 << 10, Files: files}
	check := func(what string) {
		t.Helper()
		if st := files.Stats(); st.Open > bound {
			t.Fatalf("%s: %d files open, want at most %d", what, st.Open, bound)
		}
	}
	var ls []*wlog.Log
	for i := range logs {
		ls = append(ls, openLog(t, filepath.Join(dir, fmt.Sprint(i)), opts))
		check("open")
	}
	for _, l := range ls {
		appendRange(t, c, l, 0, n)
		check("append")
	}
	if segs := len(ls[0].Segments()); segs < 3 {
		t.Fatalf("%d segments per log, want several", segs)
	}
	opens := files.Stats().Opens
	for _, l := range ls {
		checkRecords(t, l, 0, n)
		check("read")
	}
	if files.Stats().Opens == opens {
		t.Fatal("reading every log opened no file again: nothing was closed")
	}
	for _, l := range ls {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if st := files.Stats(); st.Open != 0 {
		t.Fatalf("%d files open after every log was closed", st.Open)
	}
	// Reopened under the same bound, the logs recover and read back.
	for i := range logs {
		l := openLog(t, filepath.Join(dir, fmt.Sprint(i)), opts)
		check("reopen")
		checkRecords(t, l, 0, n)
	}
}

// TestFilesBusyLogStaysOpen: a log appended to all the time keeps its active segment open (one
// file per segment, never reopened between rounds) while other logs sharing a Files of 2 are read
// between its rounds, each read opening a file again and evicting the idle file used the longest
// ago (the last log read, not the busy one); and a log with PinActive keeps it open while other
// logs' reads close every other file.
func TestFilesBusyLogStaysOpen(t *testing.T) {
	files := wlog.NewFiles(2)
	cnt := newOpenCounter()
	c := newCommitter(t, wlog.CommitterOptions{})
	dir := t.TempDir()
	opts := wlog.Options{FS: cnt, Files: files}
	busy := openLog(t, filepath.Join(dir, "busy"), opts)
	var readers []*wlog.Log
	for i := range 4 {
		l := openLog(t, filepath.Join(dir, fmt.Sprint("r", i)), opts)
		appendRange(t, c, l, 0, 5)
		readers = append(readers, l)
	}
	appendRange(t, c, busy, 0, 1) // opens its file again: the readers' files evicted it
	active := busy.Segments()[0].Path
	before, opens := cnt.count(active), files.Stats().Opens
	for i := range int64(300) {
		checkRecords(t, readers[i%4], 0, 5)
		appendRange(t, c, busy, i+1, i+2)
	}
	if n := cnt.count(active) - before; n != 0 {
		t.Fatalf("active segment of a busy log opened again %d times in 300 appends, want 0", n)
	}
	if n := files.Stats().Opens - opens; n < 290 {
		t.Fatalf("%d files opened again by 300 reads of 4 other logs with a bound of 2, want one a read", n)
	}

	pinOpts := opts
	pinOpts.PinActive = true
	pinned := openLog(t, filepath.Join(dir, "pinned"), pinOpts)
	var others []*wlog.Log
	for i := range 4 {
		l := openLog(t, filepath.Join(dir, fmt.Sprint(i)), opts)
		appendRange(t, c, l, 0, 5)
		others = append(others, l)
	}
	path := pinned.Segments()[0].Path
	for i := range int64(20) {
		appendRange(t, c, pinned, i, i+1)
		for _, l := range others {
			checkRecords(t, l, 0, 5)
		}
	}
	if n := cnt.count(path); n != 0 {
		t.Fatalf("pinned active segment opened again %d times, want 0", n)
	}
	if n := cnt.count(others[0].Segments()[0].Path); n < 10 {
		t.Fatalf("an idle log's segment opened %d times over 20 rounds of reads with a bound of 2, want it closed between them", n)
	}
}

// TestFilesShedIdleOnEMFILE: when the process runs out of descriptors while the pool is under
// its bound (connections took the rest of ulimit -n), an open closes idle files of the pool and
// tries again: opening logs (a new segment each), appending to and reading logs whose files were
// closed, and cutting (a new segment) all succeed. Before, each failed with EMFILE while the idle
// files sat open under the bound.
func TestFilesShedIdleOnEMFILE(t *testing.T) {
	const logs, limit = 8, 3
	files := wlog.NewFiles(100) // far above what the "process" allows
	efs := wlogtest.NewErrorFS(nil, nil)
	efs.SetInjector(wlogtest.FDLimit(efs, limit))
	c := newCommitter(t, wlog.CommitterOptions{})
	dir := t.TempDir()
	opts := wlog.Options{FS: efs, Files: files}
	var ls []*wlog.Log
	for i := range logs {
		ls = append(ls, openLog(t, filepath.Join(dir, fmt.Sprint(i)), opts))
	}
	for i := range int64(3) {
		for _, l := range ls {
			appendRange(t, c, l, i, i+1)
		}
	}
	for _, l := range ls {
		checkRecords(t, l, 0, 3)
	}
	for i, l := range ls {
		if err := l.Cut(); err != nil {
			t.Fatalf("Cut of log %d: %v", i, err)
		}
	}
	for _, l := range ls {
		appendRange(t, c, l, 3, 4)
		checkRecords(t, l, 0, 4)
	}
	st := files.Stats()
	if st.Shed == 0 {
		t.Fatal("no idle file closed for lack of descriptors")
	}
	if n := efs.OpenFiles(); n > limit {
		t.Fatalf("%d files open, the limit is %d", n, limit)
	}
	t.Logf("%d idle files shed, %d open", st.Shed, st.Open)
}

// TestFilesConcurrent: appends, reads, time searches, cuts and deletions on 12 logs sharing a
// Files of 3 run at once (under -race); every record reads back and nothing stays open.
func TestFilesConcurrent(t *testing.T) {
	const logs, per = 12, 300
	files := wlog.NewFiles(3)
	c := newCommitter(t, wlog.CommitterOptions{})
	dir := t.TempDir()
	opts := wlog.Options{SegmentBytes: 2 << 10, FirstSegmentBytes: 1 << 10, Files: files}
	ls := make([]*wlog.Log, logs)
	for i := range ls {
		ls[i] = openLog(t, filepath.Join(dir, fmt.Sprint(i)), opts)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	for i, l := range ls {
		wg.Go(func() {
			for j := int64(0); j < per; j++ {
				if _, err := c.Append(context.Background(), l, []wlog.Record{rec(j)}); err != nil {
					fail(fmt.Errorf("log %d append %d: %w", i, j, err))
					return
				}
				if j%50 == 49 {
					if err := l.Cut(); err != nil {
						fail(err)
						return
					}
				}
			}
		})
	}
	var readers sync.WaitGroup
	for r := range 3 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for !stop.Load() {
				l := ls[rng.IntN(logs)]
				first, next := l.FirstIndex(), l.NextIndex()
				if next == first {
					continue
				}
				i := first + rng.Int64N(next-first)
				recs, err := l.Read(i, 5, 0)
				if errors.Is(err, storage.ErrOffsetOutOfRange) {
					continue // a deletion passed it
				}
				if err != nil { // a file closed under the read would fail here
					fail(fmt.Errorf("read %d of %s: %w", i, l.Dir(), err))
					return
				}
				for k, got := range recs {
					if want := rec(i + int64(k)); got.Timestamp != want.Timestamp || string(got.Body) != string(want.Body) {
						fail(fmt.Errorf("record %d of %s differs", i+int64(k), l.Dir()))
						return
					}
				}
				if _, err := l.SearchTime(ts(i)); err != nil && !errors.Is(err, storage.ErrOffsetOutOfRange) {
					fail(err)
					return
				}
				if rng.IntN(20) == 0 {
					if _, _, err := l.DeleteBefore(i); err != nil {
						fail(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	readers.Wait()
	if p := failed.Load(); p != nil {
		t.Fatal(*p)
	}
	for _, l := range ls {
		checkRecords(t, l, l.FirstIndex(), per)
	}
	if st := files.Stats(); st.Open > 3 {
		t.Fatalf("%d files open once idle, want at most 3", st.Open)
	}
	for _, l := range ls {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if st := files.Stats(); st.Open != 0 {
		t.Fatalf("%d files open after Close", st.Open)
	}
}

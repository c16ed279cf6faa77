package wlog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// flushFS is the OS filesystem with a FlushSharer answer chosen by the test (the device is the
// name of the log's directory up to its first '-': "a-1" and "a-2" share one), a record of the
// syncs and write-backs in the order they ran, and a gate that can hold the next Datasync of one
// directory, or fail it.
type flushFS struct {
	FS
	share bool
	mu    sync.Mutex
	ops   []string
	hold  string        // directory whose next Datasync waits for release
	held  chan struct{} // closed when that Datasync started waiting
	rel   chan struct{}
	fail  string // directory whose next Datasync fails
	// failRange: directory whose next SyncRange fails
	failRange string
}

type flushFile struct {
	File
	fs  *flushFS
	dir string
}

func (f *flushFS) FlushDomain(dir string) (uint64, bool) {
	dev := strings.SplitN(filepath.Base(dir), "-", 2)[0]
	return uint64(dev[0]), f.share
}

func (f *flushFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &flushFile{File: file, fs: f, dir: filepath.Base(filepath.Dir(name))}, nil
}

func (f *flushFS) note(op string) {
	f.mu.Lock()
	f.ops = append(f.ops, op)
	f.mu.Unlock()
}

// take returns the operations recorded since the last take.
func (f *flushFS) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ops := f.ops
	f.ops = nil
	return ops
}

// holdNext makes the next Datasync of dir wait until the returned release is called.
func (f *flushFS) holdNext(dir string) (held <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold, f.held, f.rel = dir, make(chan struct{}), make(chan struct{})
	rel := f.rel
	return f.held, func() { close(rel) }
}

var errFlush = errors.New("injected flush failure")

func (file *flushFile) Datasync() error {
	f := file.fs
	f.mu.Lock()
	var wait chan struct{}
	if f.hold == file.dir {
		close(f.held)
		wait, f.hold = f.rel, ""
	}
	fail := f.fail == file.dir
	if fail {
		f.fail = ""
	}
	f.mu.Unlock()
	if wait != nil {
		<-wait
	}
	f.note("datasync " + file.dir)
	if fail {
		return errFlush
	}
	return file.File.Datasync()
}

func (file *flushFile) StartWriteback(off, n int64) error {
	file.fs.note(fmt.Sprintf("writeback %s %d+%d", file.dir, off, n))
	return file.File.StartWriteback(off, n)
}

func (file *flushFile) SyncRange(off, n int64) error {
	f := file.fs
	f.note(fmt.Sprintf("syncrange %s %d+%d", file.dir, off, n))
	f.mu.Lock()
	fail := f.failRange == file.dir
	if fail {
		f.failRange = ""
	}
	f.mu.Unlock()
	if fail {
		return errFlush
	}
	return file.File.SyncRange(off, n)
}

// shareLogs opens a committer and a log in each of dirs (under one temporary directory) on a
// flushFS, and makes every log's first segment durable up to its first zeroAhead chunk (a round
// of its own that zeroes ahead and syncs).
func shareLogs(t *testing.T, share bool, dirs ...string) (*flushFS, *Committer, []*Log) {
	t.Helper()
	return shareLogsWith(t, share, Options{}, dirs...)
}

// shareLogsWith is shareLogs with Options (FS and SegmentBytes are set).
func shareLogsWith(t *testing.T, share bool, opts Options, dirs ...string) (*flushFS, *Committer, []*Log) {
	t.Helper()
	ffs := &flushFS{FS: OSFS(), share: share}
	opts.FS, opts.SegmentBytes, opts.FirstSegmentBytes = ffs, 8<<20, 8<<20
	c := NewCommitter(CommitterOptions{})
	t.Cleanup(func() { c.Close() })
	root := t.TempDir()
	var logs []*Log
	for _, d := range dirs {
		l, err := Open(filepath.Join(root, d), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		if _, err := c.Append(context.Background(), l, []Record{{Timestamp: 1, Body: []byte("first")}}); err != nil {
			t.Fatal(err)
		}
		logs = append(logs, l)
	}
	ffs.take()
	return ffs, c, logs
}

// roundOf appends to the logs in one round: the first log's round is held in its sync while the
// others' requests queue, then the round that takes them all runs. It returns the operations of
// that round and the results of its appends.
func roundOf(t *testing.T, ffs *flushFS, c *Committer, logs []*Log, body []byte) ([]string, []error) {
	t.Helper()
	held, release := ffs.holdNext(filepath.Base(logs[0].dir))
	first := make(chan error, 1)
	c.AppendAsync(logs[0], []Record{{Timestamp: 2, Body: []byte("warm")}}, func(_ int64, err error) { first <- err })
	<-held
	errs := make([]error, len(logs))
	var wg sync.WaitGroup
	for i, l := range logs {
		wg.Add(1)
		c.AppendAsync(l, []Record{{Timestamp: 3, Body: body}}, func(_ int64, err error) { errs[i] = err; wg.Done() })
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	ops := ffs.take()
	if len(ops) == 0 || ops[0] != "datasync "+filepath.Base(logs[0].dir) {
		t.Fatalf("ops %q: want the held round's fdatasync first", ops)
	}
	return ops[1:], errs
}

// TestLogsOfARoundShareOneFlush: when two logs on one device (of a filesystem that overwrites in
// place) both write into blocks made durable before, the round writes the second back
// (SyncRange) and fdatasyncs only the first: one cache flush for both. The rider's appends
// complete only after the anchor's fdatasync returned, and everything reads back.
func TestLogsOfARoundShareOneFlush(t *testing.T) {
	ffs, c, logs := shareLogs(t, true, "a-1", "a-2")
	ops, errs := roundOf(t, ffs, c, logs, []byte("shared"))
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	rider := fmt.Sprintf("a-2 %d+%d", SegmentHeaderBytes+FrameBytes(5), FrameBytes(6))
	anchor := fmt.Sprintf("a-1 %d+0", SegmentHeaderBytes+FrameBytes(5)+FrameBytes(4))
	want := []string{"writeback " + rider, "writeback " + anchor, "syncrange " + rider, "datasync a-1"}
	if !slices.Equal(ops, want) {
		t.Fatalf("round ran %q, want %q (both written back at once, the rider waited for, then the anchor's one fdatasync)", ops, want)
	}

	// The rider completes only when the anchor's fdatasync returned.
	held, release := ffs.holdNext("a-1")
	first := make(chan error, 1)
	c.AppendAsync(logs[0], []Record{{Timestamp: 5, Body: []byte("y")}}, func(_ int64, err error) { first <- err })
	<-held
	riderDone := make(chan error, 1)
	anchorDone := make(chan error, 1)
	c.AppendAsync(logs[0], []Record{{Timestamp: 6, Body: []byte("z")}}, func(_ int64, err error) { anchorDone <- err })
	c.AppendAsync(logs[1], []Record{{Timestamp: 6, Body: []byte("z")}}, func(_ int64, err error) { riderDone <- err })
	held2, release2 := ffs.holdNext("a-1") // the shared round's fdatasync
	release()
	<-first
	<-held2
	select {
	case err := <-riderDone:
		t.Fatalf("the rider completed (%v) while the anchor's fdatasync was still running", err)
	case <-time.After(50 * time.Millisecond):
	}
	release2()
	if err := errors.Join(<-riderDone, <-anchorDone); err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		recs, err := l.Read(0, 10, 0)
		if err != nil || len(recs) != int(l.NextIndex()) {
			t.Fatalf("%s: read %d records of %d: %v", l.dir, len(recs), l.NextIndex(), err)
		}
	}
}

// TestLogsOfARoundFlushAlone: a log syncs itself when it may not ride: another device, a
// filesystem that does not overwrite in place, sharing switched off (Options.NoSharedFlush), a
// round that writes past what an fdatasync of its segment made durable (zeros written ahead by
// this round change the blocks' metadata), or a segment recovered by Open that no fdatasync made
// durable yet (it anchors instead).
func TestLogsOfARoundFlushAlone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share bool
		opts  Options
		dirs  [2]string
		body  []byte
	}{
		{name: "other device", share: true, dirs: [2]string{"a-1", "b-1"}, body: []byte("x")},
		{name: "no shared flush on this filesystem", dirs: [2]string{"a-1", "a-2"}, body: []byte("x")},
		{name: "switched off", share: true, opts: Options{NoSharedFlush: true}, dirs: [2]string{"a-1", "a-2"}, body: []byte("x")},
		// The round crosses the first zeroAhead chunk.
		{name: "past the durable blocks", share: true, dirs: [2]string{"a-1", "a-2"}, body: make([]byte, zeroAhead)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ffs, c, logs := shareLogsWith(t, tc.share, tc.opts, tc.dirs[:]...)
			ops, errs := roundOf(t, ffs, c, logs, tc.body)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(ops, "datasync "+tc.dirs[0]) || !slices.Contains(ops, "datasync "+tc.dirs[1]) {
				t.Fatalf("round ran %q, want an fdatasync of each log", ops)
			}
			if slices.ContainsFunc(ops, func(op string) bool { return strings.HasPrefix(op, "syncrange") }) {
				t.Fatalf("round ran %q: a log rode on another's flush", ops)
			}
		})
	}
	t.Run("recovered segment before its first sync", func(t *testing.T) {
		ffs, c, logs := shareLogs(t, true, "a-1", "a-2")
		dir := logs[1].dir
		if err := logs[1].Close(); err != nil {
			t.Fatal(err)
		}
		l, err := Open(dir, Options{FS: ffs, SegmentBytes: 8 << 20, FirstSegmentBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ffs.take()
		ops, errs := roundOf(t, ffs, c, []*Log{logs[0], l}, []byte("x"))
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		// The recovered log must fdatasync: it is the anchor, and the other rides on it.
		if !slices.Contains(ops, "datasync a-2") || slices.Contains(ops, "datasync a-1") ||
			slices.ContainsFunc(ops, func(op string) bool { return strings.HasPrefix(op, "syncrange a-2") }) {
			t.Fatalf("round ran %q, want one fdatasync, of the recovered log, the other riding on it", ops)
		}
	})
}

// TestSharedFlushFailureFailsTheRider: when the anchor's fdatasync fails, the rider's appends
// fail too and its log is failed (what reached its disk is unknown), as on a failed sync of its
// own.
func TestSharedFlushFailureFailsTheRider(t *testing.T) {
	ffs, c, logs := shareLogs(t, true, "a-1", "a-2")
	held, release := ffs.holdNext("a-1")
	first := make(chan error, 1)
	c.AppendAsync(logs[0], []Record{{Timestamp: 2, Body: []byte("warm")}}, func(_ int64, err error) { first <- err })
	<-held
	var riderErr, anchorErr error
	var wg sync.WaitGroup
	wg.Add(2)
	c.AppendAsync(logs[0], []Record{{Timestamp: 3, Body: []byte("x")}}, func(_ int64, err error) { anchorErr = err; wg.Done() })
	c.AppendAsync(logs[1], []Record{{Timestamp: 3, Body: []byte("x")}}, func(_ int64, err error) { riderErr = err; wg.Done() })
	ffs.mu.Lock()
	ffs.fail = "a-1" // the held sync already passed the failure check: this is the shared round's
	ffs.mu.Unlock()
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !errors.Is(anchorErr, errFlush) || !errors.Is(riderErr, errFlush) {
		t.Fatalf("anchor: %v, rider: %v; want both to fail with the shared flush", anchorErr, riderErr)
	}
	if _, err := c.Append(context.Background(), logs[1], []Record{{Timestamp: 4, Body: []byte("y")}}); err == nil {
		t.Fatal("the rider's log accepted an append after its shared flush failed")
	}
	ops := ffs.take()
	if slices.Contains(ops, "datasync a-2") {
		t.Fatalf("ops %q: the rider synced itself", ops)
	}
}

// TestFailedWriteBackFailsTheRider: when a rider's write-back fails, its appends fail and its log
// is failed; the anchor's round is unaffected.
func TestFailedWriteBackFailsTheRider(t *testing.T) {
	ffs, c, logs := shareLogs(t, true, "a-1", "a-2")
	ffs.mu.Lock()
	ffs.failRange = "a-2"
	ffs.mu.Unlock()
	ops, errs := roundOf(t, ffs, c, logs, []byte("x"))
	if errs[0] != nil || !errors.Is(errs[1], errFlush) {
		t.Fatalf("anchor: %v, rider: %v; want the rider alone to fail", errs[0], errs[1])
	}
	if slices.Contains(ops, "datasync a-2") {
		t.Fatalf("ops %q: the rider synced after its write-back failed", ops)
	}
	if _, err := c.Append(context.Background(), logs[1], []Record{{Timestamp: 4, Body: []byte("y")}}); err == nil {
		t.Fatal("the rider's log accepted an append after its write-back failed")
	}
	if _, err := c.Append(context.Background(), logs[0], []Record{{Timestamp: 4, Body: []byte("y")}}); err != nil {
		t.Fatalf("the anchor's log: %v", err)
	}
}

package wlog

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// emfileFS fails the first reopen (no O_CREATE) of the file at path with EMFILE, like a process
// whose descriptors went to connections.
type emfileFS struct {
	FS
	path   atomic.Pointer[string]
	failed atomic.Bool
}

func (e *emfileFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	if p := e.path.Load(); p != nil && name == *p && flag&os.O_CREATE == 0 && !e.failed.Swap(true) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EMFILE}
	}
	return e.FS.OpenFile(name, flag, perm)
}

// TestSpareReopenShedsIdleFiles: a spare prepared whole is closed until the roll; when opening it
// again fails for lack of descriptors, the roll closes idle files of the pool and installs the
// spare (zero-filled) rather than dropping it and creating a segment that needs zeroing.
func TestSpareReopenShedsIdleFiles(t *testing.T) {
	files := NewFiles(10) // under its bound: only the "process" lacks descriptors
	dir := t.TempDir()
	other, err := Open(filepath.Join(dir, "other"), Options{Files: files}) // an idle file
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	efs := &emfileFS{FS: OSFS()}
	l, err := Open(filepath.Join(dir, "l"), Options{FS: efs, Files: files, SegmentBytes: 8 * zeroAhead, FirstSegmentBytes: 8 * zeroAhead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	c := NewCommitter(CommitterOptions{})
	t.Cleanup(func() { _ = c.Close() })
	sparePath := l.sparePath()
	efs.path.Store(&sparePath)

	appendUntilRoll(t, l, c, func() {
		l.wmu.Lock()
		sp := l.spare
		l.wmu.Unlock()
		if sp == nil {
			t.Fatal("no spare prepared before the roll")
		}
		select {
		case <-sp.done:
		case <-time.After(30 * time.Second):
			t.Fatal("spare not prepared in 30 s")
		}
		if sp.f != nil || sp.err != nil {
			t.Fatalf("spare not prepared and closed: open %v, err %v", sp.f != nil, sp.err)
		}
	})
	if !efs.failed.Load() {
		t.Fatal("the spare was not opened again at the roll")
	}
	l.wmu.Lock()
	a := l.active()
	zeroed, size := a.zeroed, a.size
	l.wmu.Unlock()
	if zeroed != size {
		t.Fatalf("segment installed with zeroed %d of %d: the spare was dropped after EMFILE", zeroed, size)
	}
	if st := files.Stats(); st.Shed == 0 {
		t.Fatal("no idle file closed for lack of descriptors")
	}
	checkRecords(t, l)
}

// closeHookFS calls hook with the name of every file it closes.
type closeHookFS struct {
	FS
	hook atomic.Pointer[func(name string)]
}

type closeHookFile struct {
	File
	fs *closeHookFS
}

func (c *closeHookFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &closeHookFile{File: f, fs: c}, nil
}

func (f *closeHookFile) Close() error {
	if h := f.fs.hook.Load(); h != nil {
		(*h)(f.Name())
	}
	return f.File.Close()
}

// TestRoundClosesEvictedFilesAfterUnlock: the idle files a group-commit round evicts, when it
// opens its segment again or releases the segments it pinned over the bound, are closed once the
// log's writer lock is released (and the round's requests completed), not under it: a close(2)
// under Log.wmu delayed the log's next Cut, Close or round.
func TestRoundClosesEvictedFilesAfterUnlock(t *testing.T) {
	files := NewFiles(1)
	hfs := &closeHookFS{FS: OSFS()}
	dir := t.TempDir()
	opts := Options{FS: hfs, Files: files, SegmentBytes: 1024, FirstSegmentBytes: 1024}
	a, err := Open(filepath.Join(dir, "a"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b, err := Open(filepath.Join(dir, "b"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	c := NewCommitter(CommitterOptions{})
	t.Cleanup(func() { _ = c.Close() })
	appendOne := func(l *Log, n int) {
		t.Helper()
		if _, err := c.Append(context.Background(), l, []Record{{Body: bytes.Repeat([]byte{1}, n)}}); err != nil {
			t.Fatal(err)
		}
	}
	// watch runs f and returns whether a's writer lock was held when the file at path was closed
	// during f or after it (the round closes it after completing its requests: f may return
	// first).
	watch := func(path string, f func()) (underLock bool) {
		closed := make(chan bool, 1)
		hook := func(name string) {
			if strings.TrimSuffix(name, tmpExt) != path { // a new segment's file keeps its first name
				return
			}
			held := !a.wmu.TryLock()
			if !held {
				a.wmu.Unlock()
			}
			select {
			case closed <- held:
			default: // closed again: the first close is the one watched
			}
		}
		hfs.hook.Store(&hook)
		defer hfs.hook.Store(nil)
		f()
		select {
		case held := <-closed:
			return held
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not closed", path)
			return false
		}
	}

	// Acquire: a's round opens its file again, which evicts b's idle file.
	appendOne(b, 100)
	if watch(b.segPath(0), func() { appendOne(a, 100) }) {
		t.Fatal("b's file, evicted by a's round, closed under a's writer lock")
	}
	// Release: a's round rolls; releasing its first segment, over the bound, evicts it.
	if watch(a.segPath(0), func() { appendOne(a, 900) }) {
		t.Fatal("a's sealed segment, evicted at the end of its round, closed under a's writer lock")
	}
	if len(a.Segments()) != 2 {
		t.Fatalf("%d segments, want a roll", len(a.Segments()))
	}
}

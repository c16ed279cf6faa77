package wlog

import (
	"io/fs"
	"os"
	"path/filepath"
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

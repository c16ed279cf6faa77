package wlogtest

import (
	"errors"
	"io/fs"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// ErrInjected is the error the helpers of this package inject.
var ErrInjected = errors.New("wlogtest: injected error")

// Op names an FS or File operation.
type Op string

// The operations ErrorFS can fail and counts.
const (
	OpOpen      Op = "open"
	OpRemove    Op = "remove"
	OpRename    Op = "rename"
	OpReadDir   Op = "readdir"
	OpMkdirAll  Op = "mkdirall"
	OpSyncDir   Op = "syncdir"
	OpStat      Op = "stat"
	OpRead      Op = "read"      // File.ReadAt
	OpWrite     Op = "write"     // File.WriteAt
	OpSync      Op = "sync"      // File.Sync and File.Datasync
	OpTruncate  Op = "truncate"  // File.Truncate
	OpSyncRange Op = "syncrange" // File.SyncRange
	OpWriteback Op = "writeback" // File.StartWriteback
	OpAllocate  Op = "allocate"  // File.Allocate
)

// Injector decides the outcome of an operation on path: the error to return, or nil to run it.
// It is called concurrently.
type Injector func(op Op, path string) error

// FailNth fails exactly the nth call (1-based) of op with err and lets every other call through:
// code that retried would then succeed, so a test can tell sticky errors from retries.
func FailNth(op Op, n int, err error) Injector {
	var calls atomic.Int64
	return func(o Op, _ string) error {
		if o == op && calls.Add(1) == int64(n) {
			return err
		}
		return nil
	}
}

// FailFrom fails the nth call (1-based) of op and every later one.
func FailFrom(op Op, n int, err error) Injector {
	var calls atomic.Int64
	return func(o Op, _ string) error {
		if o == op && calls.Add(1) >= int64(n) {
			return err
		}
		return nil
	}
}

// FDLimit fails every open with EMFILE while n or more files opened through e are open, like a
// process at its limit of open files (ulimit -n) whose other descriptors went elsewhere.
func FDLimit(e *ErrorFS, n int) Injector {
	return func(op Op, _ string) error {
		if op == OpOpen && e.OpenFiles() >= n {
			return syscall.EMFILE
		}
		return nil
	}
}

// ErrorFS wraps an FS, asks an Injector before every operation and counts the operations it ran
// and the files it opened that are not closed yet. It is safe for concurrent use.
type ErrorFS struct {
	fs   wlog.FS
	inj  atomic.Pointer[Injector]
	open atomic.Int64 // files opened and not closed

	mu     sync.Mutex
	counts map[Op]int
}

var _ wlog.FS = (*ErrorFS)(nil)

// NewErrorFS returns an ErrorFS over base (wlog.OSFS() if nil) with the injector inj (nil injects
// nothing).
func NewErrorFS(base wlog.FS, inj Injector) *ErrorFS {
	if base == nil {
		base = wlog.OSFS()
	}
	e := &ErrorFS{fs: base, counts: make(map[Op]int)}
	e.SetInjector(inj)
	return e
}

// SetInjector replaces the injector; nil injects nothing.
func (e *ErrorFS) SetInjector(inj Injector) {
	if inj == nil {
		inj = func(Op, string) error { return nil }
	}
	e.inj.Store(&inj)
}

// Count returns how many calls of op ran (injected failures included).
func (e *ErrorFS) Count(op Op) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts[op]
}

// OpenFiles returns how many files opened through e are open (not closed yet).
func (e *ErrorFS) OpenFiles() int { return int(e.open.Load()) }

func (e *ErrorFS) before(op Op, path string) error {
	e.mu.Lock()
	e.counts[op]++
	e.mu.Unlock()
	return (*e.inj.Load())(op, path)
}

// OpenFile implements wlog.FS.
func (e *ErrorFS) OpenFile(name string, flag int, perm fs.FileMode) (wlog.File, error) {
	if err := e.before(OpOpen, name); err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	f, err := e.fs.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	e.open.Add(1)
	return &errorFile{File: f, e: e}, nil
}

// Remove implements wlog.FS.
func (e *ErrorFS) Remove(name string) error {
	if err := e.before(OpRemove, name); err != nil {
		return err
	}
	return e.fs.Remove(name)
}

// Rename implements wlog.FS.
func (e *ErrorFS) Rename(oldpath, newpath string) error {
	if err := e.before(OpRename, newpath); err != nil {
		return err
	}
	return e.fs.Rename(oldpath, newpath)
}

// ReadDir implements wlog.FS.
func (e *ErrorFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if err := e.before(OpReadDir, name); err != nil {
		return nil, err
	}
	return e.fs.ReadDir(name)
}

// MkdirAll implements wlog.FS.
func (e *ErrorFS) MkdirAll(path string, perm fs.FileMode) error {
	if err := e.before(OpMkdirAll, path); err != nil {
		return err
	}
	return e.fs.MkdirAll(path, perm)
}

// SyncDir implements wlog.FS.
func (e *ErrorFS) SyncDir(name string) error {
	if err := e.before(OpSyncDir, name); err != nil {
		return err
	}
	return e.fs.SyncDir(name)
}

// Stat implements wlog.FS.
func (e *ErrorFS) Stat(name string) (fs.FileInfo, error) {
	if err := e.before(OpStat, name); err != nil {
		return nil, err
	}
	return e.fs.Stat(name)
}

type errorFile struct {
	wlog.File
	e      *ErrorFS
	closed atomic.Bool
}

func (f *errorFile) Close() error {
	if !f.closed.Swap(true) {
		f.e.open.Add(-1)
	}
	return f.File.Close()
}

func (f *errorFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.e.before(OpRead, f.Name()); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *errorFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.e.before(OpWrite, f.Name()); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *errorFile) Sync() error {
	if err := f.e.before(OpSync, f.Name()); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *errorFile) Datasync() error {
	if err := f.e.before(OpSync, f.Name()); err != nil {
		return err
	}
	return f.File.Datasync()
}

func (f *errorFile) SyncRange(off, n int64) error {
	if err := f.e.before(OpSyncRange, f.Name()); err != nil {
		return err
	}
	return f.File.SyncRange(off, n)
}

func (f *errorFile) StartWriteback(off, n int64) error {
	if err := f.e.before(OpWriteback, f.Name()); err != nil {
		return err
	}
	return f.File.StartWriteback(off, n)
}

func (f *errorFile) Truncate(size int64) error {
	if err := f.e.before(OpTruncate, f.Name()); err != nil {
		return err
	}
	return f.File.Truncate(size)
}

func (f *errorFile) Allocate(off, size int64) error {
	if err := f.e.before(OpAllocate, f.Name()); err != nil {
		return err
	}
	return f.File.Allocate(off, size)
}

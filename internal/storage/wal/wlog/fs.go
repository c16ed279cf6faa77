package wlog

import (
	"errors"
	"io"
	"io/fs"
	"os"
)

// FS is the filesystem seam of a Log: the OS by default (OSFS), an error-injecting or crash-simulating
// implementation in tests (see package wlogtest). Implementations must be safe for concurrent use.
type FS interface {
	// OpenFile opens a file like os.OpenFile.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Remove removes a file or an empty directory like os.Remove.
	Remove(name string) error
	// Rename renames a file like os.Rename (atomically replacing newpath).
	Rename(oldpath, newpath string) error
	// ReadDir lists a directory like os.ReadDir, sorted by name.
	ReadDir(name string) ([]fs.DirEntry, error)
	// MkdirAll creates a directory and its parents like os.MkdirAll.
	MkdirAll(path string, perm fs.FileMode) error
	// SyncDir makes the directory's entries (creations, renames, removals) durable.
	SyncDir(name string) error
	// Stat describes a file like os.Stat.
	Stat(name string) (fs.FileInfo, error)
}

// File is an open file of an FS. ReadAt may be called concurrently with WriteAt and with other
// ReadAt calls; the Log serializes everything else.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	// Name returns the name the file was opened with.
	Name() string
	// Stat describes the file.
	Stat() (fs.FileInfo, error)
	// Sync flushes data and metadata to stable storage (fsync).
	Sync() error
	// Datasync flushes data, and the metadata needed to read it back, to stable storage
	// (fdatasync). Implementations without fdatasync call Sync.
	Datasync() error
	// SyncRange writes the dirty pages of [off, off+n) back to the disk and waits for them
	// (sync_file_range with WAIT_BEFORE, WRITE and WAIT_AFTER): no metadata and no flush of the
	// disk's cache, so it makes nothing durable; it paces background writes. Implementations
	// without it do nothing.
	SyncRange(off, n int64) error
	// StartWriteback starts writing the dirty pages of [off, off+n) back to the disk (n = 0: to
	// the end of the file) without waiting for the writes (sync_file_range with WRITE only): a
	// later SyncRange or Datasync of the range then waits for writes already in flight. It makes
	// nothing durable. Implementations without it do nothing.
	StartWriteback(off, n int64) error
	// Truncate changes the size of the file.
	Truncate(size int64) error
	// Allocate reserves disk blocks for [off, off+size), extending the file if needed; the new
	// bytes read as zeros (fallocate mode 0). Implementations without fallocate extend the file
	// with Truncate.
	Allocate(off, size int64) error
}

// FlushSharer is implemented by an FS whose files may share one cache flush (see the Committer:
// the logs of a round are written back without a flush and made durable by the cache flush of one
// fdatasync on the same device). FlushDomain reports the device of dir and whether that holds
// there: the filesystem overwrites written blocks in place without copy on write or data
// journalling, so that a write into blocks that were already written, and whose metadata is
// durable, needs no metadata to be read back, and its fdatasync sends a cache flush after it
// starts even when the file has nothing to write back. The OS implementation answers true for
// ext4 only (see FlushDomain in fs_linux.go).
type FlushSharer interface {
	FlushDomain(dir string) (dev uint64, ok bool)
}

// OSFS returns the FS of the operating system.
func OSFS() FS { return osFS{} }

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) Rename(oldpath, newpath string) error         { return os.Rename(oldpath, newpath) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error)   { return os.ReadDir(name) }
func (osFS) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }
func (osFS) Stat(name string) (fs.FileInfo, error)        { return os.Stat(name) }

func (osFS) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// osFile is an *os.File with Datasync and Allocate (fs_linux.go, fs_other.go).
type osFile struct{ *os.File }

// allocateByTruncate is the fallback of Allocate: extend the file (sparsely) if it is shorter.
func allocateByTruncate(f *os.File, off, size int64) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < off+size {
		return f.Truncate(off + size)
	}
	return nil
}

// isNotExist reports whether err says a file does not exist.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

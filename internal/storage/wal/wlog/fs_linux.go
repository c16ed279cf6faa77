//go:build linux

package wlog

import (
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"
)

// syscall runs call on f's descriptor, again as long as it fails with EINTR, and wraps its error
// in an fs.PathError naming op and the file. It goes through SyscallConn so that a concurrent
// Close cannot reuse the descriptor under it.
func (f osFile) syscall(op string, call func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = call(int(fd)); serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &fs.PathError{Op: op, Path: f.Name(), Err: serr}
	}
	return nil
}

// Datasync calls fdatasync(2).
func (f osFile) Datasync() error { return f.syscall("fdatasync", unix.Fdatasync) }

// SyncRange calls sync_file_range(2) with WAIT_BEFORE, WRITE and WAIT_AFTER.
func (f osFile) SyncRange(off, n int64) error {
	return f.syscall("sync_file_range", func(fd int) error {
		return unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	})
}

// Allocate calls fallocate(2) mode 0, falling back to extending the file when the filesystem does
// not support it.
func (f osFile) Allocate(off, size int64) error {
	err := f.syscall("fallocate", func(fd int) error { return unix.Fallocate(fd, 0, off, size) })
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return allocateByTruncate(f.File, off, size)
	}
	return err
}

// Filesystem magic numbers (statfs f_type) of the filesystems where files may share a cache
// flush (FlushSharer): ext2/3/4 and xfs overwrite written blocks in place.
const (
	ext4Magic = 0xEF53
	xfsMagic  = 0x58465342
)

// FlushDomain implements FlushSharer.
func (osFS) FlushDomain(dir string) (uint64, bool) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return 0, false
	}
	if sfs.Type != ext4Magic && sfs.Type != xfsMagic {
		return 0, false
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Dev), true
}

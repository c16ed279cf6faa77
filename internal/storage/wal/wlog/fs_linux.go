//go:build linux

package wlog

import (
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"
)

// Datasync calls fdatasync(2). It goes through SyscallConn so that a concurrent Close cannot
// reuse the descriptor under it.
func (f osFile) Datasync() error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &fs.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// SyncRange calls sync_file_range(2) with WAIT_BEFORE, WRITE and WAIT_AFTER.
func (f osFile) SyncRange(off, n int64) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &fs.PathError{Op: "sync_file_range", Path: f.Name(), Err: serr}
	}
	return nil
}

// Allocate calls fallocate(2) mode 0, falling back to extending the file when the filesystem does
// not support it.
func (f osFile) Allocate(off, size int64) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = unix.Fallocate(int(fd), 0, off, size)
			if ferr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if errors.Is(ferr, unix.EOPNOTSUPP) || errors.Is(ferr, unix.ENOSYS) {
		return allocateByTruncate(f.File, off, size)
	}
	if ferr != nil {
		return &fs.PathError{Op: "fallocate", Path: f.Name(), Err: ferr}
	}
	return nil
}

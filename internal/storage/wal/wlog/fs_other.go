//go:build !linux

package wlog

// Datasync calls Sync: fdatasync is Linux-only.
func (f osFile) Datasync() error { return f.Sync() }

// Allocate extends the file (sparsely) when it is shorter: fallocate is Linux-only.
func (f osFile) Allocate(off, size int64) error { return allocateByTruncate(f.File, off, size) }

// SyncRange does nothing: sync_file_range is Linux only.
func (f osFile) SyncRange(off, n int64) error { return nil }

// StartWriteback does nothing: sync_file_range is Linux only.
func (f osFile) StartWriteback(off, n int64) error { return nil }

// FlushDomain implements FlushSharer: never (SyncRange does nothing here).
func (osFS) FlushDomain(string) (uint64, bool) { return 0, false }

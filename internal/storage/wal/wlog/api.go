package wlog

// API CONTRACT (written by the lead; the wlog implementer replaces the panics with the real
// implementation and may add to this API, but must not change these signatures without telling the
// engine implementer).
//
// A Log is an ordered sequence of records numbered by a dense int64 index, stored in segment files
// in one directory. Each record carries a timestamp (unix nanoseconds) chosen by the caller, kept in
// the frame, and a body of bytes the log does not interpret.
//
// Durability: Append writes to the active segment (page cache) but the records are not visible to
// readers until they are durable: a Committer (group commit) syncs them and advances the log's
// durable index. Readers (Read, Scan, NextIndex) only see durable records. With SyncNone the
// committer marks records durable right after the write (named UnsafeNoSync in engine config).

import (
	"context"
	"time"
)

// Options configures a Log. Zero fields get defaults.
type Options struct {
	// FS is the filesystem seam. Defaults to the OS.
	FS FS
	// SegmentBytes is the size a segment is preallocated to and cut at. Defaults to 64 MiB.
	SegmentBytes int64
	// MaxRecordBytes bounds one record body. Defaults to 16 MiB.
	MaxRecordBytes int
	// FirstIndex is the index of the first record of a new, empty log. Defaults to 0.
	FirstIndex int64
	// Logger; nil discards.
	Logger Logger
}

// Logger is *slog.Logger; declared as the concrete type in the real implementation.
type Logger = any

// FS is the filesystem seam (see fs.go in the real implementation).
type FS = any

// Record is one record to append.
type Record struct {
	Timestamp int64 // unix ns
	Body      []byte
}

// SegmentInfo describes one segment.
type SegmentInfo struct {
	Path      string
	BaseIndex int64 // index of its first record
	Count     int64 // number of durable records in it
	Bytes     int64 // bytes used (not preallocated size)
	MinTime   int64 // smallest record timestamp, unix ns (0 if empty)
	MaxTime   int64 // largest record timestamp
	Sealed    bool  // true once a newer segment exists
}

// Log is one segmented log.
type Log struct{}

// Open opens or creates the log in dir. It recovers: a torn tail of the last segment is truncated
// to the last whole record (logged at WARN); a checksum mismatch followed by valid records, or any
// damage in a sealed segment, returns an error wrapping storage.ErrCorrupt with the file and byte
// offset.
func Open(dir string, opts Options) (*Log, error) { panic("unimplemented") }

// FirstIndex is the index of the first retained record.
func (l *Log) FirstIndex() int64 { panic("unimplemented") }

// NextIndex is the index the next appended record will get once durable: one past the last
// durable record.
func (l *Log) NextIndex() int64 { panic("unimplemented") }

// Read returns the bodies and timestamps of up to max durable records starting at index, at most
// maxBytes of bodies (but at least one record). Reading below FirstIndex returns an error wrapping
// storage.ErrOffsetOutOfRange; at NextIndex it returns nothing.
func (l *Log) Read(index int64, max int, maxBytes int) ([]Record, error) { panic("unimplemented") }

// Scan calls fn for every durable record from index on, in order, until fn returns false or an
// error. Used for replay (state log) and bulk reads.
func (l *Log) Scan(index int64, fn func(index int64, rec Record) (bool, error)) error {
	panic("unimplemented")
}

// SearchTime returns the index of the first durable record whose timestamp is >= ts, assuming
// timestamps are non-decreasing; NextIndex if none.
func (l *Log) SearchTime(ts int64) (int64, error) { panic("unimplemented") }

// Segments describes the segments, oldest first.
func (l *Log) Segments() []SegmentInfo { panic("unimplemented") }

// DeleteBefore deletes whole sealed segments whose every record has an index < index, and returns
// how many records and bytes it removed. FirstIndex moves to the base of the first kept segment.
func (l *Log) DeleteBefore(index int64) (records int64, bytes int64, err error) {
	panic("unimplemented")
}

// Cut seals the active segment (if not empty) and starts a new one: used to make an old, quiet
// active segment deletable by retention and for the state log's compaction.
func (l *Log) Cut() error { panic("unimplemented") }

// Close closes the log's files. Pending appends must have been committed.
func (l *Log) Close() error { panic("unimplemented") }

// Remove deletes the log's directory (topic deletion). The log must be closed.
func Remove(dir string, opts Options) error { panic("unimplemented") }

// SyncMode is the committer's durability.
type SyncMode int

const (
	// SyncAlways fsyncs (fdatasync) before any commit completes. The default.
	SyncAlways SyncMode = iota
	// SyncNone never fsyncs; records are durable only as far as the OS page cache is.
	SyncNone
)

// CommitterOptions configures a Committer.
type CommitterOptions struct {
	Sync SyncMode
	// OnSync, if set, is called after every sync round with its duration and the number of records
	// and distinct logs it made durable (metrics, benchmarks).
	OnSync func(took time.Duration, records int, logs int)
	Logger Logger
}

// Committer is group commit: one goroutine takes all queued appends (over any number of logs),
// writes them, fsyncs each touched log once, then completes every waiter. Concurrent callers thus
// share fsyncs. A write or sync error is sticky for the log it hit: every later append to that log
// fails with it.
type Committer struct{}

// NewCommitter starts a committer goroutine; Close stops it.
func NewCommitter(opts CommitterOptions) *Committer { panic("unimplemented") }

// Append queues records for l and blocks until they are durable (or ctx is done: the records may
// still become durable). It returns the index of the first record. Records of one Append call are
// contiguous; Appends to one log are ordered by the time they were queued.
func (c *Committer) Append(ctx context.Context, l *Log, recs []Record) (first int64, err error) {
	panic("unimplemented")
}

// AppendAsync queues records and calls done from the committer goroutine once they are durable.
// done must not block.
func (c *Committer) AppendAsync(l *Log, recs []Record, done func(first int64, err error)) {
	panic("unimplemented")
}

// Close completes queued appends and stops the goroutine.
func (c *Committer) Close() error { panic("unimplemented") }

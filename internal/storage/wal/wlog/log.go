package wlog

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/spoolmq/spool/internal/storage"
)

// Options configures a Log. Zero fields get defaults.
type Options struct {
	// FS is the filesystem seam. Defaults to the OS (OSFS).
	FS FS
	// SegmentBytes is the largest size a segment is preallocated to. Each segment is cut at its
	// own size (a record that does not fit in the active segment starts a new one; a record
	// larger than a whole segment gets a segment of its own, grown past its size). Between 1 KiB
	// and 2 GiB. Defaults to 64 MiB.
	SegmentBytes int64
	// FirstSegmentBytes is the size of the first segment of a new log. Each next segment is the
	// smallest FirstSegmentBytes x 4^k that is at least twice what the one before used, at most
	// SegmentBytes (nextSegmentBytes): a busy log reaches SegmentBytes after a few segments, an
	// empty or quiet one reserves little disk. Clamped to [1 KiB, SegmentBytes]. Defaults to
	// 64 KiB.
	FirstSegmentBytes int64
	// MaxRecordBytes bounds one record body, between 1 and 1 GiB. It also bounds what Open
	// allocates for a frame, so it must not shrink below the largest record already in the log.
	// Defaults to 16 MiB.
	MaxRecordBytes int
	// FirstIndex is the index of the first record of a new, empty log; it must not be negative.
	// Ignored when the log exists. Defaults to 0.
	FirstIndex int64
	// Logger receives warnings (torn tails, slow syncs) and debug events. Nil discards.
	Logger *slog.Logger
	// Clock stamps segment headers with their creation time and paces the retries of a spare
	// whose preparation failed (spareRetry). Defaults to the system clock.
	Clock storage.Clock
	// KeepSpare prepares the next segment ahead at all times (from Open and after every roll),
	// not only once the active segment is half full, and keeps its file open: a log that must
	// go on when the disk fills or descriptors run out (the engine's state log, which acks and
	// claims write to) keeps one segment in reserve. A failed preparation is tried again by a
	// later round, at most once a second.
	KeepSpare bool
	// NoSharedFlush makes every round of this log fdatasync the log itself, even where it could
	// ride on another log's cache flush (Committer.shareFlush, FlushSharer). For storage stacks
	// where the conditions of sharing cannot be checked from here.
	NoSharedFlush bool
	// PinActive keeps the active segment's file open at all times, whatever Files decides: for
	// a log that must never fail to open it (the engine's state log, which every ack and claim
	// writes to: an append it refuses stops the engine).
	PinActive bool
	// Files bounds the segment files open at once, shared by every log of an engine (see
	// Files): idle segments are closed, least recently used first, and opened again on use. Nil
	// gives the log a pool of its own without a bound.
	Files *Files
}

// DefaultSegmentBytes is the default Options.SegmentBytes.
const DefaultSegmentBytes = 64 << 20

// DefaultFirstSegmentBytes is the default Options.FirstSegmentBytes.
const DefaultFirstSegmentBytes = 64 << 10

// DefaultMaxRecordBytes is the default Options.MaxRecordBytes.
const DefaultMaxRecordBytes = 16 << 20

func (o Options) withDefaults() (Options, error) {
	if o.FS == nil {
		o.FS = OSFS()
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if o.FirstSegmentBytes == 0 {
		o.FirstSegmentBytes = DefaultFirstSegmentBytes
	}
	o.FirstSegmentBytes = min(max(o.FirstSegmentBytes, minSegmentBytes), o.SegmentBytes)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = storage.SystemClock{}
	}
	if o.Files == nil {
		o.Files = NewFiles(0)
	}
	switch {
	case o.SegmentBytes < minSegmentBytes || o.SegmentBytes > maxSegmentBytesLimit:
		return o, fmt.Errorf("%w: wlog: SegmentBytes must be between %d and %d, got %d",
			storage.ErrInvalidArgument, minSegmentBytes, int64(maxSegmentBytesLimit), o.SegmentBytes)
	case o.MaxRecordBytes < 1 || o.MaxRecordBytes > maxRecordBytesLimit:
		return o, fmt.Errorf("%w: wlog: MaxRecordBytes must be between 1 and %d, got %d",
			storage.ErrInvalidArgument, maxRecordBytesLimit, o.MaxRecordBytes)
	case o.FirstIndex < 0:
		return o, fmt.Errorf("%w: wlog: FirstIndex must not be negative, got %d", storage.ErrInvalidArgument, o.FirstIndex)
	}
	return o, nil
}

// Record is one record: a timestamp chosen by the caller (unix ns by convention) and a body the
// log does not interpret.
type Record struct {
	Timestamp int64 // unix ns
	Body      []byte
}

// SegmentInfo describes one segment.
type SegmentInfo struct {
	Path      string
	BaseIndex int64 // index of its first record
	Count     int64 // number of durable records in it
	Bytes     int64 // bytes used: header and durable frames (not the preallocated size)
	MinTime   int64 // smallest record timestamp, unix ns (0 if empty)
	MaxTime   int64 // largest record timestamp (0 if empty)
	Sealed    bool  // true once a newer segment exists
	Created   int64 // creation time from the segment header, unix ns
}

// Log is one segmented log: records numbered by a dense int64 index, stored in segment files in one
// directory. Records are appended through a Committer and become visible to readers once durable.
//
// All methods are safe for concurrent use. Read, Scan, SearchTime, Segments, FirstIndex and
// NextIndex never wait for a sync in progress.
//
// Locks: wmu (writer: the committer's round, Cut, Close) is taken before mu (segment list and
// published index); mu is held only for memory work, never across I/O.
type Log struct {
	dir   string
	opts  Options
	fs    FS
	files *Files
	log   *slog.Logger
	clock storage.Clock

	durable   atomic.Int64 // NextIndex; stored under mu with the published index
	first     atomic.Int64 // FirstIndex
	closed    atomic.Bool
	failed    atomic.Pointer[error] // copy of werr for the lock-free check in Append
	committer atomic.Pointer[Committer]

	mu   sync.RWMutex
	segs []*segment // oldest first; the last is the active segment. Replaced, never shrunk in place.

	wmu      sync.Mutex
	next     int64  // index of the next record written
	werr     error  // sticky write or sync error
	staleIdx bool   // the active segment has an index file to remove before it is written
	idxValid bool   // that index file matches the segment (a clean Close wrote it)
	spare    *spare // next segment being prepared
	// pinned is the segment whose file the log keeps pinned (Options.PinActive): the active one.
	pinned *segment

	maintMu sync.Mutex // serializes DeleteBefore

	bg    sync.WaitGroup // spare preparation
	round logRound       // committer goroutine only

	// flushDev is the device of dir and flushShare whether the log's rounds may share a cache
	// flush there (FlushSharer); set by Open.
	flushDev   uint64
	flushShare bool
}

// Open opens or creates the log in dir. It recovers: a torn tail of the last segment is truncated
// to the last whole record (logged at WARN); a checksum mismatch followed by valid records, or any
// damage in a sealed segment that has to be scanned, returns an error wrapping storage.ErrCorrupt
// with the file and byte offset. Sealed segments load their sidecar index instead of being scanned,
// so Open does not slow down with retained history.
func Open(dir string, opts Options) (*Log, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Log{dir: dir, opts: o, fs: o.FS, files: o.Files, clock: o.Clock,
		log: o.Logger.With(slog.String("dir", dir))}
	if err := l.mkdirDurable(dir); err != nil {
		return nil, err
	}
	if fsh, ok := o.FS.(FlushSharer); ok && !o.NoSharedFlush {
		l.flushDev, l.flushShare = fsh.FlushDomain(dir)
	}
	bases, idx, err := l.listDir()
	if err != nil {
		return nil, err
	}
	var segs []*segment
	fail := func(err error) (*Log, error) {
		for _, s := range segs {
			_ = s.h.retire()
		}
		return nil, err
	}
	if len(bases) == 0 {
		s, err := l.createSegment(o.FirstIndex, o.FirstSegmentBytes)
		if err != nil {
			return nil, err
		}
		s.h.release()
		s.publishLocked()
		segs = append(segs, s)
	}
	for i, base := range bases {
		var s *segment
		if i < len(bases)-1 {
			s, err = l.openSealed(base, bases[i+1]-base)
		} else {
			s, err = l.openLast(base, idx[base])
		}
		if err != nil {
			return fail(err)
		}
		segs = append(segs, s)
	}
	l.segs = segs
	last := segs[len(segs)-1]
	l.next = last.base + int64(len(last.pos))
	l.durable.Store(l.next)
	l.first.Store(segs[0].base)
	if o.PinActive {
		if _, err := last.h.acquire(); err != nil {
			return fail(err)
		}
		l.pinned = last
	}
	if o.KeepSpare {
		l.wmu.Lock()
		l.startSpareLocked()
		l.wmu.Unlock()
	}
	return l, nil
}

// mkdirDurable creates dir and its missing parents, and fsyncs the parent of every directory it
// created, so that a new log's directory survives a crash along with its first segment.
func (l *Log) mkdirDurable(dir string) error {
	var created []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := l.fs.Stat(d); err == nil || !isNotExist(err) || d == filepath.Dir(d) {
			break
		}
		created = append(created, d)
	}
	if len(created) == 0 {
		return nil
	}
	if err := l.fs.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("wlog: create dir %s: %w", dir, err)
	}
	for _, d := range created {
		if err := l.fs.SyncDir(filepath.Dir(d)); err != nil {
			return fmt.Errorf("wlog: sync dir %s: %w", filepath.Dir(d), err)
		}
	}
	return nil
}

// Dir returns the directory of the log.
func (l *Log) Dir() string { return l.dir }

// FirstIndex is the index of the first retained record (NextIndex when the log is empty).
func (l *Log) FirstIndex() int64 { return l.first.Load() }

// NextIndex is one past the last durable record: the index the next appended record gets once
// durable.
func (l *Log) NextIndex() int64 { return l.durable.Load() }

// Err returns the sticky write or sync error that stopped appends to the log, or nil.
func (l *Log) Err() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// setErrLocked makes err sticky. Log.wmu must be held.
func (l *Log) setErrLocked(err error) error {
	if l.werr == nil {
		l.werr = err
		l.failed.Store(&err)
		l.log.Error("wal write failed; appends to this log fail until it is reopened", slog.Any("err", err))
	}
	return l.werr
}

// span is a run of consecutive durable records of one segment to read.
type span struct {
	seg  *segment
	pos  []uint32 // frame offsets of the records
	stop int64    // end of the last frame
}

// plan collects the spans of up to max records from index, at most maxBytes of frame payload
// (at least one record; maxBytes <= 0 means no limit). It returns storage.ErrOffsetOutOfRange
// outside [FirstIndex, NextIndex].
func (l *Log) plan(dst []span, index int64, max, maxBytes int) ([]span, int, int64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	first, next := l.segs[0].base, l.durable.Load()
	if index < first || index > next {
		return dst, 0, 0, fmt.Errorf("%w: index %d outside [%d, %d]", storage.ErrOffsetOutOfRange, index, first, next)
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base > index }) - 1
	n, total, bytes := 0, int64(0), 0
	for ; i < len(l.segs) && n < max; i++ {
		s := l.segs[i]
		if index < s.base {
			// The records before s are not all published (a round that rolled to s is still
			// syncing): nothing from s on is durable yet.
			break
		}
		k := int(index - s.base)
		j := k
		for j < len(s.pos) && n < max {
			end := s.end
			if j+1 < len(s.pos) {
				end = int64(s.pos[j+1])
			}
			fb := int(end-int64(s.pos[j])) - FrameHeaderBytes
			if n > 0 && maxBytes > 0 && bytes+fb > maxBytes {
				max = n // stop here
				break
			}
			bytes += fb
			n++
			j++
		}
		if j > k {
			stop := s.end
			if j < len(s.pos) {
				stop = int64(s.pos[j])
			}
			dst = append(dst, span{seg: s, pos: s.pos[k:j], stop: stop})
			total += stop - int64(s.pos[k])
			index += int64(j - k)
		}
	}
	return dst, n, total, nil
}

// readInto reads up to max records from index into recs, using buf for the bodies. The bodies
// alias buf.
func (l *Log) readInto(index int64, max, maxBytes int, recs []Record, buf []byte) ([]Record, []byte, error) {
	var spanBuf [4]span
	spans, n, total, err := l.plan(spanBuf[:0], index, max, maxBytes)
	if err != nil || n == 0 {
		return recs, buf, err
	}
	if int64(cap(buf)) < total {
		buf = make([]byte, total)
	}
	recs = slices.Grow(recs, n)
	buf = buf[:total]
	at := int64(0)
	for _, sp := range spans {
		base := int64(sp.pos[0])
		b := buf[at : at+sp.stop-base]
		if err := sp.seg.readAt(b, base); err != nil {
			return recs, buf, l.readErr(sp.seg, base, err)
		}
		for j, p := range sp.pos {
			end := sp.stop
			if j+1 < len(sp.pos) {
				end = int64(sp.pos[j+1])
			}
			f := b[int64(p)-base : end-base]
			if why := frameCheck(f, l.opts.MaxRecordBytes); why != "" {
				return recs, buf, corruptf(sp.seg.path, int64(p), "%s", why)
			}
			fl := int(le32(f))
			if FrameBytes(fl-8) != int64(len(f)) {
				return recs, buf, corruptf(sp.seg.path, int64(p), "frame length %d does not match the index", fl)
			}
			recs = append(recs, Record{Timestamp: int64(le64(f[8:])), Body: f[FrameHeaderBytes : 8+fl : 8+fl]})
		}
		at += sp.stop - base
	}
	return recs, buf, nil
}

// readErr translates a read error of segment s.
func (l *Log) readErr(s *segment, off int64, err error) error {
	switch {
	case s.removed.Load():
		return fmt.Errorf("%w: segment %d was deleted", storage.ErrOffsetOutOfRange, s.base)
	case l.closed.Load():
		return storage.ErrClosed
	case errors.Is(err, io.EOF):
		return corruptf(s.path, off, "file shorter than its index")
	}
	return fmt.Errorf("wlog: read %s at %d: %w", s.path, off, err)
}

// Read returns the timestamps and bodies of up to max durable records starting at index, at most
// maxBytes of bodies (but at least one record; maxBytes <= 0 means no byte limit). Bodies share
// one new buffer the caller owns. Reading below FirstIndex or above NextIndex returns an error
// wrapping storage.ErrOffsetOutOfRange; at NextIndex it returns nothing. Every frame's checksum is
// verified: damage returns an error wrapping storage.ErrCorrupt with the file and offset.
func (l *Log) Read(index int64, max int, maxBytes int) ([]Record, error) {
	if l.closed.Load() {
		return nil, storage.ErrClosed
	}
	if max <= 0 {
		return nil, fmt.Errorf("%w: wlog: Read max must be positive, got %d", storage.ErrInvalidArgument, max)
	}
	recs, _, err := l.readInto(index, max, maxBytes, nil, nil)
	if err != nil {
		return nil, err
	}
	return recs, nil
}

// scanBatchBytes is the read size of Scan.
const scanBatchBytes = 1 << 20

// Scan calls fn for every record durable when Scan starts, from index on, in order, until fn
// returns false or an error (which Scan returns as is). rec.Body is only valid during the call:
// Scan reuses its buffer, so copy what you keep. Used for replay and bulk reads.
func (l *Log) Scan(index int64, fn func(index int64, rec Record) (bool, error)) error {
	if l.closed.Load() {
		return storage.ErrClosed
	}
	end := l.NextIndex()
	if first := l.FirstIndex(); index < first || index > end {
		return fmt.Errorf("%w: index %d outside [%d, %d]", storage.ErrOffsetOutOfRange, index, first, end)
	}
	var recs []Record
	var buf []byte
	for index < end {
		var err error
		recs, buf, err = l.readInto(index, int(min(end-index, 4096)), scanBatchBytes, recs[:0], buf)
		if err != nil {
			return err
		}
		for _, r := range recs {
			ok, err := fn(index, r)
			if err != nil || !ok {
				return err
			}
			index++
		}
		clear(recs) // drop references to buf for the next round
	}
	return nil
}

// Verify reads every durable record and checks its checksum: a full check of the log, sealed
// segments included, which Open does not do. It returns the first error (storage.ErrCorrupt with
// file and offset for damage).
func (l *Log) Verify() error {
	return l.Scan(l.FirstIndex(), func(int64, Record) (bool, error) { return true, nil })
}

// SearchTime returns the index of the first durable record whose timestamp is >= ts, assuming
// timestamps are non-decreasing; NextIndex if there is none. It binary-searches the segments by
// their time range, then the records of one segment, reading one timestamp per probe.
func (l *Log) SearchTime(ts int64) (int64, error) {
	for attempt := 0; ; attempt++ {
		idx, err := l.searchTime(ts)
		if err != nil && errors.Is(err, storage.ErrOffsetOutOfRange) && attempt < 3 {
			continue // a segment was deleted under us: search again
		}
		return idx, err
	}
}

func (l *Log) searchTime(ts int64) (int64, error) {
	if l.closed.Load() {
		return 0, storage.ErrClosed
	}
	l.mu.RLock()
	next := l.durable.Load()
	segs := l.segs
	// Only the last segment can be empty; it sorts after every other.
	i := sort.Search(len(segs), func(i int) bool {
		s := segs[i]
		return s.maxTime >= ts || len(s.pos) == 0 && i == len(segs)-1
	})
	if i == len(segs) || len(segs[i].pos) == 0 {
		l.mu.RUnlock()
		return next, nil
	}
	s := segs[i]
	pos, minTime := s.pos, s.minTime
	l.mu.RUnlock()
	if minTime >= ts {
		return s.base, nil
	}
	// Invariant: the record at lo-1 is < ts, the one at hi is >= ts.
	lo, hi := 1, len(pos)-1
	if lo >= hi {
		return s.base + int64(lo), nil
	}
	f, err := s.h.acquire()
	if err != nil {
		return 0, l.readErr(s, 0, err)
	}
	defer s.h.release()
	var b [8]byte
	for lo < hi {
		m := int(uint(lo+hi) / 2)
		if _, err := f.ReadAt(b[:], int64(pos[m])+8); err != nil {
			return 0, l.readErr(s, int64(pos[m]), err)
		}
		if int64(le64(b[:])) >= ts {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return s.base + int64(lo), nil
}

// Segments describes the segments, oldest first.
func (l *Log) Segments() []SegmentInfo {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]SegmentInfo, len(l.segs))
	for i, s := range l.segs {
		out[i] = SegmentInfo{Path: s.path, BaseIndex: s.base, Count: int64(len(s.pos)), Bytes: s.end,
			MinTime: s.minTime, MaxTime: s.maxTime, Sealed: s.sealed, Created: s.created}
	}
	return out
}

// DeleteBefore deletes whole sealed segments whose every record has an index < index (index is
// capped at NextIndex), oldest first, and returns how many records and bytes (SegmentInfo.Bytes)
// it removed. FirstIndex moves to the base of the first kept segment. Readers of a deleted
// segment get storage.ErrOffsetOutOfRange.
func (l *Log) DeleteBefore(index int64) (records int64, bytes int64, err error) {
	l.maintMu.Lock()
	defer l.maintMu.Unlock()
	if l.closed.Load() {
		return 0, 0, storage.ErrClosed
	}
	l.mu.Lock()
	index = min(index, l.durable.Load())
	k := 0
	for k < len(l.segs)-1 && l.segs[k].sealed && l.segs[k+1].base <= index {
		k++
	}
	drop := l.segs[:k]
	if k > 0 {
		l.segs = slices.Clone(l.segs[k:]) // readers may hold the old slice
		l.first.Store(l.segs[0].base)
	}
	for _, s := range drop {
		records += int64(len(s.pos))
		bytes += s.end
		s.removed.Store(true)
	}
	l.mu.Unlock()
	if k == 0 {
		return 0, 0, nil
	}
	// A segment is freed in steps (RemoveFile), which a crash can interrupt: it is renamed to a
	// temporary name first, durably, so that Open never finds a shortened segment under its name
	// (it removes leftover temporary files).
	doomed := make([]string, 0, len(drop))
	for _, s := range drop {
		_ = s.h.retire() // a reader's pin keeps it open until the read ends (readErr)
		idx := l.idxPath(s.base)
		if rerr := l.fs.Remove(idx); rerr != nil && !isNotExist(rerr) && err == nil {
			err = fmt.Errorf("wlog: delete %s: %w", idx, rerr)
		}
		tmp := s.path + tmpExt
		if rerr := l.fs.Rename(s.path, tmp); rerr != nil {
			if rerr := l.fs.Remove(s.path); rerr != nil && !isNotExist(rerr) && err == nil {
				err = fmt.Errorf("wlog: delete %s: %w", s.path, rerr)
			}
			continue
		}
		doomed = append(doomed, tmp)
	}
	serr := l.fs.SyncDir(l.dir)
	remove := l.fs.Remove // the rename may not be durable: no shortened file under the old name
	if serr == nil {
		remove = func(p string) error { return RemoveFile(l.fs, p) }
	}
	for _, p := range doomed {
		if rerr := remove(p); rerr != nil && !isNotExist(rerr) && err == nil {
			err = fmt.Errorf("wlog: delete %s: %w", p, rerr)
		}
	}
	if serr == nil {
		serr = l.fs.SyncDir(l.dir)
	}
	if serr != nil && err == nil {
		err = fmt.Errorf("wlog: sync dir %s: %w", l.dir, serr)
	}
	l.log.Debug("wal segments deleted", slog.Int("segments", k), slog.Int64("records", records))
	return records, bytes, err
}

// Cut seals the active segment (if it holds records) and starts a new one: used to make an old,
// quiet active segment deletable by retention and for the state log's compaction. It waits for a
// sync in progress on this log.
func (l *Log) Cut() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed.Load() {
		return storage.ErrClosed
	}
	if l.werr != nil {
		return fmt.Errorf("%w: %w", ErrFailed, l.werr)
	}
	if len(l.active().wpos) == 0 {
		return nil
	}
	if err := l.rollLocked(); err != nil {
		if errors.Is(err, ErrNoSegment) {
			return err // nothing changed: the log goes on in its active segment
		}
		return l.setErrLocked(err)
	}
	l.active().h.release() // rollLocked's pin
	return nil
}

// active returns the active segment. Log.wmu must be held (the writer is the only one who
// changes which segment is active).
func (l *Log) active() *segment {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.segs[len(l.segs)-1]
}

// rollLocked seals the active segment, whose records must all be written, and makes a new one
// active, based at l.next. The new segment's file is pinned once for the caller, who releases
// it. Log.wmu must be held.
func (l *Log) rollLocked() error {
	old := l.active()
	// The new segment first: if it cannot be made (no space, no file handle), nothing changed and
	// the log goes on in old (ErrNoSegment).
	ns, err := l.nextSegmentLocked(l.next, l.nextSegmentBytes(old.wend))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoSegment, err)
	}
	// The data before the index: an index must never name records that could still be lost.
	if err := old.datasync(); err != nil {
		ns.h.release()
		_ = ns.h.retire()
		return fmt.Errorf("wlog: sync %s: %w", old.path, err)
	}
	if err := l.writeIndex(old.sidecar()); err != nil {
		// Only a cache of the segment: Open rebuilds it.
		l.log.Warn("wal index not written", slog.String("path", old.path), slog.Any("err", err))
	}
	l.staleIdx, l.idxValid = false, false
	ns.publishLocked()
	l.mu.Lock()
	old.sealed = true
	l.segs = append(l.segs, ns)
	l.mu.Unlock()
	old.h.setFlag(os.O_RDONLY) // never written again
	if l.pinned != nil {
		_, _ = ns.h.acquire() // cannot fail: the caller's pin keeps it open
		l.pinned.h.release()
		l.pinned = ns
	}
	l.log.Debug("wal segment cut", slog.String("sealed", old.path), slog.Int64("base", ns.base))
	return nil
}

// nextSegmentBytes is the size of the segment that follows one that used used bytes: the smallest
// FirstSegmentBytes x 4^k of at least twice that, at most SegmentBytes. A segment cut because it
// was full (used is over half its size) is followed by one four times as large; one cut early
// (Cut) by one at most as large as it was.
func (l *Log) nextSegmentBytes(used int64) int64 {
	n := l.opts.FirstSegmentBytes
	for n < 2*used && n < l.opts.SegmentBytes {
		n *= 4
	}
	return min(n, l.opts.SegmentBytes)
}

// Close closes the log's files; it is safe to call twice. Appends still queued in a committer fail
// with storage.ErrClosed. Unless a write failed, the active segment is synced and gets an index
// file, so the next Open does not scan it.
func (l *Log) Close() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.maintMu.Lock() // no DeleteBefore closes files under us
	defer l.maintMu.Unlock()
	if l.closed.Swap(true) {
		return nil
	}
	l.dropSpareLocked()
	l.bg.Wait()
	var err error
	if a := l.active(); l.werr == nil && !(l.staleIdx && l.idxValid) {
		if err = a.datasync(); err != nil {
			err = fmt.Errorf("wlog: sync %s: %w", a.path, err)
		} else if ierr := l.writeIndex(a.sidecar()); ierr != nil {
			l.log.Warn("wal index not written", slog.String("path", a.path), slog.Any("err", ierr))
		}
	}
	if l.pinned != nil {
		l.pinned.h.release()
		l.pinned = nil
	}
	l.mu.Lock()
	segs := l.segs
	l.mu.Unlock()
	for _, s := range segs {
		if cerr := s.h.retire(); cerr != nil && err == nil {
			err = fmt.Errorf("wlog: close %s: %w", s.path, cerr)
		}
	}
	return err
}

// Remove deletes the log's directory and everything in it (topic deletion). The log must be
// closed. A missing directory is not an error.
func Remove(dir string, opts Options) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	entries, err := o.FS.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wlog: read dir %s: %w", dir, err)
	}
	for _, e := range entries {
		if err := o.FS.Remove(filepath.Join(dir, e.Name())); err != nil && !isNotExist(err) {
			return fmt.Errorf("wlog: remove %s: %w", e.Name(), err)
		}
	}
	if err := o.FS.Remove(dir); err != nil && !isNotExist(err) {
		return fmt.Errorf("wlog: remove %s: %w", dir, err)
	}
	if err := o.FS.SyncDir(filepath.Dir(dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wlog: sync dir %s: %w", filepath.Dir(dir), err)
	}
	return nil
}

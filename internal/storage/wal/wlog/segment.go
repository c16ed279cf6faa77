package wlog

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// segment is one segment file and its in-memory index.
//
// The index is pos: the offset of every frame, 4 bytes per record. The writer (holding Log.wmu)
// appends to wpos and advances wend; once the records are durable the committer publishes them
// (under Log.mu) by copying the slice header into pos. Readers only ever look at pos, end,
// minTime and maxTime under Log.mu, and at elements of pos below its length, which the writer
// never changes again, so they share the backing array without a lock.
type segment struct {
	base    int64
	path    string
	h       *handle // the file: pin it (acquire/release) around every use, see Files
	created int64   // unix ns, from the header

	// Guarded by Log.mu.
	pos     []uint32 // frame offsets of the durable records
	end     int64    // end of the last durable frame (padding included)
	minTime int64    // smallest durable timestamp (0 if empty)
	maxTime int64    // largest durable timestamp (0 if empty)
	sealed  bool     // a newer segment exists

	// Writer state, guarded by Log.wmu.
	size   int64    // file size: preallocated bytes
	wpos   []uint32 // frame offsets of the written records; pos is a prefix of it
	wend   int64    // where the next frame goes
	zeroed int64    // bytes [0, zeroed) were written (data or zeros); see zeroAhead
	// durable: bytes [0, durable) were written and an fdatasync of this file made their blocks'
	// metadata durable after that (durable <= zeroed). A round that writes only there changes no
	// metadata: it may share another log's cache flush (Committer.shareFlush). 0 for a segment
	// recovered by Open until its first sync.
	durable    int64
	wmin, wmax int64 // timestamps of the written records

	// removed is set by DeleteBefore before it retires the file, so that a reader that fails on
	// the retired or removed file reports ErrOffsetOutOfRange rather than an I/O error.
	removed atomic.Bool
}

// file returns the segment's file; the caller must hold a pin of s.h.
func (s *segment) file() File { return s.h.file() }

// readAt reads len(b) bytes at off, pinning the file for the read.
func (s *segment) readAt(b []byte, off int64) error {
	f, err := s.h.acquire()
	if err != nil {
		return err
	}
	_, err = f.ReadAt(b, off)
	s.h.release()
	return err
}

// datasync makes the segment's written data durable (fdatasync), pinning the file for it.
func (s *segment) datasync() error {
	f, err := s.h.acquire()
	if err != nil {
		return err
	}
	err = f.Datasync()
	s.h.release()
	return err
}

// publishLocked makes the written records of s visible. Log.mu and Log.wmu must be held.
func (s *segment) publishLocked() {
	s.pos = s.wpos
	s.end = s.wend
	s.minTime, s.maxTime = s.wmin, s.wmax
}

// noteWrite records a written frame in the writer state.
func (s *segment) noteWrite(off int64, ts int64, n int64) {
	if len(s.wpos) == 0 {
		s.wmin, s.wmax = ts, ts
	} else {
		s.wmin, s.wmax = min(s.wmin, ts), max(s.wmax, ts)
	}
	s.wpos = append(s.wpos, uint32(off))
	s.wend = off + n
}

// sidecar returns the sidecar index of the written records. Log.wmu must be held.
func (s *segment) sidecar() sidecar {
	return sidecar{base: s.base, pos: s.wpos, minTime: s.wmin, maxTime: s.wmax, end: s.wend}
}

func (l *Log) segPath(base int64) string { return filepath.Join(l.dir, segmentName(base)) }
func (l *Log) idxPath(base int64) string { return filepath.Join(l.dir, indexName(base)) }

// zeros is a read-only source of zero bytes for zero-filling and clearing.
var zeros [1 << 20]byte

// writeZeros writes zeros over [off, end) of f in chunks of up to 1 MiB.
func writeZeros(f File, off, end int64) error {
	for off < end {
		n := min(end-off, int64(len(zeros)))
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// deleteChunk is how much of a file each step of RemoveFile frees, and maxPause the longest
// pause after a step of RemoveFile or zeroSpare.
const (
	deleteChunk = 4 << 20
	maxPause    = 10 * time.Millisecond
)

// RemoveFile removes the file at path (with fsys), first truncating it away deleteChunk (4 MiB) at
// a time from its end, each step followed by a pause as long as the step took (at most maxPause).
// On a file system mounted with online discard, freeing a 64 MiB segment at once sends the disk
// one large discard, and the committer's fdatasyncs waited 8-15 ms behind it on the development
// VM (ext4, virtio); freed in steps, they stayed under ~2-4 ms. Where freeing blocks is cheap, so are the
// steps and their pauses. The truncation is best effort: if it fails, the file is removed anyway.
// A crash can leave the file shortened: the caller must make sure that nothing reads it as a
// segment then (DeleteBefore renames it to a temporary name first).
func RemoveFile(fsys FS, path string) error {
	if f, err := fsys.OpenFile(path, os.O_WRONLY, 0); err == nil {
		if st, err := f.Stat(); err == nil {
			for size := st.Size(); size > deleteChunk; {
				size -= deleteChunk
				t := time.Now()
				if f.Truncate(size) != nil {
					break
				}
				time.Sleep(min(time.Since(t), maxPause))
			}
		}
		_ = f.Close()
	}
	return fsys.Remove(path)
}

// prepareFile creates (or replaces) the file at path with size bytes preallocated (fallocate: the
// blocks are reserved and read as zeros, but not written: see zeroSpare and zeroAhead) and makes
// it durable. The caller renames it into place.
// The file takes a slot of the log's Files (reserve), which the caller gives back (unreserve)
// when it closes the file, or to the segment's handle (installSegment). Lacking a descriptor, it
// closes idle files of the pool and tries again (Files.openFile).
func (l *Log) prepareFile(path string, size int64) (File, error) {
	l.files.reserve()
	f, err := l.files.openFile(l.fs, path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644, nil)
	if err != nil {
		l.files.unreserve()
		return nil, fmt.Errorf("wlog: create %s: %w", path, err)
	}
	fail := func(op string, err error) (File, error) {
		_ = f.Close()
		l.files.unreserve()
		_ = l.fs.Remove(path)
		return nil, fmt.Errorf("wlog: %s %s: %w", op, path, err)
	}
	if err := f.Allocate(0, size); err != nil {
		return fail("preallocate", err)
	}
	if err := f.Datasync(); err != nil {
		return fail("sync", err)
	}
	return f, nil
}

// installSegment writes the header of a new segment into the prepared file f (at tmpPath), makes
// it durable and renames it to its final name: temp, write, fsync, rename, fsync dir. f holds a
// slot of l.files (reserve), which goes to the segment's handle, pinned once for the caller.
func (l *Log) installSegment(f File, tmpPath string, base int64) (*segment, error) {
	path := l.segPath(base)
	fail := func(op string, err error) (*segment, error) {
		_ = f.Close()
		l.files.unreserve()
		_ = l.fs.Remove(tmpPath)
		return nil, fmt.Errorf("wlog: %s %s: %w", op, path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return fail("stat", err)
	}
	h := segmentHeader{base: base, created: l.clock.Now().UnixNano()}
	if _, err := f.WriteAt(appendHeader(nil, h), 0); err != nil {
		return fail("write header", err)
	}
	if err := f.Datasync(); err != nil {
		return fail("sync", err)
	}
	if err := l.fs.Rename(tmpPath, path); err != nil {
		return fail("rename", err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		_ = f.Close()
		l.files.unreserve()
		return nil, fmt.Errorf("wlog: sync dir %s: %w", l.dir, err)
	}
	return &segment{
		base: base, path: path, h: l.files.adopt(l.fs, path, os.O_RDWR, f), created: h.created, size: st.Size(),
		end: SegmentHeaderBytes, wend: SegmentHeaderBytes, zeroed: SegmentHeaderBytes, durable: SegmentHeaderBytes,
	}, nil
}

// createSegment creates a new, empty segment of size bytes synchronously (when no spare was
// prepared). Its file is pinned once for the caller.
func (l *Log) createSegment(base, size int64) (*segment, error) {
	tmp := l.segPath(base) + tmpExt
	f, err := l.prepareFile(tmp, size)
	if err != nil {
		return nil, err
	}
	return l.installSegment(f, tmp, base)
}

// spare is a segment file prepared ahead by a background goroutine, like etcd's file pipeline:
// preallocated and made durable before it is needed, so that the round that cuts does not wait for
// the allocation and its journal commit. The goroutine then zero-fills it at a measured pace
// (zeroSpare), so that the rounds that write into it need not (see zeroAhead), until it is done or
// told to stop.
type spare struct {
	path    string
	started time.Time     // Log.clock: when its preparation started (spareRetry)
	done    chan struct{} // closed when the goroutine ended: f or err is set, zeroed is final
	stop    chan struct{} // closed (once, under Log.wmu) before the spare is installed or dropped
	f       File
	err     error
	zeroed  int64 // bytes [0, zeroed) were written with zeros; written by the goroutine until done
}

// spareRetry is the shortest time between the starts of two preparations of a log's spare when
// the first failed (no descriptor, no space): a later round prepares it again, at most once per
// spareRetry, so that the next roll finds one (and needs no new descriptor or space of its own)
// whenever the failure was passing.
const spareRetry = time.Second

// spareChunk is how much of a spare each step of zeroSpare writes, and zeroTurn lets one spare at
// a time write, across all the logs of the process.
const spareChunk = 256 << 10

var zeroTurn = make(chan struct{}, 1)

// zeroSpare writes zeros over sp's file spareChunk at a time, each chunk written back to the disk
// (SyncRange: no cache flush) before the next, followed by a pause as long as the chunk took (at
// most maxPause), and one spare at a time in the process: a background write rate the disk
// carries next to the committer's syncs. Writing 64 MiB at once and syncing it made the
// committer's syncs take 22-29 ms for ~100 ms at every roll; zeroing in the rounds instead (one
// round per MiB carries the zeros) made those rounds take ~850 us instead of ~185. It stops at
// sp.stop, between chunks (the committer's zeroAhead covers what is left: zeroing is an
// optimization, fallocated blocks read as zeros). A spare zeroed whole is fdatasynced once, so
// that the first round into it does not carry the extent changes. It never waits for its turn or
// its pause once stopped: the round that cuts waits for at most the chunk in progress. It returns
// the error of a write or a sync: the file is then not used (after a failed writeback its page
// cache cannot be trusted).
func zeroSpare(sp *spare, size int64) error {
	for sp.zeroed < size {
		n := min(spareChunk, size-sp.zeroed)
		select {
		case zeroTurn <- struct{}{}:
		case <-sp.stop:
			return nil
		}
		t := time.Now()
		_, err := sp.f.WriteAt(zeros[:n], sp.zeroed)
		if err == nil {
			err = sp.f.SyncRange(sp.zeroed, n)
		}
		took := time.Since(t)
		<-zeroTurn
		if err != nil {
			return err
		}
		sp.zeroed += n
		pause := time.NewTimer(min(took, maxPause))
		select {
		case <-pause.C:
		case <-sp.stop:
			pause.Stop()
			return nil
		}
	}
	return sp.f.Datasync()
}

func (l *Log) sparePath() string { return filepath.Join(l.dir, "spare"+segmentExt+tmpExt) }

// startSpareLocked starts preparing the next segment if it is not already being prepared, or
// prepared, or failed less than spareRetry ago. Log.wmu must be held.
func (l *Log) startSpareLocked() {
	if l.closed.Load() {
		return
	}
	if sp := l.spare; sp != nil {
		select {
		case <-sp.done:
		default:
			return // being prepared
		}
		if sp.err == nil || l.clock.Now().Sub(sp.started) < spareRetry {
			return
		}
		// Failed: its file was removed. Without a new one the next roll would have to create
		// its segment then, which can fail the same way (ErrNoSegment).
		l.log.Warn("wal segment preparation failed; preparing it again", slog.Any("err", sp.err))
		l.spare = nil
	}
	sp := &spare{path: l.sparePath(), started: l.clock.Now(), done: make(chan struct{}), stop: make(chan struct{})}
	l.spare = sp
	size := l.nextSegmentBytes(l.active().size) // the active segment is over half full
	l.bg.Go(func() {
		defer close(sp.done)
		start := time.Now()
		sp.f, sp.err = l.prepareFile(sp.path, size)
		if sp.err != nil {
			return
		}
		if err := zeroSpare(sp, size); err != nil {
			_ = sp.f.Close()
			l.files.unreserve()
			_ = l.fs.Remove(sp.path)
			sp.f, sp.err = nil, fmt.Errorf("wlog: zero-fill %s: %w", sp.path, err)
			return
		}
		if sp.zeroed == size && !l.opts.KeepSpare {
			// Ready and durable: its file is closed until the roll that installs it (an idle
			// log's spare holds no file descriptor). A log that keeps a spare against a full
			// disk keeps its file too: its roll must not need a descriptor either.
			sp.err = sp.f.Close()
			l.files.unreserve()
			sp.f = nil
			if sp.err != nil {
				_ = l.fs.Remove(sp.path)
				sp.err = fmt.Errorf("wlog: close %s: %w", sp.path, sp.err)
				return
			}
		}
		l.log.Debug("wal segment prepared", slog.Duration("took", time.Since(start)), slog.Int64("zeroed", sp.zeroed))
	})
}

// nextSegmentLocked returns the new segment based at base: the spare if one was prepared (waiting
// for it if needed), else a synchronously created one of size bytes. Its file is pinned once for
// the caller. Log.wmu must be held.
func (l *Log) nextSegmentLocked(base, size int64) (*segment, error) {
	if sp := l.spare; sp != nil {
		l.spare = nil
		close(sp.stop) // the zeroer stops after its chunk: the records go there next
		<-sp.done
		if sp.err == nil && sp.f == nil {
			// Prepared whole, then closed: open it again (closing idle files if need be).
			l.files.reserve()
			if sp.f, sp.err = l.files.openFile(l.fs, sp.path, os.O_RDWR, 0, nil); sp.err != nil {
				l.files.unreserve()
				sp.f, sp.err = nil, fmt.Errorf("wlog: open %s: %w", sp.path, sp.err)
			}
		}
		if sp.err == nil {
			s, err := l.installSegment(sp.f, sp.path, base)
			if err == nil {
				// installSegment's fdatasync came after the zeroer stopped: its zeros are durable.
				s.zeroed = max(s.zeroed, sp.zeroed)
				s.durable = s.zeroed
			}
			return s, err
		}
		l.log.Warn("wal segment preparation failed; creating it now", slog.Any("err", sp.err))
	}
	return l.createSegment(base, size)
}

// dropSpareLocked stops the spare preparation, waits for it and removes the spare file. Log.wmu
// must be held.
func (l *Log) dropSpareLocked() {
	sp := l.spare
	if sp == nil {
		return
	}
	l.spare = nil
	close(sp.stop)
	<-sp.done
	if sp.f != nil {
		_ = sp.f.Close()
		l.files.unreserve()
	}
	if err := l.fs.Remove(sp.path); err != nil && !isNotExist(err) {
		l.log.Warn("wal spare segment not removed", slog.String("path", sp.path), slog.Any("err", err))
	}
}

// writeIndex writes the sidecar index of s: temp, write, rename. It is not fsynced: the index can
// be rebuilt from the segment, and Open checks it (checksum, count, last frame) before using it.
func (l *Log) writeIndex(sc sidecar) error {
	path := l.idxPath(sc.base)
	tmp := path + tmpExt
	f, err := l.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("wlog: create %s: %w", tmp, err)
	}
	_, err = f.WriteAt(encodeIndex(sc), 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = l.fs.Rename(tmp, path)
	}
	if err != nil {
		_ = l.fs.Remove(tmp)
		return fmt.Errorf("wlog: write index %s: %w", path, err)
	}
	return nil
}

// loadIndex reads and checks the sidecar index of s. It returns a reason when the index is missing
// or unusable; the caller then rebuilds it by scanning. expected is the record count the index
// must have, or -1 when unknown (last segment).
func (l *Log) loadIndex(s *segment, fileSize int64, expected int64) (sidecar, string) {
	path := l.idxPath(s.base)
	f, err := l.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		if isNotExist(err) {
			return sidecar{}, "missing"
		}
		return sidecar{}, err.Error()
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return sidecar{}, err.Error()
	}
	// A valid index is at most 4 bytes per possible frame: this bounds the allocation.
	if st.Size() > indexHeaderBytes+4+4*(fileSize/FrameHeaderBytes) {
		return sidecar{}, "index larger than its segment allows"
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return sidecar{}, err.Error()
	}
	sc, why := decodeIndex(b, fileSize)
	switch {
	case why != "":
		return sidecar{}, why
	case sc.base != s.base:
		return sidecar{}, "index base does not match the segment"
	case expected >= 0 && int64(len(sc.pos)) != expected:
		return sidecar{}, fmt.Sprintf("index has %d records, want %d", len(sc.pos), expected)
	}
	// Check the last frame against the segment: catches an index that belongs to other data.
	if n := len(sc.pos); n > 0 {
		last := int64(sc.pos[n-1])
		b := make([]byte, sc.end-last)
		if _, err := s.file().ReadAt(b, last); err != nil {
			return sidecar{}, fmt.Sprintf("read last frame: %v", err)
		}
		if why := frameCheck(b, l.opts.MaxRecordBytes); why != "" || FrameBytes(int(le32(b)-8)) != int64(len(b)) {
			return sidecar{}, "last frame does not match the index"
		}
	}
	return sc, ""
}

// applySidecar loads a checked sidecar into s.
func (s *segment) applySidecar(sc sidecar) {
	s.wpos, s.wend, s.wmin, s.wmax = sc.pos, sc.end, sc.minTime, sc.maxTime
	s.publishLocked()
}

package wlog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
)

// Recovery (Open). Sealed segments load their sidecar index; only when it is missing or unusable
// is the segment scanned, and then any damage is corruption. The last segment is scanned unless a
// clean Close left an index for it. The scan stops at the first frame that is not valid; what
// follows decides between a torn tail and corruption (doc.go, "Recovery").

// scanChunk is the read size of scans.
const scanChunk = 1 << 20

// Why a scan stopped. whyEOF and whyZero are clean ends if nothing but zeros follows.
const (
	whyEOF  = "end of file"
	whyZero = "zero length word"
)

// chunkReader reads a file sequentially in chunks, so that a scan costs one read per chunk, not
// one per frame.
type chunkReader struct {
	f    File
	size int64
	buf  []byte
	off  int64 // file offset of buf[0]
}

// at returns the bytes [off, off+n) of the file, which the caller knows to exist. The result is
// valid until the next call.
func (r *chunkReader) at(off int64, n int) ([]byte, error) {
	if off >= r.off && off+int64(n) <= r.off+int64(len(r.buf)) {
		return r.buf[off-r.off:][:n], nil
	}
	want := min(int64(max(n, scanChunk)), r.size-off)
	if int64(cap(r.buf)) < want {
		r.buf = make([]byte, want)
	}
	r.buf = r.buf[:want]
	r.off = off
	k, err := r.f.ReadAt(r.buf, off)
	if int64(k) < want {
		r.buf = r.buf[:0]
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("wlog: read %s at %d: %w", r.f.Name(), off, err)
	}
	return r.buf[:n], nil
}

func allZero(b []byte) bool {
	for len(b) > len(zeros) {
		if !bytes.Equal(b[:len(zeros)], zeros[:]) {
			return false
		}
		b = b[len(zeros):]
	}
	return bytes.Equal(b, zeros[:len(b)])
}

// scanFrames reads the frames of s from the first one, filling its writer state, until it has
// limit records (limit >= 0), or meets something that is not a valid frame. It returns why it
// stopped ("" when it reached limit); s.wend is then where it stopped.
func (l *Log) scanFrames(s *segment, r *chunkReader, limit int64) (string, error) {
	off := int64(SegmentHeaderBytes)
	s.wpos, s.wend = nil, off
	maxLen := l.opts.MaxRecordBytes
	for limit < 0 || int64(len(s.wpos)) < limit {
		rem := r.size - off
		if rem <= 0 {
			return whyEOF, nil
		}
		if rem < FrameHeaderBytes {
			b, err := r.at(off, int(rem))
			if err != nil {
				return "", err
			}
			if allZero(b) {
				return whyEOF, nil
			}
			return "short frame header", nil
		}
		h, err := r.at(off, FrameHeaderBytes)
		if err != nil {
			return "", err
		}
		n := int64(le32(h))
		switch {
		case n == 0:
			return whyZero, nil
		case n < 8 || n > int64(maxLen)+8:
			return fmt.Sprintf("invalid frame length %d", n), nil
		case 8+n > rem:
			return "frame extends past end of file", nil
		}
		b, err := r.at(off, int(8+n))
		if err != nil {
			return "", err
		}
		if why := frameCheck(b, maxLen); why != "" {
			return why, nil
		}
		s.noteWrite(off, int64(le64(b[8:])), FrameBytes(int(n-8)))
		off = s.wend
	}
	return "", nil
}

// errUndecidable reports that the damage after a bad frame is too large to search for valid
// frames within the work budget.
var errUndecidable = errors.New("too much damage to tell a torn tail from corruption")

// checkTail examines the last segment from off, where its valid frames end, to the end of the
// file. It returns the end of the last 8-byte word that is not zero (off if all are zero) and the
// offset of the first valid frame after off (-1 if none), stepping 8 bytes at a time.
func (l *Log) checkTail(r *chunkReader, off int64) (dirtyEnd, validAt int64, err error) {
	dirtyEnd, validAt = off, -1
	maxLen := int64(l.opts.MaxRecordBytes)
	budget := 4*r.size + 64<<20 // bytes of candidate frames to checksum at most
	var cand []byte
	for start := off; start < r.size; {
		n := int(min(scanChunk, r.size-start))
		b, err := r.at(start, n)
		if err != nil {
			return 0, -1, err
		}
		if allZero(b) {
			start += int64(n)
			continue
		}
		// Candidates are read into cand, so b (the reader's buffer) stays valid for this chunk.
		for i := 0; i < n; i += FrameAlign {
			w := b[i:min(i+FrameAlign, n)]
			if allZero(w) {
				continue
			}
			q := start + int64(i)
			dirtyEnd = q + int64(len(w))
			if q == off || len(w) < 4 {
				continue
			}
			fl := int64(le32(w))
			if fl < 8 || fl > maxLen+8 || q+8+fl > r.size {
				continue
			}
			if budget -= 8 + fl; budget < 0 {
				return dirtyEnd, -1, errUndecidable
			}
			cand = slices.Grow(cand[:0], int(8+fl))[:8+fl]
			if _, err := r.f.ReadAt(cand, q); err != nil {
				return 0, -1, fmt.Errorf("wlog: read %s at %d: %w", r.f.Name(), q, err)
			}
			if frameCheck(cand, int(maxLen)) == "" {
				return dirtyEnd, q, nil
			}
		}
		start += int64(n)
	}
	return dirtyEnd, -1, nil
}

// readHeader reads and checks the header of s. torn reports a header that was never completely
// written (the file is shorter than a header, or the header is all zeros).
func (l *Log) readHeader(s *segment, size int64) (torn bool, err error) {
	if size < SegmentHeaderBytes {
		return true, nil
	}
	hb := make([]byte, SegmentHeaderBytes)
	if _, err := s.file().ReadAt(hb, 0); err != nil {
		return false, fmt.Errorf("wlog: read header of %s: %w", s.path, err)
	}
	if allZero(hb) {
		return true, nil
	}
	h, why := parseHeader(hb)
	if why != "" {
		return false, corruptf(s.path, 0, "%s", why)
	}
	if h.base != s.base {
		return false, corruptf(s.path, 8, "segment header base index %d does not match the file name", h.base)
	}
	s.created = h.created
	return false, nil
}

// openSealed opens a segment that has a newer one after it; it must hold exactly expected
// records. Any damage is corruption.
// Its file is idle when it returns (Files).
func (l *Log) openSealed(base, expected int64) (*segment, error) {
	s := &segment{base: base, path: l.segPath(base), sealed: true}
	s.h = l.files.newHandle(l.fs, s.path, os.O_RDONLY)
	if _, err := s.h.acquire(); err != nil {
		return nil, err
	}
	_, err := l.loadSealed(s, expected)
	s.h.release()
	if err != nil {
		_ = s.h.retire()
		return nil, err
	}
	return s, nil
}

func (l *Log) loadSealed(s *segment, expected int64) (*segment, error) {
	st, err := s.file().Stat()
	if err != nil {
		return nil, fmt.Errorf("wlog: stat %s: %w", s.path, err)
	}
	s.size = st.Size()
	torn, err := l.readHeader(s, s.size)
	if err != nil {
		return nil, err
	}
	if torn {
		return nil, corruptf(s.path, 0, "sealed segment has no header (file size %d)", s.size)
	}
	sc, why := l.loadIndex(s, s.size, expected)
	if why == "" {
		s.applySidecar(sc)
		return s, nil
	}
	l.log.Info("wal index rebuilt", slog.String("path", s.path), slog.String("reason", why))
	r := &chunkReader{f: s.file(), size: s.size}
	why, err = l.scanFrames(s, r, expected)
	if err != nil {
		return nil, err
	}
	if n := int64(len(s.wpos)); n != expected {
		return nil, corruptf(s.path, s.wend, "%s after %d records of a sealed segment that must hold %d (the next segment starts at %d)",
			why, n, expected, s.base+expected)
	}
	if s.wend > s.size {
		return nil, corruptf(s.path, s.size, "sealed segment truncated inside its last frame")
	}
	s.publishLocked()
	if err := l.writeIndex(s.sidecar()); err != nil {
		l.log.Warn("wal index not written", slog.String("path", s.path), slog.Any("err", err))
	}
	return s, nil
}

// openLast opens the newest segment, recovering a torn tail.
// Its file is idle when it returns (Files).
func (l *Log) openLast(base int64, hasIdx bool) (*segment, error) {
	s := &segment{base: base, path: l.segPath(base)}
	s.h = l.files.newHandle(l.fs, s.path, os.O_RDWR)
	if _, err := s.h.acquire(); err != nil {
		return nil, err
	}
	err := l.loadLast(s, hasIdx)
	s.h.release()
	if err != nil {
		_ = s.h.retire()
		return nil, err
	}
	return s, nil
}

func (l *Log) loadLast(s *segment, hasIdx bool) error {
	st, err := s.file().Stat()
	if err != nil {
		return fmt.Errorf("wlog: stat %s: %w", s.path, err)
	}
	size := st.Size()
	tornHeader, err := l.readHeader(s, size)
	if err != nil {
		return err
	}
	// Any index of the last segment is removed durably before the next write into it (a clean
	// Close writes one; it stops being true with the first append).
	l.staleIdx = hasIdx
	if hasIdx && !tornHeader {
		sc, why := l.loadIndex(s, size, -1)
		if why == "" && sc.end+8 <= size {
			// Nothing may follow the indexed records: an append after the index was written means
			// the index is stale.
			w := make([]byte, 8)
			if _, err := s.file().ReadAt(w, sc.end); err != nil || !allZero(w) {
				why = "records follow the indexed ones"
			}
		}
		if why == "" {
			s.size = size
			s.applySidecar(sc)
			s.zeroed = s.wend
			l.idxValid = true
			return nil
		}
		l.log.Info("wal index of last segment unusable; scanning", slog.String("path", s.path), slog.String("reason", why))
	}

	r := &chunkReader{f: s.file(), size: size}
	why := whyEOF
	s.wend = SegmentHeaderBytes
	if !tornHeader {
		if why, err = l.scanFrames(s, r, -1); err != nil {
			return err
		}
	}
	stop := s.wend
	if tornHeader {
		stop = 0 // nothing of the header is trusted
	}
	dirtyEnd, validAt, err := l.checkTail(r, stop)
	switch {
	case errors.Is(err, errUndecidable):
		return corruptf(s.path, stop, "%s; %v", why, err)
	case err != nil:
		return err
	case validAt >= 0 && tornHeader:
		return corruptf(s.path, 0, "segment header missing but a valid frame follows at offset %d", validAt)
	case validAt >= 0:
		return corruptf(s.path, stop, "%s, followed by a valid frame at offset %d", why, validAt)
	}
	changed := false
	if dirtyEnd > stop {
		l.log.Warn("wal torn tail truncated", slog.String("path", s.path), slog.Int64("offset", stop),
			slog.String("reason", why), slog.Int("records", len(s.wpos)), slog.Int64("cleared_bytes", dirtyEnd-stop))
		if err := writeZeros(s.file(), stop, dirtyEnd); err != nil {
			return fmt.Errorf("wlog: clear torn tail of %s: %w", s.path, err)
		}
		changed = true
	}
	if tornHeader {
		l.log.Warn("wal segment header torn; rewritten", slog.String("path", s.path), slog.Int64("file_size", size))
		s.created = l.clock.Now().UnixNano()
		if _, err := s.file().WriteAt(appendHeader(nil, segmentHeader{base: s.base, created: s.created}), 0); err != nil {
			return fmt.Errorf("wlog: rewrite header of %s: %w", s.path, err)
		}
		size = max(size, SegmentHeaderBytes)
		changed = true
	}
	// A segment's size is its own (segments grow from FirstSegmentBytes; SegmentBytes may have
	// changed since) and the next roll happens when it is full; only a file shorter than any
	// segment is made (damage, or a file system that lost the preallocation) is extended.
	if target := max(l.opts.FirstSegmentBytes, s.wend); size < target {
		if !tornHeader && dirtyEnd == stop {
			l.log.Warn("wal segment shorter than preallocated; extended", slog.String("path", s.path),
				slog.Int64("file_size", size), slog.Int64("size", target))
		}
		if err := s.file().Allocate(size, target-size); err != nil {
			return fmt.Errorf("wlog: preallocate %s: %w", s.path, err)
		}
		size = target
		changed = true
	}
	if changed {
		if err := s.file().Datasync(); err != nil {
			return fmt.Errorf("wlog: sync %s: %w", s.path, err)
		}
	}
	s.size = size
	s.zeroed = s.wend // what follows may be unwritten (fallocated) blocks
	s.publishLocked()
	return nil
}

// listDir reads the log directory: segment bases in order, which of them have an index file.
// Leftover temp files are removed, and index files without a segment.
func (l *Log) listDir() ([]int64, map[int64]bool, error) {
	entries, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("wlog: read dir %s: %w", l.dir, err)
	}
	var bases []int64
	idx := make(map[int64]bool)
	var drop []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() {
			continue
		}
		if strings.HasSuffix(name, tmpExt) {
			drop = append(drop, name)
		} else if b, ok := parseBase(name, segmentExt); ok {
			bases = append(bases, b)
		} else if b, ok := parseBase(name, indexExt); ok {
			idx[b] = true
		}
	}
	slices.Sort(bases)
	for b := range idx {
		if _, found := slices.BinarySearch(bases, b); !found {
			drop = append(drop, indexName(b))
			delete(idx, b)
		}
	}
	for _, name := range drop {
		if err := l.fs.Remove(l.dir + string(os.PathSeparator) + name); err != nil && !isNotExist(err) {
			return nil, nil, fmt.Errorf("wlog: remove leftover %s: %w", name, err)
		}
		l.log.Debug("wal leftover removed", slog.String("file", name))
	}
	return bases, idx, nil
}

package wlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// Offline repair of a damaged log (spool data verify and truncate, with the broker stopped).

// Damage is the first damage of a log and what cutting the log there gives up.
type Damage struct {
	// Err is the damage as Open or Verify reported it (a *CorruptError).
	Err *CorruptError
	// Index is the index of the first record given up: the cut log keeps [FirstIndex, Index).
	Index int64
	// End is the index after the last record of the damaged log, so End-Index records are given
	// up; -1 when the damage hides it (then at least one record from Index is given up).
	End int64
	// Bytes counts the bytes of records (frames, and what follows the damage) given up.
	Bytes int64
	// cut is the offset in Err.Path from which the segment is cleared; removed lists the later
	// segment files, which the cut removes.
	cut     int64
	removed []string
}

// Removed returns the segment files after the damaged one, which Truncate removes.
func (d *Damage) Removed() []string { return slices.Clone(d.removed) }

// Inspect opens the log in dir and reads every record (Verify). It returns nil when the log is
// healthy, the first damage otherwise, and an error when the log cannot be read for another
// reason. Opening applies the recovery Open always does (a torn tail is cleared, a missing index
// of a sealed segment rewritten). The log must not be open elsewhere.
func Inspect(dir string, opts Options) (*Damage, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l, err := Open(dir, o)
	if err == nil {
		err = l.Verify()
		if cerr := l.Close(); err == nil && cerr != nil {
			return nil, cerr
		}
	}
	var ce *CorruptError
	if err == nil || !errors.As(err, &ce) {
		return nil, err
	}
	return planCut(dir, o, ce)
}

// planCut works out the cut of the log in dir at ce.
func planCut(dir string, o Options, ce *CorruptError) (*Damage, error) {
	d := &Damage{Err: ce, End: -1}
	base, ok := parseBase(filepath.Base(ce.Path), segmentExt)
	if !ok {
		return nil, fmt.Errorf("wlog: damage in %s, which is not a segment file: %w", ce.Path, ce)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("wlog: read dir %s: %w", dir, err)
	}
	var later []int64
	for _, e := range ents {
		if b, ok := parseBase(e.Name(), segmentExt); ok && b > base {
			later = append(later, b)
		}
	}
	slices.Sort(later)
	b, err := os.ReadFile(ce.Path)
	if err != nil {
		return nil, fmt.Errorf("wlog: read %s: %w", ce.Path, err)
	}
	// The records before the damage are kept: the valid frames that end at or before it.
	maxLen := o.MaxRecordBytes
	n, off := int64(0), int64(SegmentHeaderBytes)
	if ce.Offset < SegmentHeaderBytes {
		off = 0 // the header is damaged: the whole segment goes
	} else {
		for off < ce.Offset && off+FrameHeaderBytes <= int64(len(b)) {
			fl := int64(le32(b[off:]))
			if fl < 8 || off+8+fl > min(ce.Offset, int64(len(b))) || frameCheck(b[off:off+8+fl], maxLen) != "" {
				break
			}
			n++
			off += FrameBytes(int(fl - 8))
		}
	}
	d.cut, d.Index = off, base+n
	d.Bytes = dataEnd(b, off) - off
	if len(later) == 0 {
		d.End = chainEnd(b, off, maxLen, d.Index)
	}
	for i, lb := range later {
		p := filepath.Join(dir, segmentName(lb))
		d.removed = append(d.removed, p)
		lbytes, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("wlog: read %s: %w", p, err)
		}
		d.Bytes += dataEnd(lbytes, SegmentHeaderBytes) - SegmentHeaderBytes
		if i == len(later)-1 {
			d.End = chainEnd(lbytes, SegmentHeaderBytes, maxLen, lb)
		}
	}
	return d, nil
}

// dataEnd returns the end of the last 8-byte word of b that is not zero, at least from.
func dataEnd(b []byte, from int64) int64 {
	end := int64(len(b)) &^ (FrameAlign - 1)
	for end > from && allZero(b[end-FrameAlign:end]) {
		end -= FrameAlign
	}
	if int64(len(b)) > end && !allZero(b[end:]) {
		end = int64(len(b))
	}
	return max(end, from)
}

// chainEnd counts the records from offset off of segment bytes b (whose record at off has index
// first) and returns the index after the last one; -1 when it cannot be told. A frame whose
// length word is intact but whose checksum fails counts as one record when a valid frame or the
// clean end (zeros) follows it.
func chainEnd(b []byte, off int64, maxLen int, first int64) int64 {
	idx := first
	size := int64(len(b))
	for off+FrameHeaderBytes <= size {
		fl := int64(le32(b[off:]))
		if fl == 0 {
			if allZero(b[off:]) {
				return idx
			}
			return -1
		}
		if fl < 8 || fl > int64(maxLen)+8 || off+8+fl > size {
			return -1
		}
		next := off + FrameBytes(int(fl-8))
		if frameCheck(b[off:off+8+fl], maxLen) != "" {
			// A damaged frame: trusted as one record only if what follows is a frame or the end.
			if next+FrameHeaderBytes <= size {
				if nl := int64(le32(b[next:])); nl != 0 && (nl < 8 || next+8+nl > size || frameCheck(b[next:next+8+nl], maxLen) != "") {
					return -1
				}
			}
		}
		idx++
		off = next
	}
	if off < size && !allZero(b[off:]) {
		return -1
	}
	return idx
}

// Truncate cuts the log in dir as d says (d from Inspect of the same, unchanged, directory): it
// removes the segments after the damaged one and the damaged one's index, and clears the damaged
// segment from the first damaged record (the whole file when its header is damaged; the next
// Open writes a new header). The log then ends at d.Index. Every step is durable when Truncate
// returns.
func Truncate(dir string, d *Damage) error {
	for i := len(d.removed) - 1; i >= 0; i-- { // newest first: a crash midway leaves a log that opens
		p := d.removed[i]
		for _, f := range []string{p[:len(p)-len(segmentExt)] + indexExt, p} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("wlog: remove %s: %w", f, err)
			}
		}
	}
	idx := d.Err.Path[:len(d.Err.Path)-len(segmentExt)] + indexExt
	if err := os.Remove(idx); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wlog: remove %s: %w", idx, err)
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	f, err := os.OpenFile(d.Err.Path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("wlog: open %s: %w", d.Err.Path, err)
	}
	defer f.Close()
	if d.cut == 0 {
		err = f.Truncate(0)
	} else {
		var st os.FileInfo
		if st, err = f.Stat(); err == nil {
			err = writeZeros(osFile{f}, d.cut, st.Size())
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return fmt.Errorf("wlog: cut %s at %d: %w", d.Err.Path, d.cut, err)
	}
	return nil
}

func syncDir(dir string) error {
	if err := OSFS().SyncDir(dir); err != nil {
		return fmt.Errorf("wlog: sync dir %s: %w", dir, err)
	}
	return nil
}

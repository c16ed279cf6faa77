package wlog_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// tornFixture is a closed log of two segments whose last segment holds records [base, n).
type tornFixture struct {
	dir  string
	base int64 // first index of the last segment
	n    int64 // records in the log
	last string
	data []byte  // the last segment file
	pos  []int64 // frame offsets of the records of the last segment
}

func newTornFixture(t *testing.T) tornFixture {
	t.Helper()
	dir := t.TempDir()
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, wlog.Options{SegmentBytes: 4096})
	appendRange(t, c, l, 0, 10)
	if err := l.Cut(); err != nil {
		t.Fatal(err)
	}
	appendRange(t, c, l, 10, 16)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f := tornFixture{dir: dir, base: 10, n: 16, last: "00000000000000000010.seg"}
	// A crash leaves no index of the active segment.
	if err := os.Remove(filepath.Join(dir, "00000000000000000010.idx")); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.data, err = os.ReadFile(filepath.Join(dir, f.last)); err != nil {
		t.Fatal(err)
	}
	off := int64(wlog.SegmentHeaderBytes)
	for i := f.base; i < f.n; i++ {
		f.pos = append(f.pos, off)
		off += wlog.FrameBytes(len(body(i)))
	}
	return f
}

// TestTornWrite cuts the last segment at every byte offset inside its last 3 records (truncated,
// or zeroed from there on), and checks that Open recovers silently to the last whole record, that
// appends work after, and that the result survives another reopen.
func TestTornWrite(t *testing.T) {
	t.Parallel()
	f := newTornFixture(t)
	c := newCommitter(t, wlog.CommitterOptions{})
	k0 := len(f.pos) - 3
	from := f.pos[k0]
	to := f.pos[len(f.pos)-1] + wlog.FrameHeaderBytes + int64(len(body(f.n-1))) // end of the last body
	for _, mode := range []string{"truncate", "zero"} {
		for off := from; off < to; off++ {
			name := fmt.Sprintf("%s at %d", mode, off)
			dir := copyDir(t, f.dir)
			path := filepath.Join(dir, f.last)
			if mode == "truncate" {
				if err := os.Truncate(path, off); err != nil {
					t.Fatal(err)
				}
			} else {
				b := append([]byte(nil), f.data...)
				clear(b[off:])
				if err := os.WriteFile(path, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// The records whose frame data ends at or before off are whole.
			want, stop := f.base, int64(wlog.SegmentHeaderBytes)
			for k, p := range f.pos {
				i := f.base + int64(k)
				if p+wlog.FrameHeaderBytes+int64(len(body(i))) > off {
					break
				}
				want, stop = i+1, p+wlog.FrameBytes(len(body(i)))
			}
			dirty := false // non-zero bytes left between the last whole frame and off
			for _, b := range f.data[stop:max(stop, off)] {
				dirty = dirty || b != 0
			}
			sink, logger := newSink(t)
			l, err := wlog.Open(dir, wlog.Options{SegmentBytes: 4096, Logger: logger})
			if err != nil {
				t.Fatalf("%s: Open: %v", name, err)
			}
			if got := sink.has(slog.LevelWarn, "wal torn tail truncated"); got != dirty {
				t.Errorf("%s: torn-tail warning logged = %v, want %v", name, got, dirty)
			}
			checkRecords(t, l, 0, want)
			appendRange(t, c, l, want, want+2)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l2, err := wlog.Open(dir, wlog.Options{SegmentBytes: 4096})
			if err != nil {
				t.Fatalf("%s: reopen: %v", name, err)
			}
			checkRecords(t, l2, 0, want+2)
			if err := l2.Verify(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if st, err := os.Stat(path); err != nil || st.Size() < 4096 {
				t.Fatalf("%s: segment not preallocated again: %v, %v", name, st, err)
			}
			l2.Close()
			os.RemoveAll(dir)
		}
	}
}

// TestHoleBeforeValidFrame zeroes the start of the second-to-last frame only (a torn write that
// lost its first page but kept a later one): a valid frame follows a bad one, which is corruption.
func TestHoleBeforeValidFrame(t *testing.T) {
	t.Parallel()
	f := newTornFixture(t)
	path := filepath.Join(f.dir, f.last)
	b := append([]byte(nil), f.data...)
	k := len(f.pos) - 2
	clear(b[f.pos[k] : f.pos[k]+8])
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := wlog.Open(f.dir, wlog.Options{SegmentBytes: 4096})
	wantErr := fmt.Sprintf("in file %q at offset %d", path, f.pos[k])
	if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), wantErr) {
		t.Fatalf("Open with a hole before a valid frame: %v, want ErrCorrupt %s", err, wantErr)
	}
}

// TestTornTailClearsStaleBytes zeroes the length and checksum of the last frame, leaving its
// timestamp and body: a torn tail. Recovery must clear those stale bytes, so that they can never
// be read as a frame after later appends.
func TestTornTailClearsStaleBytes(t *testing.T) {
	t.Parallel()
	f := newTornFixture(t)
	path := filepath.Join(f.dir, f.last)
	b := append([]byte(nil), f.data...)
	k := len(f.pos) - 1
	clear(b[f.pos[k] : f.pos[k]+8])
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	sink, logger := newSink(t)
	l := openLog(t, f.dir, wlog.Options{SegmentBytes: 4096, Logger: logger})
	if !sink.has(slog.LevelWarn, "wal torn tail truncated") {
		t.Error("no torn-tail warning")
	}
	checkRecords(t, l, 0, f.n-1)
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range after[f.pos[k]:] {
		if c != 0 {
			t.Fatalf("byte %d after the recovered end is %#x, want 0", f.pos[k]+int64(i), c)
		}
	}
}

// TestCorruption flips one byte of a record in the middle of a segment: Open (or Read, for a
// sealed segment with a valid index) reports ErrCorrupt with the file and the frame's offset.
func TestCorruption(t *testing.T) {
	t.Parallel()
	flip := func(t *testing.T, path string, off int64) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[off] ^= 0x40
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantCorrupt := func(t *testing.T, err error, path string, off int64) {
		t.Helper()
		want := fmt.Sprintf("in file %q at offset %d", path, off)
		if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), want) {
			t.Fatalf("error = %v, want ErrCorrupt %s", err, want)
		}
	}
	// Offsets in a frame to damage: length word, checksum, timestamp, body.
	for _, at := range []int64{0, 5, 9, wlog.FrameHeaderBytes + 3} {
		t.Run(fmt.Sprintf("last segment byte %d", at), func(t *testing.T) {
			t.Parallel()
			f := newTornFixture(t)
			path := filepath.Join(f.dir, f.last)
			flip(t, path, f.pos[2]+at)
			_, err := wlog.Open(f.dir, wlog.Options{SegmentBytes: 4096})
			wantCorrupt(t, err, path, f.pos[2])
		})
	}
	t.Run("sealed segment without index", func(t *testing.T) {
		t.Parallel()
		f := newTornFixture(t)
		path := filepath.Join(f.dir, "00000000000000000000.seg")
		off := int64(wlog.SegmentHeaderBytes) // record 0
		for i := int64(0); i < 4; i++ {
			off += wlog.FrameBytes(len(body(i)))
		}
		flip(t, path, off+wlog.FrameHeaderBytes)
		if err := os.Remove(filepath.Join(f.dir, "00000000000000000000.idx")); err != nil {
			t.Fatal(err)
		}
		_, err := wlog.Open(f.dir, wlog.Options{SegmentBytes: 4096})
		wantCorrupt(t, err, path, off)
	})
	t.Run("sealed segment with index", func(t *testing.T) {
		t.Parallel()
		f := newTornFixture(t)
		path := filepath.Join(f.dir, "00000000000000000000.seg")
		off := int64(wlog.SegmentHeaderBytes) + wlog.FrameBytes(len(body(0)))
		flip(t, path, off+wlog.FrameHeaderBytes+1) // record 1
		l := openLog(t, f.dir, wlog.Options{SegmentBytes: 4096})
		if _, err := l.Read(0, 1, 0); err != nil {
			t.Fatalf("Read of an intact record: %v", err)
		}
		_, err := l.Read(1, 1, 0)
		wantCorrupt(t, err, path, off)
		wantCorrupt(t, l.Verify(), path, off)
	})
	t.Run("sealed segment header", func(t *testing.T) {
		t.Parallel()
		f := newTornFixture(t)
		path := filepath.Join(f.dir, "00000000000000000000.seg")
		flip(t, path, 10)
		_, err := wlog.Open(f.dir, wlog.Options{SegmentBytes: 4096})
		wantCorrupt(t, err, path, 0)
	})
	t.Run("missing middle segment", func(t *testing.T) {
		t.Parallel()
		f := newTornFixture(t)
		c := newCommitter(t, wlog.CommitterOptions{})
		l := openLog(t, f.dir, wlog.Options{SegmentBytes: 4096})
		if err := l.Cut(); err != nil {
			t.Fatal(err)
		}
		appendRange(t, c, l, f.n, f.n+2)
		l.Close()
		if err := os.Remove(filepath.Join(f.dir, f.last)); err != nil {
			t.Fatal(err)
		}
		_, err := wlog.Open(f.dir, wlog.Options{SegmentBytes: 4096})
		if !errors.Is(err, storage.ErrCorrupt) {
			t.Fatalf("Open with a gap between segments: %v, want ErrCorrupt", err)
		}
	})
	t.Run("sealed segment truncated", func(t *testing.T) {
		t.Parallel()
		f := newTornFixture(t)
		path := filepath.Join(f.dir, "00000000000000000000.seg")
		if err := os.Remove(filepath.Join(f.dir, "00000000000000000000.idx")); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, 100); err != nil {
			t.Fatal(err)
		}
		_, err := wlog.Open(f.dir, wlog.Options{SegmentBytes: 4096})
		if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open with a truncated sealed segment: %v, want ErrCorrupt naming it", err)
		}
	})
}

// TestIndexRebuilt damages or removes the sidecar of a sealed segment: Open rebuilds it.
func TestIndexRebuilt(t *testing.T) {
	t.Parallel()
	for _, damage := range []string{"remove", "flip", "truncate", "garbage"} {
		t.Run(damage, func(t *testing.T) {
			t.Parallel()
			f := newTornFixture(t)
			idx := filepath.Join(f.dir, "00000000000000000000.idx")
			switch damage {
			case "remove":
				os.Remove(idx)
			case "flip":
				b, _ := os.ReadFile(idx)
				b[len(b)/2] ^= 1
				os.WriteFile(idx, b, 0o644)
			case "truncate":
				os.Truncate(idx, 30)
			case "garbage":
				os.WriteFile(idx, make([]byte, 1<<20), 0o644)
			}
			sink, logger := newSink(t)
			l := openLog(t, f.dir, wlog.Options{SegmentBytes: 4096, Logger: logger})
			if !sink.has(slog.LevelInfo, "wal index rebuilt") {
				t.Error("no rebuild logged")
			}
			checkRecords(t, l, 0, f.n)
			if _, err := os.Stat(idx); err != nil {
				t.Fatalf("index not rewritten: %v", err)
			}
		})
	}
}

// TestShortLastSegment covers a last segment shorter than its header or its preallocated size.
func TestShortLastSegment(t *testing.T) {
	t.Parallel()
	for _, size := range []int64{0, 7, wlog.SegmentHeaderBytes} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			f := newTornFixture(t)
			path := filepath.Join(f.dir, f.last)
			if err := os.Truncate(path, size); err != nil {
				t.Fatal(err)
			}
			if size == wlog.SegmentHeaderBytes {
				// Header intact, every record gone.
				b := f.data[:size]
				os.WriteFile(path, b, 0o644)
			}
			c := newCommitter(t, wlog.CommitterOptions{})
			l := openLog(t, f.dir, wlog.Options{SegmentBytes: 4096})
			checkRecords(t, l, 0, f.base)
			appendRange(t, c, l, f.base, f.base+3)
			l.Close()
			checkRecords(t, openLog(t, f.dir, wlog.Options{SegmentBytes: 4096}), 0, f.base+3)
		})
	}
}

// TestStaleCleanIndexIgnored simulates a crash after appends whose index removal did not
// persist: the index is older than the segment, and Open must notice and scan.
func TestStaleCleanIndexIgnored(t *testing.T) {
	t.Parallel()
	f := newTornFixture(t)
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, f.dir, wlog.Options{SegmentBytes: 4096})
	idx := filepath.Join(f.dir, "00000000000000000010.idx")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	stale, err := os.ReadFile(idx)
	if err != nil {
		t.Fatal(err)
	}
	l = openLog(t, f.dir, wlog.Options{SegmentBytes: 4096})
	appendRange(t, c, l, f.n, f.n+3)
	crashed := copyDir(t, f.dir)
	if err := os.WriteFile(filepath.Join(crashed, filepath.Base(idx)), stale, 0o644); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, openLog(t, crashed, wlog.Options{SegmentBytes: 4096}), 0, f.n+3)
}

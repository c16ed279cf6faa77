package wlog_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// TestInspectTruncate: a flipped bit in the first record of a segment (the last one without its
// index, as after a crash; a sealed one with or without its index) is found by Inspect with its
// file and offset; Truncate cuts the log there, and it opens with the records before the damage.
func TestInspectTruncate(t *testing.T) {
	t.Parallel()
	const total = 300
	cases := []struct {
		name     string
		seg      func(n int) int // which segment is damaged, of n
		keepIdx  bool
		openFail bool
	}{
		{"last", func(n int) int { return n - 1 }, false, true},
		{"sealed with index", func(int) int { return 1 }, true, false},
		{"sealed without index", func(int) int { return 1 }, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			opts := wlog.Options{SegmentBytes: 4 << 10}
			c := newCommitter(t, wlog.CommitterOptions{})
			l, err := wlog.Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			appendRange(t, c, l, 0, total)
			segs := l.Segments()
			if len(segs) < 3 {
				t.Fatalf("%d segments", len(segs))
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			k := tc.seg(len(segs))
			bad := segs[k]
			b, err := os.ReadFile(bad.Path)
			if err != nil {
				t.Fatal(err)
			}
			b[wlog.SegmentHeaderBytes+wlog.FrameHeaderBytes+2] ^= 0x04
			if err := os.WriteFile(bad.Path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if !tc.keepIdx {
				if err := os.Remove(strings.TrimSuffix(bad.Path, ".seg") + ".idx"); err != nil {
					t.Fatal(err)
				}
			}
			_, err = wlog.Open(dir, opts)
			if (err != nil) != tc.openFail {
				t.Fatalf("Open: %v", err)
			}

			d, err := wlog.Inspect(dir, opts)
			if err != nil || d == nil {
				t.Fatalf("Inspect: %v %v", d, err)
			}
			if d.Err.Path != bad.Path || d.Err.Offset != wlog.SegmentHeaderBytes || !errors.Is(d.Err, storage.ErrCorrupt) {
				t.Fatalf("damage %v, want %s at offset %d", d.Err, bad.Path, wlog.SegmentHeaderBytes)
			}
			if d.Index != bad.BaseIndex || d.End != total || d.Bytes <= 0 {
				t.Fatalf("damage gives up [%d, %d) %d bytes, want [%d, %d)", d.Index, d.End, d.Bytes, bad.BaseIndex, total)
			}
			if got := len(d.Removed()); got != len(segs)-1-k {
				t.Fatalf("removes %d segments, want %d", got, len(segs)-1-k)
			}
			if err := wlog.Truncate(dir, d); err != nil {
				t.Fatal(err)
			}
			if d, err := wlog.Inspect(dir, opts); d != nil || err != nil {
				t.Fatalf("Inspect after Truncate: %v %v", d, err)
			}
			l = openLog(t, dir, opts)
			checkRecords(t, l, 0, bad.BaseIndex)
			appendRange(t, c, l, bad.BaseIndex, bad.BaseIndex+5)
			checkRecords(t, l, 0, bad.BaseIndex+5)
		})
	}
}

// TestInspectHealthy: Inspect of a healthy log reports nothing.
func TestInspectHealthy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, wlog.Options{})
	appendRange(t, c, l, 0, 10)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if d, err := wlog.Inspect(dir, wlog.Options{}); d != nil || err != nil {
		t.Fatalf("Inspect: %v %v", d, err)
	}
}

package wlog_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestGolden writes a small log with fixed records, timestamps and clock, and compares the bytes
// of its segments (header and frames, up to the end of the last record) and of the sidecar index
// with testdata. A difference means the on-disk format changed: old logs would no longer open.
func TestGolden(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := fixedClock(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC))
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, wlog.Options{SegmentBytes: 4096, Clock: clock})
	ctx := context.Background()
	bin := make([]byte, 21)
	for i := range bin {
		bin[i] = byte(i)
	}
	batches := [][]wlog.Record{
		{{Timestamp: 1_000, Body: []byte("alpha")}, {Timestamp: 2_000, Body: []byte("bravo-bravo")}},
		{{Timestamp: 3_000, Body: nil}}, // an empty body
		nil,                             // Cut here
		{{Timestamp: 4_000, Body: []byte("delta-16-bytes!!")}, {Timestamp: -5, Body: bin}},
	}
	for _, b := range batches {
		if b == nil {
			if err := l.Cut(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if _, err := c.Append(ctx, l, b); err != nil {
			t.Fatal(err)
		}
	}
	segs := l.Segments()
	if len(segs) != 2 {
		t.Fatalf("want 2 segments, got %d", len(segs))
	}
	read := func(path string, n int64) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n >= 0 {
			b = b[:n]
		}
		return b
	}
	checkGolden(t, "segment_v1.golden", read(segs[0].Path, segs[0].Bytes))
	checkGolden(t, "index_v1.golden", read(filepath.Join(dir, "00000000000000000000.idx"), -1))
	checkGolden(t, "segment_v1_active.golden", read(segs[1].Path, segs[1].Bytes))
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./internal/storage/wal/wlog -run TestGolden -update` to create it)", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Errorf("%s: the on-disk format changed: %d bytes, want %d; first difference at byte %d.\n"+
		"Existing logs would not open. If the change is intended, bump the format version and keep "+
		"reading the old one, then regenerate with `go test ./internal/storage/wal/wlog -run TestGolden -update`.",
		name, len(got), len(want), i)
}

package wlog_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// Benchmarks run on demand: go test -run XXX -bench . ./internal/storage/wal/wlog

func BenchmarkCommit_1KiB_Sync_1Writer(b *testing.B)            { benchCommit(b, 1, 1) }
func BenchmarkCommit_1KiB_Sync_10Writers(b *testing.B)          { benchCommit(b, 10, 1) }
func BenchmarkCommit_1KiB_Sync_100Writers(b *testing.B)         { benchCommit(b, 100, 1) }
func BenchmarkCommit_1KiB_Sync_10Writers_Batch100(b *testing.B) { benchCommit(b, 10, 100) }
func BenchmarkCommit_1KiB_Sync_4Logs_40Writers(b *testing.B)    { benchCommitLogs(b, 4, 40, 1) }

func benchCommit(b *testing.B, writers, batch int) { benchCommitLogs(b, 1, writers, batch) }

// benchCommitLogs appends b.N records of 1 KiB through one committer with SyncAlways, from writers
// goroutines spread over logs, each calling Append with batch records and waiting for it.
func benchCommitLogs(b *testing.B, nlogs, writers, batch int) {
	var fsyncs, synced atomic.Int64
	c := wlog.NewCommitter(wlog.CommitterOptions{OnSync: func(_ time.Duration, records, logs int) {
		fsyncs.Add(int64(logs)) // one fdatasync per log per round
		synced.Add(int64(records))
	}})
	defer c.Close()
	logs := make([]*wlog.Log, nlogs)
	for i := range logs {
		l, err := wlog.Open(b.TempDir(), wlog.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		logs[i] = l
	}
	body := make([]byte, 1024)
	for i := range body {
		body[i] = byte(i)
	}
	calls := int64((b.N + batch - 1) / batch)
	var taken atomic.Int64
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			l := logs[w%nlogs]
			recs := make([]wlog.Record, batch)
			for taken.Add(1) <= calls {
				now := time.Now().UnixNano()
				for i := range recs {
					recs[i] = wlog.Record{Timestamp: now, Body: body}
				}
				if _, err := c.Append(context.Background(), l, recs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(calls*int64(batch))/took.Seconds(), "records/s")
	if n := fsyncs.Load(); n > 0 {
		b.ReportMetric(float64(synced.Load())/float64(n), "records/fsync")
	}
}

// BenchmarkOpen_1M_1KiB measures Open (recovery) of a log of 1,000,000 records of 1 KiB: after a
// clean Close (every segment has an index) and after a crash (the last segment is scanned). It
// also reports the heap the open log holds per record. The log is built once, in a temp dir.
func BenchmarkOpen_1M_1KiB(b *testing.B) {
	dir := buildLog(b, 1_000_000, 1024)
	b.Run("clean", func(b *testing.B) { benchOpen(b, dir, false, false) })
	b.Run("crash", func(b *testing.B) { benchOpen(b, dir, true, false) })
	b.Run("clean_cold", func(b *testing.B) { benchOpen(b, dir, false, true) })
	b.Run("crash_cold", func(b *testing.B) { benchOpen(b, dir, true, true) })
}

// benchOpen opens and closes the log in dir. crash removes the index a clean Close left for the
// last segment, so Open scans it; cold evicts the log's files from the page cache first.
func benchOpen(b *testing.B, dir string, crash, cold bool) {
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	lastIdx := segs[len(segs)-1][:len(segs[len(segs)-1])-len(".seg")] + ".idx"
	b.ReportAllocs()
	first := true
	for b.Loop() {
		b.StopTimer()
		if crash {
			if err := os.Remove(lastIdx); err != nil && !os.IsNotExist(err) {
				b.Fatal(err)
			}
		}
		if cold {
			dropCache(b, dir)
		}
		b.StartTimer()
		var before runtime.MemStats
		if first {
			b.StopTimer()
			runtime.GC()
			runtime.ReadMemStats(&before)
			b.StartTimer()
		}
		l, err := wlog.Open(dir, wlog.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if l.NextIndex() != 1_000_000 {
			b.Fatalf("NextIndex = %d", l.NextIndex())
		}
		if first {
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1e6, "heap-B/record")
			first = false
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// buildLog writes n records of size bytes into a new log (no fsync, batches of 1000) and closes it.
func buildLog(b *testing.B, n, size int) string {
	b.Helper()
	dir := b.TempDir()
	c := wlog.NewCommitter(wlog.CommitterOptions{Sync: wlog.SyncNone})
	defer c.Close()
	l, err := wlog.Open(dir, wlog.Options{})
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, size)
	recs := make([]wlog.Record, 1000)
	for i := 0; i < n; i += len(recs) {
		for j := range recs {
			recs[j] = wlog.Record{Timestamp: int64(i + j), Body: body}
		}
		if _, err := c.Append(context.Background(), l, recs[:min(len(recs), n-i)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkRead_1KiB_Batch100 reads 100 records per call from a log of 100,000.
func BenchmarkRead_1KiB_Batch100(b *testing.B) {
	dir := buildLog(b, 100_000, 1024)
	l, err := wlog.Open(dir, wlog.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	b.SetBytes(100 * 1024)
	b.ReportAllocs()
	i := int64(0)
	for b.Loop() {
		recs, err := l.Read(i, 100, 0)
		if err != nil || len(recs) != 100 {
			b.Fatalf("Read(%d) = %d, %v", i, len(recs), err)
		}
		i = (i + 100) % 99_900
	}
}

// BenchmarkFdatasync compares write+fdatasync into a growing file, a fallocated one and a
// zero-filled one: the measurement behind writing zeros ahead of the records (doc.go, "Durability").
func BenchmarkFdatasync(b *testing.B) {
	for _, size := range []int{1 << 10, 4 << 10, 16 << 10} {
		for _, mode := range []string{"append", "fallocate", "zerofill"} {
			b.Run(fmt.Sprintf("%dKiB_%s", size>>10, mode), func(b *testing.B) { benchFdatasync(b, size, mode) })
		}
	}
}

func benchFdatasync(b *testing.B, size int, mode string) {
	const fileBytes = 64 << 20
	path := filepath.Join(b.TempDir(), "f")
	f, err := wlog.OSFS().OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if mode != "append" {
		if err := f.Allocate(0, fileBytes); err != nil {
			b.Fatal(err)
		}
	}
	if mode == "zerofill" {
		zero := make([]byte, 1<<20)
		for off := int64(0); off < fileBytes; off += int64(len(zero)) {
			if _, err := f.WriteAt(zero, off); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	off := int64(0)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		if off+int64(size) > fileBytes {
			off = 0 // rewrites: only a long -benchtime gets here
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		if err := f.Datasync(); err != nil {
			b.Fatal(err)
		}
		off += int64(size)
	}
}

package wlog

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// extentFS records, for every file it opens, how far into the file anything was written.
type extentFS struct {
	FS
	mu     sync.Mutex
	spares int // files opened under the spare's name
}

type extentFile struct {
	File
	end atomic.Int64 // the largest offset+len of a write
}

func (e *extentFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := e.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(name[strings.LastIndexByte(name, '/')+1:], "spare") {
		e.mu.Lock()
		e.spares++
		e.mu.Unlock()
	}
	return &extentFile{File: f}, nil
}

func (f *extentFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	for end := off + int64(n); ; {
		cur := f.end.Load()
		if end <= cur || f.end.CompareAndSwap(cur, end) {
			break
		}
	}
	return n, err
}

// TestSegmentsAreWrittenOnlyAheadOfTheRecords: no segment, the first of a log or one prepared in
// the background as a spare, is written further than one zeroAhead chunk past its records. A
// spare used to be zero-filled whole in the background: 64 MiB written and synced at once, which
// stalled the committer's syncs for 20-30 ms at every roll under load (the disk's queue and its
// cache flush carried the burst). The records still go into written (zeroed) blocks: the zeros
// always reach at least the end of the records.
func TestSegmentsAreWrittenOnlyAheadOfTheRecords(t *testing.T) {
	efs := &extentFS{FS: OSFS()}
	const segBytes = 8 * zeroAhead
	l, err := Open(t.TempDir(), Options{FS: efs, SegmentBytes: segBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := NewCommitter(CommitterOptions{Sync: SyncAlways})
	defer c.Close()

	body := make([]byte, 3000)
	batch := make([]Record, 8)
	for i := range batch {
		batch[i] = Record{Body: body}
	}
	check := func() {
		t.Helper()
		l.wmu.Lock()
		defer l.wmu.Unlock()
		a := l.active()
		written := a.f.(*extentFile).end.Load()
		limit := min(a.size, (a.wend/zeroAhead+1)*zeroAhead)
		if written > limit {
			t.Fatalf("segment %d: written up to %d with records up to %d: more than one chunk (%d) ahead", a.base, written, a.wend, zeroAhead)
		}
		if written < a.wend || a.zeroed < a.wend {
			t.Fatalf("segment %d: records up to %d but written up to %d, zeroed mark %d", a.base, a.wend, written, a.zeroed)
		}
	}
	rolls := 0
	for prev := l.active().base; rolls < 3; {
		if _, err := c.Append(context.Background(), l, batch); err != nil {
			t.Fatal(err)
		}
		check()
		if base := l.active().base; base != prev {
			rolls, prev = rolls+1, base
		}
	}
	efs.mu.Lock()
	spares := efs.spares
	efs.mu.Unlock()
	if spares < 3 {
		t.Fatalf("%d spares prepared for 3 rolls: the rolls did not use spares", spares)
	}
}

package wlog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// opFS records the renames, removals, directory syncs and truncations it runs.
type opFS struct {
	FS
	mu  sync.Mutex
	ops []string
}

type opFile struct {
	File
	fs   *opFS
	name string
}

func (o *opFS) note(format string, args ...any) {
	o.mu.Lock()
	o.ops = append(o.ops, fmt.Sprintf(format, args...))
	o.mu.Unlock()
}

func (o *opFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := o.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &opFile{File: f, fs: o, name: filepath.Base(name)}, nil
}

func (o *opFS) Rename(oldpath, newpath string) error {
	o.note("rename %s %s", filepath.Base(oldpath), filepath.Base(newpath))
	return o.FS.Rename(oldpath, newpath)
}

func (o *opFS) Remove(name string) error {
	o.note("remove %s", filepath.Base(name))
	return o.FS.Remove(name)
}

func (o *opFS) SyncDir(name string) error {
	o.note("syncdir")
	return o.FS.SyncDir(name)
}

func (f *opFile) Truncate(size int64) error {
	f.fs.note("truncate %s %d", f.name, size)
	return f.File.Truncate(size)
}

// TestDeleteFreesSegmentsInSteps: DeleteBefore frees a segment deleteChunk at a time (truncating
// it from its end) instead of in one unlink, which on a file system mounted with online discard
// sent one large discard that stalled the committer's syncs for 8-15 ms. Since a crash can stop it
// half way, the segment is first renamed to a temporary name and the rename made durable: Open
// must never find a shortened segment under a segment's name. Readers of the deleted records,
// racing with the truncation, get storage.ErrOffsetOutOfRange, never a corruption error.
func TestDeleteFreesSegmentsInSteps(t *testing.T) {
	ofs := &opFS{FS: OSFS()}
	const segBytes = 2*deleteChunk + 1<<20
	dir := t.TempDir()
	l, err := Open(dir, Options{FS: ofs, SegmentBytes: segBytes, FirstSegmentBytes: segBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := NewCommitter(CommitterOptions{Sync: SyncNone})
	defer c.Close()
	body := make([]byte, 256<<10)
	for l.active().base == 0 || len(l.segs) < 3 {
		if _, err := c.Append(context.Background(), l, []Record{{Body: body}}); err != nil {
			t.Fatal(err)
		}
	}
	first := l.segs[0]
	cut := l.segs[1].base // deletes the first segment only
	name := filepath.Base(first.path)

	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				readErr <- nil
				return
			default:
			}
			if _, err := l.Read(0, 4, 0); err != nil && !errors.Is(err, storage.ErrOffsetOutOfRange) {
				readErr <- err
				return
			}
		}
	}()
	ofs.mu.Lock()
	ofs.ops = nil
	ofs.mu.Unlock()
	recs, _, err := l.DeleteBefore(cut)
	close(stop)
	if rerr := <-readErr; rerr != nil {
		t.Fatalf("a read racing with the deletion: %v, want storage.ErrOffsetOutOfRange or records", rerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if recs != cut {
		t.Fatalf("deleted %d records, want %d", recs, cut)
	}

	ofs.mu.Lock()
	ops := append([]string(nil), ofs.ops...)
	ofs.mu.Unlock()
	tmp := name + tmpExt
	want := []string{"rename " + name + " " + tmp, "syncdir"}
	var truncs []string
	seen := map[string]int{} // op -> 1 + its first position
	for i, op := range ops {
		if seen[op] == 0 {
			seen[op] = i + 1
		}
		if strings.HasPrefix(op, "truncate ") {
			truncs = append(truncs, op)
		}
	}
	for _, w := range want {
		if seen[w] == 0 {
			t.Fatalf("ops %q: no %q", ops, w)
		}
	}
	if len(truncs) == 0 {
		t.Fatalf("ops %q: the segment was not truncated in steps", ops)
	}
	prev := int64(segBytes)
	for _, op := range truncs {
		var f string
		var size int64
		if _, err := fmt.Sscanf(op, "truncate %s %d", &f, &size); err != nil || f != tmp {
			t.Fatalf("ops %q: %q truncates something else than %s", ops, op, tmp)
		}
		if prev-size > deleteChunk || size >= prev {
			t.Fatalf("ops %q: a step from %d to %d frees more than %d", ops, prev, size, deleteChunk)
		}
		if seen[op] < seen["syncdir"] {
			t.Fatalf("ops %q: truncated before the rename was durable", ops)
		}
		prev = size
	}
	if prev > deleteChunk {
		t.Fatalf("ops %q: removed at %d bytes, more than one step", ops, prev)
	}
	if seen["syncdir"] < seen["rename "+name+" "+tmp] {
		t.Fatalf("ops %q: the rename was not made durable", ops)
	}
	if seen["remove "+tmp] < seen[truncs[len(truncs)-1]] {
		t.Fatalf("ops %q: %s not removed after its last step", ops, tmp)
	}
	if _, err := OSFS().Stat(filepath.Join(dir, tmp)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s after the deletion: %v, want it gone", tmp, err)
	}
}

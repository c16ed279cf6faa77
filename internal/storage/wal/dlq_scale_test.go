package wal

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// The cost of a long DLQ (docs/benchmarks.md, "A DLQ of a million entries of 1 KiB"). Opt-in:
//
//	SPOOL_WAL_DLQ_SCALE=1000000 go test -run '^TestDLQScale$' -v -timeout 60m ./internal/storage/wal/
//
// It builds two data directories (in SPOOL_WAL_DLQ_SCALE_DIR if set, else a temporary directory
// removed at the end) with the same backlog of SPOOL_WAL_DLQ_SCALE messages of 1 KiB and one queue
// subscription: in "empty" every message is acked, in "full" every one is dead-lettered. Then a
// fresh process (this test binary) opens each and reports its resident memory, its Go heap, the
// time of Open and of a snapshot (whole, and its export and encoding alone; best of 3) and the
// snapshot's size. It uses only what the engine
// had before DLQ logs too, so the same file measures an older version. About 3.5 GB of disk with
// 1,000,000 entries.

// TestDLQScale builds the directories and runs TestDLQScaleChild on each (skipped unless
// SPOOL_WAL_DLQ_SCALE is set).
func TestDLQScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SPOOL_WAL_DLQ_SCALE"))
	if n <= 0 {
		t.Skip("set SPOOL_WAL_DLQ_SCALE to the number of DLQ entries")
	}
	root := os.Getenv("SPOOL_WAL_DLQ_SCALE_DIR")
	if root == "" {
		root = t.TempDir()
	}
	for _, kind := range []string{"empty", "full"} {
		dir := filepath.Join(root, kind)
		if _, err := os.Stat(filepath.Join(dir, "topics", "q")); err != nil {
			start := time.Now()
			buildDLQDir(t, dir, n, kind == "full")
			t.Logf("%s: built %d messages in %s", kind, n, time.Since(start).Round(time.Second))
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestDLQScaleChild$", "-test.v")
		cmd.Env = append(os.Environ(), "SPOOL_DLQ_SCALE_CHILD="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if _, line, ok := strings.Cut(sc.Text(), "DLQSCALE "); ok {
				t.Logf("%s DLQ: %s", kind, line)
			}
		}
	}
}

// buildDLQDir publishes n messages of 1 KiB to topic q and acks them, or dead-letters them with
// dead, 1,000 at a time.
func buildDLQDir(t *testing.T, dir string, n int, dead bool) {
	e, err := Open(dir, Config{Sync: UnsafeNoSync})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "q", Config: storage.TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	q, err := e.SubscriptionGetByGroup(ctx, "q", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(strings.Repeat("d", 1024))
	msgs := make([]storage.AppendMessage, 1000)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload}
	}
	for done := 0; done < n; done += len(msgs) {
		k := min(len(msgs), n-done)
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "q", Messages: msgs[:k]}); err != nil {
			t.Fatal(err)
		}
		res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: k})
		if err != nil || len(res.Deliveries) != k {
			t.Fatalf("claim: %d, %v", len(res.Deliveries), err)
		}
		if dead {
			_, err = e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m", Refs: refs(res.Deliveries), ToDLQ: true, Reason: "scale"})
		} else {
			_, err = e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID, Refs: refs(res.Deliveries)})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDLQScaleChild is the child process of TestDLQScale (skipped otherwise): it opens the
// directory in SPOOL_DLQ_SCALE_CHILD, reads the DLQ's last page and prints one DLQSCALE line.
func TestDLQScaleChild(t *testing.T) {
	dir := os.Getenv("SPOOL_DLQ_SCALE_CHILD")
	if dir == "" {
		t.Skip("child of TestDLQScale")
	}
	start := time.Now()
	e, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	open := time.Since(start)
	defer e.Close()
	ctx := context.Background()
	q, err := e.SubscriptionGetByGroup(ctx, "q", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.SubscriptionStats(ctx, q.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.DeadLettered > 0 {
		list, err := e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: q.ID, AfterID: st.DeadLettered - 10})
		if err != nil || len(list) == 0 || len(list[0].Message.Payload) != 1024 {
			t.Fatalf("list: %d entries, %v", len(list), err)
		}
	}
	runtime.GC()
	rss, err := vmRSSKiB()
	if err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var encode time.Duration
	for i := range 3 {
		s := time.Now()
		e.mu.Lock()
		st := e.exportSnapshotLocked()
		e.mu.Unlock()
		st.encode(0)
		if d := time.Since(s); i == 0 || d < encode {
			encode = d
		}
	}
	var best time.Duration
	for i := range 3 {
		s := time.Now()
		if err := e.snapshot(false); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(s); i == 0 || d < best {
			best = d
		}
	}
	var size int64
	if files, _ := filepath.Glob(filepath.Join(dir, "snapshot-*.bin")); len(files) == 1 {
		if fi, err := os.Stat(files[0]); err == nil {
			size = fi.Size()
		}
	}
	t.Logf("DLQSCALE entries %d, RSS %d MiB, Go heap %d MiB, Open %s, snapshot %s, of which export and encoding %s (best of 3), snapshot file %d bytes",
		st.DeadLettered, rss/1024, ms.HeapAlloc>>20, open.Round(time.Millisecond), best.Round(100*time.Microsecond), encode.Round(10*time.Microsecond), size)
}

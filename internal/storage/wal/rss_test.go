package wal

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// vmRSSKiB reads the resident set size of this process from /proc/self/status.
func vmRSSKiB() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	return 0, sc.Err()
}

// TestBacklogRSSChild is the child process of BenchmarkBacklogRSS_1M (skipped otherwise): it
// opens the backlog in SPOOL_RSS_DIR, claims and acks 1,000 messages, and prints its VmRSS.
func TestBacklogRSSChild(t *testing.T) {
	dir := os.Getenv("SPOOL_RSS_DIR")
	if dir == "" {
		t.Skip("child of BenchmarkBacklogRSS_1M")
	}
	e, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	q, err := e.SubscriptionGetByGroup(ctx, "bench", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		// Leave some unacked (sparse state above the floor): ack all but the first.
		if _, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID, Refs: refs(res.Deliveries[1:])}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := e.SubscriptionStats(ctx, q.ID)
	if err != nil || st.Pending < 900_000 {
		t.Fatalf("stats %+v %v", st, err)
	}
	runtime.GC()
	rss, err := vmRSSKiB()
	if err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("RSS_KIB %d HEAP_KIB %d", rss, ms.HeapAlloc/1024)
}

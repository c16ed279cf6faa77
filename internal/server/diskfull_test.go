package server

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/protocol"
)

// mountTmpfs mounts a tmpfs of size bytes on a new directory and unmounts it at the end of the
// test: a real small file system that fills up. It needs root (CAP_SYS_ADMIN); without it the test
// is skipped, except where SPOOL_TEST_REQUIRE_MOUNT=1 (scripts/test.sh sets it when it runs as
// root, as in CI): there it fails.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		if os.Getenv("SPOOL_TEST_REQUIRE_MOUNT") == "1" {
			t.Fatalf("mount a tmpfs (SPOOL_TEST_REQUIRE_MOUNT=1): %v", err)
		}
		t.Skipf("mount a tmpfs needs root: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillUp leaves at most keep bytes free on the file system of dir with a file it returns.
func fillUp(t *testing.T, dir string, keep int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, free-keep); err != nil {
		t.Fatalf("fill up %d of %d free bytes: %v", free-keep, free, err)
	}
	return path
}

// TestDiskFullReadOnlyThenResumes (issue 16, seed 002 M3-14): the embedded engine on a real small
// file system that fills up. Publishes that need a new segment are refused with STORAGE_FULL
// (retryable, nothing stored) instead of breaking the engine; /readyz says why; stored messages
// are still delivered and acked; once space is freed the same publish is stored without a restart;
// nothing was lost or corrupted (a reopen finds every acknowledged message).
func TestDiskFullReadOnlyThenResumes(t *testing.T) {
	t.Parallel()
	dir := mountTmpfs(t, "4m")
	eng, err := wal.Open(filepath.Join(dir, "data"), wal.Config{SegmentBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	f := newFailEnv(t, eng, dir)
	c := f.dial(nil)
	c.publish("t", "first")
	filler := fillUp(t, dir, 16<<10) // the 64 KiB first segment has room; the next one does not fit

	// Small messages until the active segment is full: then none fits, not even over HTTP.
	payload := "x"
	stored := 1
	var full *protocol.Error
	for range 10_000 {
		resp := c.request(&protocol.Publish{Topic: "t", Messages: []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte(payload)}}})
		if e, ok := resp.(*protocol.Error); ok {
			full = e
			break
		}
		stored++
	}
	if full == nil || full.Code != protocol.CodeStorageFull || !full.Retryable {
		t.Fatalf("publish on a full disk after %d stored: %v, want STORAGE_FULL (retryable)", stored, full)
	}
	f.noSecret("STORAGE_FULL", full.Message)
	f.expectHTTP("t", http.StatusInsufficientStorage, "STORAGE_FULL")
	if code, body := f.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "STORAGE_FULL") {
		t.Fatalf("/readyz on a full disk: %d %s, want 503 STORAGE_FULL", code, body)
	}

	// Deliveries of what was stored go on, and their acks are stored.
	// The engine still takes changes that need no new segment (a broken one would refuse them,
	// and deliver nothing below).
	if _, err := eng.BindingCreate(context.Background(), &storage.BindingCreateParams{Group: "probe", Pattern: "probe.#"}); err != nil {
		t.Fatalf("a state change on a full disk: %v", err)
	}
	c2 := f.dial(nil)
	c2.subscribe(&protocol.Subscribe{Topic: "t", MaxInFlight: uint32(stored)})
	ds := c2.deliveriesN(stored)
	ok := c2.request(&protocol.Ack{Refs: refs(ds...)})
	if ack, isAck := ok.(*protocol.AckOK); !isAck || int(ack.Acked) != stored {
		t.Fatalf("ack of %d deliveries on a full disk: %+v", stored, ok)
	}

	// Space comes back: the same publish is stored, without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	c.publish("t", payload)
	stored++
	if code, body := f.get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz once space is back: %d %s", code, body)
	}

	// Nothing lost or damaged: a reopen reads every acknowledged message.
	f.b.Stop(context.Background())
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	eng2, err := wal.Open(filepath.Join(dir, "data"), wal.Config{SegmentBytes: 1 << 20})
	if err != nil {
		t.Fatalf("reopen after the full disk: %v", err)
	}
	defer eng2.Close()
	st, err := eng2.TopicStats(context.Background(), "t")
	if err != nil || st.Messages != int64(stored) {
		t.Fatalf("after reopen: %+v, %v; want %d messages", st, err, stored)
	}
}

// get fetches path from the HTTP API.
func (f *failEnv) get(path string) (int, string) {
	f.t.Helper()
	resp, err := f.httpCli.Get(f.http.URL + path)
	if err != nil {
		f.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestDiskFullDeadLettersWaitForRoom: on a real file system that fills up, dead-letterings whose
// DLQ log needs a segment it cannot make are answered as usual and the engine goes on (the records
// wait in memory); once space is freed they reach the DLQ log, Close writes its final snapshot, and
// a reopen lists every entry with its message.
func TestDiskFullDeadLettersWaitForRoom(t *testing.T) {
	t.Parallel()
	dir := mountTmpfs(t, "4m")
	data := filepath.Join(dir, "data")
	eng, err := wal.Open(data, wal.Config{SegmentBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	f := newFailEnv(t, eng, dir)
	c := f.dial(nil)
	const n = 30
	payload := strings.Repeat("p", 4000) // 30 of them: about twice a DLQ log's first 64 KiB segment
	for range n {
		c.publish("d", payload)
	}
	c2 := f.dial(nil)
	c2.subscribe(&protocol.Subscribe{Topic: "d", Group: "g", MaxInFlight: n})
	ds := c2.deliveriesN(n)
	nack := func(d protocol.Delivery) {
		t.Helper()
		if resp := c2.request(&protocol.Nack{ToDLQ: true, Reason: "poison", Refs: refs(d)}); !isNackOK(resp) {
			t.Fatalf("nack to the DLQ: %+v", resp)
		}
	}
	nack(ds[0]) // the DLQ log is made while there is room
	filler := fillUp(t, dir, 16<<10)
	for _, d := range ds[1:] {
		nack(d)
	}
	if _, err := eng.BindingCreate(context.Background(), &storage.BindingCreateParams{Group: "probe", Pattern: "probe.#"}); err != nil {
		t.Fatalf("a state change after dead-letterings on a full disk: %v", err)
	}
	subs, err := eng.SubscriptionList(context.Background(), &storage.SubscriptionListParams{Topic: "d"})
	if err != nil || len(subs) != 1 {
		t.Fatalf("subscriptions of d: %+v, %v", subs, err)
	}
	sub := subs[0]
	list := func(e *wal.Engine, what string) {
		t.Helper()
		got, err := e.DLQList(context.Background(), &storage.DLQListParams{SubscriptionID: sub.ID, Limit: 100})
		if err != nil || len(got) != n {
			t.Fatalf("%s: %d DLQ entries, %v; want %d", what, len(got), err, n)
		}
		for i, d := range got {
			if d.ID != int64(i+1) || string(d.Message.Payload) != payload {
				t.Fatalf("%s: entry %d: ID %d, %d bytes of payload", what, i, d.ID, len(d.Message.Payload))
			}
		}
	}
	list(eng, "disk full")

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	f.b.Stop(context.Background())
	if err := eng.Close(); err != nil { // the records are appended, then the final snapshot written
		t.Fatalf("close once space is back: %v", err)
	}
	eng2, err := wal.Open(data, wal.Config{SegmentBytes: 1 << 20})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer eng2.Close()
	list(eng2, "after a reopen")
}

func isNackOK(m protocol.ServerMessage) bool {
	_, ok := m.(*protocol.NackOK)
	return ok
}

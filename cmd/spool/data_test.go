package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/testutil"
)

func runDataCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	var out, errb testutil.SyncBuffer
	code := runCLI(context.Background(), &cliEnv{stdout: &out, stderr: &errb}, runData, args)
	return cliResult{stdout: out.String(), stderr: errb.String(), code: code}
}

// TestDataVerifyTruncate: spool data verify finds a flipped bit with its file and offset and
// what truncating gives up; truncate refuses without --yes, then cuts the log, after which the
// engine serves the partition with the earlier messages. Both refuse to run beside an engine.
func TestDataVerifyTruncate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: "orders", Config: storage.TopicConfig{Partitions: 2}}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "orders",
			Messages: []storage.AppendMessage{{Partition: 1, Payload: []byte("payload")}}}); err != nil {
			t.Fatal(err)
		}
	}
	if r := runDataCLI(t, "verify", "--data-dir", dir); r.code != 1 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("verify beside an engine: %v", r)
	}
	if r := runDataCLI(t, "truncate", "--data-dir", dir, "--topic", "orders", "--partition", "1", "--yes"); r.code != 1 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("truncate beside an engine: %v", r)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	if r := runDataCLI(t, "verify", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "3 logs verified, 0 damaged") {
		t.Fatalf("verify of a healthy directory: %v", r)
	}

	// Flip a bit in the second message of partition 1.
	seg := filepath.Join(dir, "topics", "orders", "1", "00000000000000000000.seg")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	frame := wlog.FrameBytes(int(binary.LittleEndian.Uint32(b[wlog.SegmentHeaderBytes:])) - 8)
	at := wlog.SegmentHeaderBytes + frame
	b[at+wlog.FrameHeaderBytes] ^= 0x80
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}

	r := runDataCLI(t, "verify", "--data-dir", dir)
	for _, want := range []string{
		`topic "orders" partition 0: ok`,
		`topic "orders" partition 1: DAMAGED in file ` + seg + fmt.Sprintf(" at byte %d: frame checksum mismatch", at),
		fmt.Sprintf("truncating gives up 3 messages, offsets 1 to 3, %d bytes", 3*frame),
		"spool data truncate --data-dir " + dir + " --topic orders --partition 1 --yes",
		"3 logs verified, 1 damaged",
	} {
		if r.code != 1 || !strings.Contains(r.stdout, want) {
			t.Fatalf("verify: want %q in %v", want, r)
		}
	}
	r = runDataCLI(t, "truncate", "--data-dir", dir, "--topic", "orders", "--partition", "1")
	if r.code != 1 || !strings.Contains(r.stdout, fmt.Sprintf("truncating would give up 3 messages, offsets 1 to 3, %d bytes", 3*frame)) ||
		!strings.Contains(r.stderr, "nothing changed: run again with --yes") {
		t.Fatalf("truncate without --yes: %v", r)
	}
	if r := runDataCLI(t, "truncate", "--data-dir", dir, "--topic", "orders"); r.code != 2 || !strings.Contains(r.stderr, "--topic and --partition are required") {
		t.Fatalf("truncate without --partition: %v", r)
	}
	r = runDataCLI(t, "truncate", "--data-dir", dir, "--topic", "orders", "--partition", "1", "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("truncated at offset 1: gave up 3 messages, offsets 1 to 3, %d bytes", 3*frame)) {
		t.Fatalf("truncate: %v", r)
	}
	if r := runDataCLI(t, "verify", "--data-dir", dir); r.code != 0 {
		t.Fatalf("verify after the truncation: %v", r)
	}

	eng, err = wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	msgs, err := eng.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "orders", Partition: 1})
	if err != nil || len(msgs) != 1 || string(msgs[0].Payload) != "payload" {
		t.Fatalf("read after the repair: %v %v", msgs, err)
	}
}

// TestDamagedPartitionServed: a broker on a data directory with a damaged partition starts, and
// spool topic describe (admin API) names the damaged partition, in text and in JSON.
func TestDamagedPartitionServed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: "orders", Config: storage.TopicConfig{Partitions: 2}}); err != nil {
		t.Fatal(err)
	}
	for p := range int32(2) {
		if _, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "orders",
			Messages: []storage.AppendMessage{{Partition: p, Payload: []byte("payload")}, {Partition: p, Payload: []byte("payload")}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, "topics", "orders", "1", "00000000000000000000.seg")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[wlog.SegmentHeaderBytes+wlog.FrameHeaderBytes] ^= 0x80
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(strings.TrimSuffix(seg, ".seg") + ".idx"); err != nil {
		t.Fatal(err)
	}

	eng, err = wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatalf("open with a damaged partition: %v", err)
	}
	br, err := broker.New(broker.Config{Engine: eng, RetentionInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := admin.New(admin.Config{Broker: br})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, cliWaitTimeout)
		defer cancel()
		_ = h.Close(sctx)
		hs.Close()
		_ = br.Stop(sctx)
		_ = eng.Close()
	})
	s := &cliStack{addr: "127.0.0.1:1", httpURL: hs.URL, broker: br}
	r := s.ok(t, "", "topic", "describe", "orders")
	if !strings.Contains(r.stdout, "Damaged partitions: 1 (unavailable until repaired") {
		t.Fatalf("describe: %v", r)
	}
	var info struct {
		Stats storage.TopicStats `json:"stats"`
	}
	cliDecodeJSON(t, s.ok(t, "", "topic", "describe", "orders", "--json").stdout, &info)
	if len(info.Stats.Partitions) != 2 || info.Stats.Partitions[0].Damaged || !info.Stats.Partitions[1].Damaged {
		t.Fatalf("stats: %+v", info.Stats)
	}
}

// TestDataVerifyDLQLog: spool data verify checks DLQ logs too; reading a damaged one, or opening
// the engine when Open meets the damage, fails with ErrCorrupt naming the repair; spool data
// truncate --dlq refuses without --yes, then cuts the log at the damage, after which the engine
// opens with the DLQ entries before it.
func TestDataVerifyDLQLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: "orders"}); err != nil {
		t.Fatal(err)
	}
	q, err := eng.SubscriptionGetByGroup(ctx, "orders", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	payloads := []string{"entry-one", "entry-two", "entry-three"}
	for _, pl := range payloads { // one DLQ record each
		if _, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "orders",
			Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte(pl)}}}); err != nil {
			t.Fatal(err)
		}
		res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1})
		if err != nil || len(res.Deliveries) != 1 {
			t.Fatalf("claim: %v %v", res, err)
		}
		if _, err := eng.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m",
			Refs: []storage.DeliveryRef{res.Deliveries[0].Ref()}, ToDLQ: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	if r := runDataCLI(t, "verify", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("DLQ log of subscription %d: ok", q.ID)) {
		t.Fatalf("verify of a healthy directory: %v", r)
	}
	seg := filepath.Join(dir, "dlq", fmt.Sprint(q.ID), "00000000000000000000.seg")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := strings.Index(string(b), "entry-two") // the second of three records (a bad last one is a torn tail)
	if at < 0 {
		t.Fatal("entry-two not found in the DLQ segment")
	}
	b[at] ^= 0x80
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := runDataCLI(t, "verify", "--data-dir", dir)
	for _, want := range []string{
		fmt.Sprintf("DLQ log of subscription %d: DAMAGED in file %s at byte ", q.ID, seg),
		"truncating gives up 2 DLQ entries, IDs 2 to 3",
		fmt.Sprintf("spool data truncate --data-dir %s --dlq %d --yes", dir, q.ID),
		"3 logs verified, 1 damaged", // state, orders/0, the DLQ log
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("verify output lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.code != 1 {
		t.Fatalf("verify of a damaged DLQ log: exit %d", r.code)
	}
	// A damaged record in the middle of the log: the engine opens, and reading that DLQ fails
	// with the damage and the repair.
	eng, err = wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.DLQList(ctx, &storage.DLQListParams{SubscriptionID: q.ID}); !errors.Is(err, storage.ErrCorrupt) ||
		!strings.Contains(err.Error(), fmt.Sprintf("spool data truncate --dlq %d", q.ID)) {
		t.Fatalf("DLQList of a damaged DLQ log: %v, want ErrCorrupt naming the repair", err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--dlq", fmt.Sprint(q.ID), "--topic", "orders", "--partition", "0"},
		{"--dlq", "-1"},
	} {
		if r := runDataCLI(t, append([]string{"truncate", "--data-dir", dir}, args...)...); r.code != 2 {
			t.Errorf("truncate %v: %v, want a usage error", args, r)
		}
	}
	if r := runDataCLI(t, "truncate", "--data-dir", dir, "--dlq", "999"); r.code != 1 || !strings.Contains(r.stderr, "no DLQ log of subscription 999") {
		t.Errorf("truncate of a missing DLQ log: %v", r)
	}
	r = runDataCLI(t, "truncate", "--data-dir", dir, "--dlq", fmt.Sprint(q.ID))
	if r.code != 1 || !strings.Contains(r.stdout, "truncating would give up 2 DLQ entries, IDs 2 to 3") {
		t.Fatalf("truncate without --yes: %v", r)
	}
	if after, err := os.ReadFile(seg); err != nil || string(after) != string(b) {
		t.Fatalf("truncate without --yes changed the segment (%v)", err)
	}
	r = runDataCLI(t, "truncate", "--data-dir", dir, "--dlq", fmt.Sprint(q.ID), "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "truncated at DLQ entry ID 2: gave up 2 DLQ entries") {
		t.Fatalf("truncate --yes: %v", r)
	}
	eng, err = wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatalf("Open after the cut: %v", err)
	}
	got, err := eng.DLQList(ctx, &storage.DLQListParams{SubscriptionID: q.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != 1 || string(got[0].Message.Payload) != "entry-one" {
		t.Fatalf("DLQ after the cut: %+v, want entry 1 alone", got)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}

	// Damage that Open meets (the segment's header) stops it, naming the repair; the cut then
	// gives up the whole segment.
	if b, err = os.ReadFile(seg); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := wal.Open(dir, wal.Config{}); !errors.Is(err, storage.ErrCorrupt) ||
		!strings.Contains(err.Error(), fmt.Sprintf("spool data truncate --dlq %d", q.ID)) {
		t.Fatalf("Open with a damaged DLQ segment header: %v, want ErrCorrupt naming the repair", err)
	}
	if r := runDataCLI(t, "truncate", "--data-dir", dir, "--dlq", fmt.Sprint(q.ID), "--yes"); r.code != 0 || !strings.Contains(r.stdout, "truncated at DLQ entry ID 1") {
		t.Fatalf("truncate --yes of a damaged header: %v", r)
	}
	eng, err = wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatalf("Open after the second cut: %v", err)
	}
	defer eng.Close()
	if got, err := eng.DLQList(ctx, &storage.DLQListParams{SubscriptionID: q.ID}); err != nil || len(got) != 0 {
		t.Fatalf("DLQ after the second cut: %+v %v, want none", got, err)
	}
}

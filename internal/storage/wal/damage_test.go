package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/testutil"
)

// flipInFirstFrame flips a bit in the body of the first frame of a segment file.
func flipInFirstFrame(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[wlog.SegmentHeaderBytes+wlog.FrameHeaderBytes+1] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(files) == 0 {
		t.Fatalf("segments of %s: %v %v", dir, files, err)
	}
	return files
}

// checkDamaged checks the answers of an engine whose topic "bad" has its partition 0 damaged:
// the typed error for what needs it, partition 1 and topic "good" served, stats marked.
func checkDamaged(t *testing.T, h *harness) {
	t.Helper()
	isDamaged := func(err error, what string) {
		t.Helper()
		var ioe *storage.IOError
		if !errors.As(err, &ioe) || !errors.Is(err, storage.ErrUnavailable) || !errors.Is(err, storage.ErrPartitionDamaged) {
			t.Fatalf("%s: got %v, want an IOError of ErrUnavailable and ErrPartitionDamaged", what, err)
		}
		if strings.Contains(ioe.Public(), h.dir) || !strings.Contains(ioe.Public(), "partition 0") {
			t.Fatalf("%s: public text %q", what, ioe.Public())
		}
	}
	_, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "bad", Partition: 0})
	isDamaged(err, "read the damaged partition")
	_, err = h.e.MessagesAppend(h.ctx, &storage.MessagesAppendParams{Topic: "bad",
		Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("x")}}})
	isDamaged(err, "publish to the damaged partition")

	// Keyless messages go to the healthy partition; claims of the queue skip the damaged one.
	pos := h.publishN("bad", 3)
	for _, p := range pos {
		equal(t, p.Partition, 1, "partition of a keyless message")
	}
	q := h.queueSub("bad")
	ds := h.claim(q.ID, "m", 100)
	equal(t, len(ds), 5+3, "deliveries of the healthy partition")
	for _, d := range ds {
		equal(t, d.Partition, 1, "partition of a delivery")
	}
	h.ack(q.ID, refs(ds)...)
	_, err = h.e.DeliveriesClaim(h.ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1, Partitions: []int32{0}})
	isDamaged(err, "claim of the damaged partition only")

	// The other topic works normally.
	h.publishN("good", 2)
	gq := h.queueSub("good")
	equal(t, len(h.claim(gq.ID, "m", 100)), 7, "deliveries of the healthy topic")

	st, err := h.e.TopicStats(h.ctx, "bad")
	h.must(err, "stats")
	equal(t, st.Partitions[0].Damaged, true, "partition 0 damaged in stats")
	equal(t, st.Partitions[1].Damaged, false, "partition 1 damaged in stats")
	equal(t, st.Partitions[1].HighWater, 8, "high water of partition 1")
}

// setupDamage makes topics "bad" (2 partitions, 5 messages each) and "good" (5 messages).
func setupDamage(t *testing.T, h *harness) {
	t.Helper()
	h.createTopic("bad", storage.TopicConfig{Partitions: 2})
	h.createTopic("good", storage.TopicConfig{})
	for p := range int32(2) {
		for range 5 {
			h.publish("bad", storage.AppendMessage{Partition: p, Payload: []byte("0123456789abcdef")})
		}
	}
	h.publishN("good", 5)
}

// TestDamagedLastSegment: a flipped bit in the last segment of one partition makes Open keep that
// partition unavailable instead of failing. Without the index of the segment (a crash) Open's scan
// finds the damage; with it (a clean close) the rebuild of the producer ids does.
func TestDamagedLastSegment(t *testing.T) {
	t.Parallel()
	for _, withIndex := range []bool{false, true} {
		t.Run(map[bool]string{false: "no index", true: "index"}[withIndex], func(t *testing.T) {
			t.Parallel()
			var logs testutil.SyncBuffer
			h := newHarness(t, func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
			setupDamage(t, h)
			h.must(h.e.Close(), "close")
			dir := filepath.Join(h.dir, topicsDir, "bad", "0")
			segs := segmentFiles(t, dir)
			flipInFirstFrame(t, segs[len(segs)-1])
			if !withIndex {
				h.must(os.Remove(strings.TrimSuffix(segs[len(segs)-1], ".seg")+".idx"), "remove index")
			}
			h.open()
			// Logged once at ERROR, with the file and offset as attributes.
			want := fmt.Sprintf(`"topic":"bad","partition":0,"file":%q,"offset":%d,`, segs[len(segs)-1], wlog.SegmentHeaderBytes)
			if n := strings.Count(logs.String(), `"level":"ERROR","msg":"wal: partition damaged`); n != 1 || !strings.Contains(logs.String(), want) {
				t.Fatalf("%d ERROR lines, want one with %s, in:\n%s", n, want, logs.String())
			}
			checkDamaged(t, h)
			h.restart() // still damaged, still opens
			st, err := h.e.TopicStats(h.ctx, "bad")
			h.must(err, "stats")
			equal(t, st.Partitions[0].Damaged, true, "damaged after a restart")
		})
	}
}

// TestDamagedSealedSegment: a flipped bit in a sealed segment. Without its index Open scans it
// and finds the damage; with a valid index Open trusts it and the first read finds it.
func TestDamagedSealedSegment(t *testing.T) {
	t.Parallel()
	for _, withIndex := range []bool{false, true} {
		t.Run(map[bool]string{false: "no index", true: "index"}[withIndex], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.SegmentBytes = 4 << 10 })
			setupDamage(t, h)
			dir := filepath.Join(h.dir, topicsDir, "bad", "0")
			// Fill partition 0 past one segment, then move the clock past the dedup window so
			// that Open does not read the records.
			for range 150 {
				h.publish("bad", storage.AppendMessage{Partition: 0, Payload: []byte("0123456789abcdef")})
			}
			h.must(h.e.Close(), "close")
			segs := segmentFiles(t, dir)
			if len(segs) < 2 {
				t.Fatalf("segments: %v", segs)
			}
			flipInFirstFrame(t, segs[0])
			if !withIndex {
				h.must(os.Remove(strings.TrimSuffix(segs[0], ".seg")+".idx"), "remove index")
			}
			h.clock.Advance(time.Hour)
			h.open()
			if withIndex {
				st, err := h.e.TopicStats(h.ctx, "bad")
				h.must(err, "stats")
				equal(t, st.Partitions[0].Damaged, false, "damaged before a read")
				q := h.queueSub("bad")
				ds := h.claim(q.ID, "m", 100) // meets the damage: partition 0 is skipped from now on
				for _, d := range ds {
					equal(t, d.Partition, 1, "partition of a delivery")
				}
				equal(t, len(ds), 5, "deliveries of partition 1")
			}
			if !withIndex {
				checkDamaged(t, h)
			} else {
				st, err := h.e.TopicStats(h.ctx, "bad")
				h.must(err, "stats")
				equal(t, st.Partitions[0].Damaged, true, "damaged after the read")
				_, err = h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "bad", Partition: 0})
				errIs(t, err, storage.ErrPartitionDamaged, "read")
			}
		})
	}
}

// TestRepairDamagedPartition: VerifyDir finds a flipped bit with its file and offset (and refuses
// to run beside an engine); TruncatePartition shows what it gives up, and with apply cuts the log
// so that the partition works again with the records before the damage, and the subscription
// positions above the new end are clamped.
func TestRepairDamagedPartition(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	setupDamage(t, h)
	q := h.queueSub("bad")
	ds := h.claim(q.ID, "m", 100)
	equal(t, len(ds), 10, "deliveries before the damage")
	h.ack(q.ID, refs(ds)...)

	_, err := VerifyDir(h.dir)
	errIs(t, err, ErrDirInUse, "verify beside an engine")
	_, err = TruncatePartition(h.dir, "bad", 0, true)
	errIs(t, err, ErrDirInUse, "truncate beside an engine")
	h.must(h.e.Close(), "close")
	h.e = nil

	// Damage the third record of bad/0 (every frame has the same size).
	seg := segmentFiles(t, filepath.Join(h.dir, topicsDir, "bad", "0"))[0]
	b, err := os.ReadFile(seg)
	h.must(err, "read segment")
	frame := wlog.FrameBytes(int(binary.LittleEndian.Uint32(b[wlog.SegmentHeaderBytes:])) - 8)
	at := wlog.SegmentHeaderBytes + 2*frame
	b[at+wlog.FrameHeaderBytes+3] ^= 0x01
	h.must(os.WriteFile(seg, b, 0o644), "write segment")
	h.must(os.Remove(strings.TrimSuffix(seg, ".seg")+".idx"), "remove index")

	reports, err := VerifyDir(h.dir)
	h.must(err, "verify")
	var damaged []LogReport
	for _, r := range reports {
		if r.Damage != nil {
			damaged = append(damaged, r)
		}
	}
	if len(reports) != 4 || len(damaged) != 1 || damaged[0].Topic != "bad" || damaged[0].Partition != 0 {
		t.Fatalf("reports %+v, damaged %+v", reports, damaged)
	}
	d := damaged[0].Damage
	if d.Err.Path != seg || d.Err.Offset != at || d.Index != 2 || d.End != 5 || d.Bytes != 3*frame {
		t.Fatalf("damage %v: gives up [%d, %d) %d bytes; want at %d, [2, 5) %d bytes", d.Err, d.Index, d.End, d.Bytes, at, 3*frame)
	}

	d2, err := TruncatePartition(h.dir, "bad", 0, false)
	h.must(err, "truncate without apply")
	equal(t, d2.Index, 2, "first record given up")
	_, err = TruncatePartition(h.dir, "../bad", 0, true)
	errIs(t, err, storage.ErrInvalidArgument, "truncate of a bad topic name")
	_, err = TruncatePartition(h.dir, "bad", 7, true)
	errIs(t, err, storage.ErrInvalidArgument, "truncate of a missing partition")
	d3, err := TruncatePartition(h.dir, "bad", 0, true)
	h.must(err, "truncate")
	equal(t, d3.End, 5, "end of the log given up")
	reports, err = VerifyDir(h.dir)
	h.must(err, "verify after the truncation")
	for _, r := range reports {
		if r.Damage != nil {
			t.Fatalf("damage after the truncation: %+v", r)
		}
	}

	h.open()
	st, err := h.e.TopicStats(h.ctx, "bad")
	h.must(err, "stats")
	equal(t, st.Partitions[0].Damaged, false, "damaged after the repair")
	equal(t, st.Partitions[0].HighWater, 2, "high water after the repair")
	msgs, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "bad", Partition: 0})
	h.must(err, "read")
	equal(t, len(msgs), 2, "messages kept")
	// The queue's cursor (5) was clamped to the new end: the next message is delivered.
	pos := h.publish("bad", storage.AppendMessage{Partition: 0, Payload: []byte("after")})
	equal(t, pos[0].Offset, 2, "offset of the next message")
	ds = h.claim(q.ID, "m", 100)
	if len(ds) != 1 || string(ds[0].Payload) != "after" {
		t.Fatalf("deliveries after the repair: %v", ds)
	}
}

// TestLeaseInDamagedPartitionKept: a lease that expires on its last delivery while its partition
// is damaged cannot be dead-lettered (its message cannot be read): it stays pending, waiting for
// the repair, instead of being dropped.
func TestLeaseInDamagedPartitionKept(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.SegmentBytes = 4 << 10 })
	h.createTopic("t", storage.TopicConfig{Partitions: 2, MaxDeliveries: 1, AckWait: time.Minute})
	for range 150 {
		h.publish("t", storage.AppendMessage{Partition: 0, Payload: []byte("0123456789abcdef")})
	}
	q := h.queueSub("t")
	ds := h.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 3, Partitions: []int32{0}}).Deliveries
	equal(t, len(ds), 3, "leases")
	segs := segmentFiles(t, filepath.Join(h.dir, topicsDir, "t", "0"))
	flipInFirstFrame(t, segs[1]) // not the leased messages' segment
	infos := h.e.topics["t"].parts[0].log.Segments()
	_, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "t", Partition: 0, Offset: infos[1].BaseIndex})
	errIs(t, err, storage.ErrPartitionDamaged, "read of the damage")

	h.clock.Advance(2 * time.Minute)
	equal(t, len(h.claim(q.ID, "m", 10)), 0, "deliveries once partition 0 is damaged")
	st := h.stats(q.ID)
	equal(t, st.DeadLettered, 0, "dead-lettered")
	equal(t, st.Redelivering, 3, "kept waiting")
	equal(t, st.InFlight, 0, "in flight")
}

// leasesAcrossDamage makes topic t with 2 partitions (cfg) and a subscription whose member m
// holds 3 leases in partition 0 and 1 in partition 1, then damages partition 0 past the leased
// messages (found by a read). It returns the harness, the subscription and the 4 deliveries.
func leasesAcrossDamage(t *testing.T, cfg storage.TopicConfig) (*harness, *storage.Subscription, []*storage.Delivery) {
	t.Helper()
	h := newHarness(t, func(c *Config) { c.SegmentBytes = 4 << 10 })
	cfg.Partitions = 2
	h.createTopic("t", cfg)
	for range 150 {
		h.publish("t", storage.AppendMessage{Partition: 0, Payload: []byte("0123456789abcdef")})
	}
	h.publish("t", storage.AppendMessage{Partition: 1, Payload: []byte("fine")})
	q := h.queueSub("t")
	ds := h.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 3, Partitions: []int32{0}}).Deliveries
	equal(t, len(ds), 3, "leases in partition 0")
	ds = append(ds, h.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1, Partitions: []int32{1}}).Deliveries...)
	equal(t, len(ds), 4, "leases in both partitions")
	segs := segmentFiles(t, filepath.Join(h.dir, topicsDir, "t", "0"))
	flipInFirstFrame(t, segs[1]) // not the leased messages' segment
	infos := h.e.topics["t"].parts[0].log.Segments()
	_, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "t", Partition: 0, Offset: infos[1].BaseIndex})
	errIs(t, err, storage.ErrPartitionDamaged, "read of the damage")
	return h, q, ds
}

// TestReleaseInDamagedPartitionKept: a member that leaves with leases on their last delivery
// dead-letters those it can; one whose partition is damaged stays pending and is not counted in
// DeadLettered (the broker reports that count as dead-lettered messages).
func TestReleaseInDamagedPartitionKept(t *testing.T) {
	t.Parallel()
	h, q, _ := leasesAcrossDamage(t, storage.TopicConfig{MaxDeliveries: 1, AckWait: time.Minute})
	res, err := h.e.DeliveriesRelease(h.ctx, &storage.DeliveriesReleaseParams{SubscriptionID: q.ID, Member: "m"})
	h.must(err, "release")
	equal(t, res.DeadLettered, 1, "DeadLettered of the release")
	equal(t, res.Released, 0, "Released of the release")
	st := h.stats(q.ID)
	equal(t, st.DeadLettered, 1, "DLQ entries")
	equal(t, st.Redelivering, 3, "kept waiting")
	equal(t, st.InFlight, 0, "in flight")
}

// TestNackInDamagedPartitionKept: a nack to the DLQ of leases whose partition is damaged keeps
// them waiting and does not count them in DeadLettered; the lease in a healthy partition is
// counted.
func TestNackInDamagedPartitionKept(t *testing.T) {
	t.Parallel()
	h, q, ds := leasesAcrossDamage(t, storage.TopicConfig{AckWait: time.Minute})
	res, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m", Refs: refs(ds), ToDLQ: true, Reason: "bad"})
	h.must(err, "nack to the DLQ")
	equal(t, res.DeadLettered, 1, "DeadLettered of the nack")
	st := h.stats(q.ID)
	equal(t, st.DeadLettered, 1, "DLQ entries")
	equal(t, st.Redelivering, 3, "kept waiting")
}

// TestRedeliveryFindsDamage: a redelivery whose read finds the damage leaves the message
// pending (not dropped) with its attempt count, and partition 0 is damaged from then on.
func TestRedeliveryFindsDamage(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("t", storage.TopicConfig{Partitions: 2})
	for range 3 {
		h.publish("t", storage.AppendMessage{Partition: 0, Payload: []byte("0123456789abcdef")})
	}
	q := h.queueSub("t")
	ds := h.claim(q.ID, "m", 10)
	equal(t, len(ds), 3, "deliveries")
	_, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m", Refs: refs(ds)})
	h.must(err, "nack")
	flipInFirstFrame(t, segmentFiles(t, filepath.Join(h.dir, topicsDir, "t", "0"))[0])

	equal(t, len(h.claim(q.ID, "m", 10)), 0, "redeliveries of the damaged messages")
	st := h.stats(q.ID)
	equal(t, st.Redelivering, 3, "waiting")
	equal(t, st.InFlight, 0, "in flight")
	ts, err := h.e.TopicStats(h.ctx, "t")
	h.must(err, "stats")
	equal(t, ts.Partitions[0].Damaged, true, "damaged")
}

// TestSubscribeWithDamagedPartition: subscriptions can be created on a topic with a damaged
// partition; there they start from the beginning, or (from now) from the end the partition has
// after the repair. A start at a message of the damaged partition is refused.
func TestSubscribeWithDamagedPartition(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("t", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	for range 5 {
		h.publish("t", storage.AppendMessage{Partition: 0, Payload: []byte("0123456789abcdef")})
	}
	h.must(h.e.Close(), "close")
	seg := segmentFiles(t, filepath.Join(h.dir, topicsDir, "t", "0"))[0]
	b, err := os.ReadFile(seg)
	h.must(err, "read segment")
	frame := wlog.FrameBytes(int(binary.LittleEndian.Uint32(b[wlog.SegmentHeaderBytes:])) - 8)
	b[wlog.SegmentHeaderBytes+2*frame+wlog.FrameHeaderBytes+3] ^= 0x01 // the third message
	h.must(os.WriteFile(seg, b, 0o644), "write segment")
	h.must(os.Remove(strings.TrimSuffix(seg, ".seg")+".idx"), "remove index")
	h.open()

	now := h.subscribe("t", "now", storage.StartPosition{Kind: storage.FromNow})
	begin := h.subscribe("t", "begin", storage.StartPosition{Kind: storage.FromBeginning})
	_, err = h.e.SubscriptionCreate(h.ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "at",
		Start: storage.StartPosition{Kind: storage.FromMessageID, Partition: 0, Offset: 1}})
	errIs(t, err, storage.ErrPartitionDamaged, "start at a message of the damaged partition")
	h.publish("t", storage.AppendMessage{Partition: 1, Payload: []byte("p1")})
	for _, s := range []*storage.Subscription{now, begin} {
		ds := h.claim(s.ID, "m", 10)
		if len(ds) != 1 || string(ds[0].Payload) != "p1" {
			t.Fatalf("%s: deliveries %v", s.Group, ds)
		}
		h.ack(s.ID, refs(ds)...)
		equal(t, h.stats(s.ID).Pending, 0, s.Group+" pending")
	}
	h.restart() // still damaged: the starts are kept as they are

	h.must(h.e.Close(), "close")
	h.e = nil
	d, err := TruncatePartition(h.dir, "t", 0, true)
	h.must(err, "truncate")
	equal(t, d.Index, 2, "new end")
	h.open()
	h.publish("t", storage.AppendMessage{Partition: 0, Payload: []byte("new")})
	got := map[string][]string{}
	for _, s := range []*storage.Subscription{now, begin} {
		for _, d := range h.claim(s.ID, "m", 10) {
			got[s.Group] = append(got[s.Group], fmt.Sprintf("%d:%d:%s", d.Partition, d.Offset, d.Payload))
		}
	}
	equal(t, strings.Join(got["now"], " "), "0:2:new", "deliveries from now")
	equal(t, strings.Join(got["begin"], " "), "0:0:0123456789abcdef 0:1:0123456789abcdef 0:2:new", "deliveries from the beginning")
}

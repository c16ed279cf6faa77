package wal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
	"github.com/spoolmq/spool/internal/testutil"
)

// eventually polls cond until it holds (testutil.Eventually, 10 s bound).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, what, func() error {
		if cond() {
			return nil
		}
		return errors.New("condition not met")
	})
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cfg   Config
		field string
	}{
		{Config{Sync: 7}, "Sync"},
		{Config{SegmentBytes: 100}, "SegmentBytes"},
		{Config{SegmentBytes: 4 << 30}, "SegmentBytes"},
		{Config{FirstSegmentBytes: -1}, "FirstSegmentBytes"},
		{Config{SegmentBytes: 1 << 20, FirstSegmentBytes: 2 << 20}, "FirstSegmentBytes"},
		{Config{StateLogSnapshotBytes: -1}, "StateLogSnapshotBytes"},
		{Config{MaxProducerIDs: -1}, "MaxProducerIDs"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		errIs(t, err, storage.ErrInvalidArgument, c.field)
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("error %q does not name %s", err, c.field)
		}
		if _, err := Open(t.TempDir(), c.cfg); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("Open with bad %s: %v", c.field, err)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
}

func TestDirectoryLock(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	if _, err := Open(h.dir, Config{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open of a directory: %v", err)
	}
	h.restart() // the lock is released by Close
}

func TestClosedEngine(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("t", storage.TopicConfig{})
	q := h.queueSub("t")
	h.must(h.e.Close(), "close")
	h.must(h.e.Close(), "second close")
	ctx := h.ctx
	_, err := h.e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "u"})
	errIs(t, err, storage.ErrClosed, "TopicCreate")
	_, err = h.e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "t", Messages: []storage.AppendMessage{{Partition: -1}}})
	errIs(t, err, storage.ErrClosed, "MessagesAppend")
	_, err = h.e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1})
	errIs(t, err, storage.ErrClosed, "DeliveriesClaim")
	_, err = h.e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID})
	errIs(t, err, storage.ErrClosed, "DeliveriesAck")
	_, err = h.e.TopicList(ctx)
	errIs(t, err, storage.ErrClosed, "TopicList")
	_, err = h.e.RetentionApply(ctx)
	errIs(t, err, storage.ErrClosed, "RetentionApply")
	_, err = h.e.SubscriptionStats(ctx, q.ID)
	errIs(t, err, storage.ErrClosed, "SubscriptionStats")
	h.e = nil
}

// TestStateLogCompaction: the state log is snapshotted and compacted once it passes
// StateLogSnapshotBytes, so its size stays bounded, and the state survives.
func TestStateLogCompaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.StateLogSnapshotBytes = 8 << 10; c.SegmentBytes = 16 << 10 })
	h.createTopic("t", storage.TopicConfig{Partitions: 2})
	q := h.queueSub("t")
	for range 100 {
		h.publishN("t", 20)
		ds := h.claim(q.ID, "m", 20)
		// Ack out of order, one at a time: many small records.
		for i := len(ds) - 1; i >= 0; i-- {
			h.ack(q.ID, ds[i].Ref())
		}
	}
	eventually(t, "a snapshot and a compacted state log", func() bool {
		files, _ := filepath.Glob(filepath.Join(h.dir, "snapshot-*.bin"))
		return len(files) == 1 && h.e.state.FirstIndex() > 0
	})
	var bytes int64
	for _, s := range h.e.state.Segments() {
		bytes += s.Bytes
	}
	if bytes > 64<<10 {
		t.Fatalf("state log holds %d bytes after compaction", bytes)
	}
	want := projectCrashed(h.e)
	h.crash()
	diffProjection(t, want, project(h.e))
	st := h.stats(q.ID)
	equal(t, st.Pending, 0, "pending")
}

// TestSnapshotCorruptionIsReported: a damaged snapshot whose state log was compacted cannot be
// replaced by a full replay: Open fails with storage.ErrCorrupt instead of starting empty.
func TestSnapshotCorruptionIsReported(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.SegmentBytes = 4 << 10 })
	h.createTopic("t", storage.TopicConfig{})
	for range 50 {
		h.publishN("t", 1)
		h.must(h.e.snapshot(false), "snapshot")
	}
	h.must(h.e.Close(), "close")
	files, _ := filepath.Glob(filepath.Join(h.dir, "snapshot-*.bin"))
	if len(files) != 1 {
		t.Fatalf("snapshots: %v", files)
	}
	b, err := os.ReadFile(files[0])
	h.must(err, "read snapshot")
	b[len(b)/2] ^= 0xff
	h.must(os.WriteFile(files[0], b, 0o644), "write snapshot")
	_, err = Open(h.dir, h.cfg)
	errIs(t, err, storage.ErrCorrupt, "open with a corrupt snapshot")
	h.e = nil
}

// TestCrashLeftovers: directories of a topic whose creation was not recorded, and of a topic whose
// deletion was recorded but not carried out, are removed at Open.
func TestCrashLeftovers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("keep", storage.TopicConfig{})
	h.publishN("keep", 3)
	h.must(h.e.Close(), "close")
	orphan := filepath.Join(h.dir, topicsDir, "orphan", "0")
	h.must(os.MkdirAll(orphan, 0o755), "mkdir")
	h.must(os.WriteFile(filepath.Join(orphan, "junk"), []byte("x"), 0o644), "write")
	h.must(os.MkdirAll(filepath.Join(h.dir, topicsDir, "keep", "7"), 0o755), "mkdir partition")
	h.open()
	if _, err := os.Stat(filepath.Join(h.dir, topicsDir, "orphan")); !os.IsNotExist(err) {
		t.Fatalf("orphan topic directory still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.dir, topicsDir, "keep", "7")); !os.IsNotExist(err) {
		t.Fatalf("orphan partition directory still there: %v", err)
	}
	ms, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "keep"})
	h.must(err, "read")
	equal(t, len(ms), 3, "messages kept")
}

// TestTopicDeleteFreesSegmentsInSteps: a deleted topic's segments are freed a few MiB at a time
// (wlog.RemoveFile), not in one unlink each, which on a file system mounted with online discard
// stalls every other log's fdatasync while the disk discards the whole file.
func TestTopicDeleteFreesSegmentsInSteps(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	h := newHarness(t, func(c *Config) { c.FS = efs; c.SegmentBytes, c.FirstSegmentBytes = 16<<20, 16<<20 })
	h.createTopic("big", storage.TopicConfig{Partitions: 2})
	h.publishN("big", 10)
	before := efs.Count(wlogtest.OpTruncate)
	h.must(h.e.TopicDelete(h.ctx, &storage.TopicDeleteParams{Name: "big", Force: true}), "delete")
	if _, err := os.Stat(filepath.Join(h.dir, topicsDir, "big")); !os.IsNotExist(err) {
		t.Fatalf("topic directory still there: %v", err)
	}
	waitTrashEmpty(t, h.dir)
	// Two preallocated 16 MiB segments, freed 4 MiB at a time: 3 truncations each.
	if n := efs.Count(wlogtest.OpTruncate) - before; n < 6 {
		t.Fatalf("%d truncations while deleting two 16 MiB segments, want at least 6 (freed in steps)", n)
	}
}

// waitTrashEmpty waits until the trash loop removed everything moved into trash/.
func waitTrashEmpty(t *testing.T, dir string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "the trash emptied", func() error {
		ents, err := os.ReadDir(filepath.Join(dir, trashDir))
		if err != nil || len(ents) > 0 {
			return fmt.Errorf("trash: %d entries (%v)", len(ents), err)
		}
		return nil
	})
}

// TestTopicDeleteDoesNotWaitForFreeing: TopicDelete returns once the deletion is durable and the
// directory moved aside, while its segments are still being freed; a topic of the same name can
// be created and used at once; Close stops the freeing between files, and the next Open finishes
// it.
func TestTopicDeleteDoesNotWaitForFreeing(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var blocked atomic.Int32
	efs := wlogtest.NewErrorFS(nil, func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpTruncate && strings.Contains(path, string(filepath.Separator)+trashDir+string(filepath.Separator)) {
			blocked.Add(1)
			<-release
		}
		return nil
	})
	h := newHarness(t, func(c *Config) { c.FS = efs; c.SegmentBytes, c.FirstSegmentBytes = 16<<20, 16<<20 })
	h.createTopic("big", storage.TopicConfig{Partitions: 2})
	h.publishN("big", 10)
	done := make(chan error, 1)
	go func() { done <- h.e.TopicDelete(h.ctx, &storage.TopicDeleteParams{Name: "big", Force: true}) }()
	select {
	case err := <-done:
		h.must(err, "delete")
	case <-time.After(10 * time.Second):
		t.Fatal("TopicDelete waits for its segments to be freed")
	}
	testutil.Eventually(t, 10*time.Second, "the freeing started", func() error {
		if blocked.Load() == 0 {
			return errors.New("no truncation in the trash yet")
		}
		return nil
	})
	h.createTopic("big", storage.TopicConfig{})
	h.publishN("big", 3)
	ms, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "big"})
	h.must(err, "read")
	equal(t, len(ms), 3, "messages of the new topic")

	closed := make(chan error, 1)
	go func() { closed <- h.e.Close() }()
	<-h.e.quit // Close has begun: the freeing stops after the file it is blocked in
	releaseOnce.Do(func() { close(release) })
	h.must(<-closed, "close")
	if ents, _ := os.ReadDir(filepath.Join(h.dir, trashDir)); len(ents) == 0 {
		t.Fatal("the trash is empty after Close stopped the freeing (want the rest left for the next Open)")
	}
	h.open()
	waitTrashEmpty(t, h.dir)
	ms, err = h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "big"})
	h.must(err, "read after reopen")
	equal(t, len(ms), 3, "messages of the new topic after reopen")
}

// TestTopicDeleteRemovesFiles and re-creation starts empty.
func TestTopicDeleteRemovesFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("gone", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	s := h.subscribe("gone", "g", storage.StartPosition{})
	h.publishN("gone", 10)
	err := h.e.TopicDelete(h.ctx, &storage.TopicDeleteParams{Name: "gone"})
	errIs(t, err, storage.ErrTopicHasSubscriptions, "delete with a live group")
	var notes []storage.Notification
	var mu sync.Mutex
	unreg := h.e.NotifyRegister(func(n storage.Notification) { mu.Lock(); notes = append(notes, n); mu.Unlock() })
	defer unreg()
	h.must(h.e.TopicDelete(h.ctx, &storage.TopicDeleteParams{Name: "gone", Force: true}), "forced delete")
	if _, err := os.Stat(filepath.Join(h.dir, topicsDir, "gone")); !os.IsNotExist(err) {
		t.Fatalf("topic directory still there: %v", err)
	}
	_, err = h.e.SubscriptionGet(h.ctx, s.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "subscription of a deleted topic")
	list, err := h.e.SubscriptionList(h.ctx, &storage.SubscriptionListParams{Topic: "gone", IncludeDeleted: true})
	h.must(err, "list")
	equal(t, len(list), 1, "deleted subscription listed")
	equal(t, list[0].State, storage.Deleted, "state")
	h.createTopic("gone", storage.TopicConfig{})
	h.restart()
	st, err := h.e.TopicStats(h.ctx, "gone")
	h.must(err, "stats")
	equal(t, st.Messages, 0, "recreated topic is empty")
	mu.Lock()
	equal(t, len(notes), 2, "notifications")
	equal(t, notes[0].Kind, storage.NotifyTopicDeleted, "first kind")
	equal(t, notes[1].Kind, storage.NotifyTopicCreated, "second kind")
	mu.Unlock()
}

// TestEphemeralSubscriptionsAreNotPersisted, and their IDs are not reused after a restart.
func TestEphemeralSubscriptionsAreNotPersisted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("fan", storage.TopicConfig{Semantics: storage.PubSub})
	eph, err := h.e.SubscriptionCreate(h.ctx, &storage.SubscriptionCreateParams{Topic: "fan", Ephemeral: true})
	h.must(err, "ephemeral")
	h.publishN("fan", 2)
	ds := h.claim(eph.ID, "m", 10)
	equal(t, len(ds), 2, "ephemeral deliveries")
	h.ack(eph.ID, refs(ds)...)
	h.crash()
	_, err = h.e.SubscriptionGet(h.ctx, eph.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "ephemeral after restart")
	s := h.subscribe("fan", "durable", storage.StartPosition{})
	if s.ID <= eph.ID {
		t.Fatalf("subscription ID %d reused after ephemeral %d", s.ID, eph.ID)
	}
}

// TestRetentionTrimsFiles: whole segments go once completed and old enough; a quiet active
// segment is sealed once what it holds may go; a PAUSED subscription holds retention until
// max_retention, which counts what it removes and advances the floor.
func TestRetentionTrimsFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.SegmentBytes = 4 << 10 })
	cfg := storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Hour, MaxRetention: 48 * time.Hour}
	h.createTopic("r", cfg)
	done := h.subscribe("r", "done", storage.StartPosition{})
	slow := h.subscribe("r", "slow", storage.StartPosition{})
	payload := strings.Repeat("p", 400)
	for range 40 {
		h.publish("r", storage.AppendMessage{Partition: -1, Payload: []byte(payload)})
	}
	h.ack(done.ID, refs(h.claimAll(done.ID, "m"))...)
	h.clock.Advance(2 * time.Hour)
	res, err := h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, res.MessagesDeleted+res.MessagesExpired, 0, "the slow group holds everything")

	// Pausing keeps holding; cancelling releases.
	_, err = h.e.SubscriptionUpdate(h.ctx, &storage.SubscriptionUpdateParams{ID: slow.ID, State: storage.Paused})
	h.must(err, "pause")
	res, err = h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, res.MessagesDeleted+res.MessagesExpired, 0, "a paused group holds everything")

	h.clock.Advance(47 * time.Hour)
	res, err = h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, res.MessagesExpired, 40, "max_retention removes what the paused group had not completed")
	equal(t, res.MessagesDeleted, 0, "deleted")
	if res.BytesDeleted < 40*400 {
		t.Fatalf("bytes deleted %d", res.BytesDeleted)
	}
	st, err := h.e.TopicStats(h.ctx, "r")
	h.must(err, "stats")
	equal(t, st.Partitions[0].LowOffset, 40, "low offset")
	equal(t, st.Messages, 0, "messages")
	equal(t, h.stats(slow.ID).Partitions[0].AckFloor, 40, "slow floor force-advanced")
	h.crash()
	equal(t, h.stats(slow.ID).Partitions[0].AckFloor, 40, "slow floor after restart")

	// A quiet topic whose messages are all completed: the active segment is cut once they are
	// older than message_retention.
	for range 5 {
		h.publish("r", storage.AppendMessage{Partition: -1, Payload: []byte(payload)})
	}
	_, err = h.e.SubscriptionUpdate(h.ctx, &storage.SubscriptionUpdateParams{ID: slow.ID, State: storage.Cancelled})
	h.must(err, "cancel")
	h.ack(done.ID, refs(h.claimAll(done.ID, "m"))...)
	h.clock.Advance(30 * time.Minute)
	res, err = h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, res.MessagesDeleted, 0, "younger than message_retention")
	h.clock.Advance(time.Hour)
	res, err = h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, res.MessagesDeleted, 5, "quiet active segment cut and deleted")
	equal(t, res.MessagesExpired, 0, "expired")
	h.publishN("r", 1)
	ms, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "r"})
	h.must(err, "read")
	equal(t, len(ms), 1, "new message after the cut")
	equal(t, ms[0].Offset, 45, "offset continues")
}

// TestZeroSubscriptionRetention: a PUB_SUB topic without subscriptions keeps messages for
// zero_subscription_retention.
func TestZeroSubscriptionRetention(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.SegmentBytes = 4 << 10 })
	h.createTopic("z", storage.TopicConfig{Semantics: storage.PubSub, ZeroSubscriptionRetention: time.Hour})
	h.publishN("z", 30)
	h.clock.Advance(59 * time.Minute)
	res, err := h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, res.MessagesDeleted, 0, "before zero_subscription_retention")
	h.clock.Advance(2 * time.Minute)
	res, err = h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, res.MessagesDeleted, 30, "after zero_subscription_retention")
}

// TestWriteFailureIsSticky: after a failed fsync the engine refuses changes (STYLE C9) and a
// reopen recovers what was durable.
func TestWriteFailureIsSticky(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	h := newHarness(t, func(c *Config) { c.FS = efs })
	h.createTopic("t", storage.TopicConfig{})
	q := h.queueSub("t")
	h.publishN("t", 3)
	ds := h.claim(q.ID, "m", 3)
	h.ack(q.ID, ds[0].Ref())
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpSync && strings.Contains(path, string(filepath.Separator)+stateDir+string(filepath.Separator)) {
			return wlogtest.ErrInjected
		}
		return nil
	})
	_, err := h.e.DeliveriesAck(h.ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID, Refs: []storage.DeliveryRef{ds[1].Ref()}})
	errIs(t, err, wlogtest.ErrInjected, "ack whose fsync fails")
	_, err = h.e.MessagesAppend(h.ctx, &storage.MessagesAppendParams{Topic: "t", Messages: []storage.AppendMessage{{Partition: -1}}})
	errIs(t, err, wlogtest.ErrInjected, "publish after the failure")
	_, err = h.e.TopicCreate(h.ctx, &storage.TopicCreateParams{Name: "u"})
	errIs(t, err, wlogtest.ErrInjected, "topic create after the failure")
	h.e.Close()
	efs.SetInjector(nil)
	h.cfg.FS = wlog.OSFS()
	h.open()
	got := h.claimAll(q.ID, "m")
	if len(got) < 1 || len(got) > 2 {
		t.Fatalf("after reopen: %d deliveries, want the unacked message and maybe the one whose ack failed", len(got))
	}
	for _, d := range got {
		if d.Offset == 0 {
			t.Fatal("durably acked message delivered again")
		}
	}
}

// TestFanOutConcurrency publishes from several goroutines while members of 16 groups claim and ack
// concurrently; every group gets every message exactly once (no lease expires: the clock is fixed).
func TestFanOutConcurrency(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const groups, members, publishers, perPublisher, batch = 16, 2, 4, 100, 5
	h.createTopic("fan", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 4})
	subs := make([]*storage.Subscription, groups)
	for i := range subs {
		subs[i] = h.subscribe("fan", "g"+string(rune('a'+i)), storage.StartPosition{})
	}
	wake := make(chan struct{}, 1)
	defer h.e.NotifyRegister(func(storage.Notification) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})()
	total := publishers * perPublisher
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for p := range publishers {
		wg.Go(func() {
			for i := 0; i < perPublisher; i += batch {
				msgs := make([]storage.AppendMessage, batch)
				for j := range msgs {
					msgs[j] = storage.AppendMessage{Partition: -1, Key: []byte{byte(p), byte(i + j)}, Payload: []byte("x")}
				}
				if _, err := h.e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "fan", Messages: msgs}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var mu sync.Mutex
	seen := make([]map[storage.DeliveryRef]int, groups)
	for g := range seen {
		seen[g] = map[storage.DeliveryRef]int{}
	}
	for g := range groups {
		for m := range members {
			wg.Go(func() {
				member := "m" + string(rune('0'+m))
				for {
					mu.Lock()
					n := len(seen[g])
					mu.Unlock()
					if n >= total {
						return
					}
					res, err := h.e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: subs[g].ID, Member: member, Max: 16})
					if err != nil {
						errs <- err
						return
					}
					if len(res.Deliveries) == 0 {
						select {
						case <-wake:
						case <-time.After(5 * time.Millisecond):
						case <-ctx.Done():
							errs <- ctx.Err()
							return
						}
						continue
					}
					mu.Lock()
					for _, d := range res.Deliveries {
						seen[g][d.Ref()]++
					}
					mu.Unlock()
					if _, err := h.e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: subs[g].ID, Member: member, Refs: refs(res.Deliveries)}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for g := range groups {
		equal(t, len(seen[g]), total, "messages seen by group")
		for ref, n := range seen[g] {
			if n != 1 {
				t.Fatalf("group %d got %v %d times", g, ref, n)
			}
		}
		equal(t, h.stats(subs[g].ID).Pending, 0, "pending")
	}
}

// TestUnsafeNoSync works like SyncAlways across a clean restart; OnSync sees the rounds.
func TestUnsafeNoSync(t *testing.T) {
	t.Parallel()
	var records atomic.Int64
	h := newHarness(t, func(c *Config) {
		c.Sync = UnsafeNoSync
		c.OnSync = func(_ time.Duration, recs, _ int) { records.Add(int64(recs)) }
	})
	h.createTopic("t", storage.TopicConfig{})
	q := h.queueSub("t")
	h.publishN("t", 5)
	h.ack(q.ID, refs(h.claim(q.ID, "m", 2))...)
	h.restart()
	equal(t, len(h.claimAll(q.ID, "m")), 3, "unacked after restart")
	if records.Load() < 5 {
		t.Fatalf("OnSync saw %d records", records.Load())
	}
}

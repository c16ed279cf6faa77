package wal

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
)

// segments returns the segments of partition 0 of topic and the number of segment files in its
// directory.
func (h *harness) segments(topic string) ([]wlog.SegmentInfo, int) {
	h.t.Helper()
	h.e.mu.RLock()
	p := h.e.topics[topic].parts[0]
	h.e.mu.RUnlock()
	ents, err := os.ReadDir(p.dir)
	h.must(err, "read dir")
	files := 0
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".seg" {
			files++
		}
	}
	return p.log.Segments(), files
}

// TestRetentionSealsOnlyWhatItFrees: with a 3 s message_retention the active segment is sealed
// at a run only when its oldest message may go, never when nothing could be removed (an idle
// topic, an empty segment, messages a subscription has not completed): a partition rolls at most
// once per run and keeps at most one sealed segment waiting, so short retention neither makes
// publishes roll segments nor leaves a trail of preallocated files.
func TestRetentionSealsOnlyWhatItFrees(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("idle", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: 3 * time.Second, ZeroSubscriptionRetention: 3 * time.Second})
	h.createTopic("held", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: 3 * time.Second})
	s := h.subscribe("held", "s", storage.StartPosition{})
	h.publishN("held", 10)
	run := func() *storage.RetentionResult {
		t.Helper()
		res, err := h.e.RetentionApply(h.ctx)
		h.must(err, "retention")
		return res
	}
	one := func(topic, what string) {
		t.Helper()
		segs, files := h.segments(topic)
		equal(t, len(segs), 1, what+": segments")
		equal(t, files, 1, what+": segment files")
	}
	for range 5 {
		h.clock.Advance(10 * time.Second)
		equal(t, run().MessagesDeleted, 0, "nothing completed")
		one("idle", "an idle topic")
		one("held", "messages s has not completed")
	}

	// Completed: one run seals and deletes the whole active segment; later runs leave the new,
	// empty one alone.
	h.ack(s.ID, refs(h.claimAll(s.ID, "m"))...)
	equal(t, run().MessagesDeleted, 10, "completed and older than 3s")
	for range 5 {
		h.clock.Advance(10 * time.Second)
		equal(t, run().MessagesDeleted, 0, "nothing left")
		one("held", "an empty active segment")
	}

	// Busy: a message a second, acked at once, retention every second. A segment is sealed only
	// once its oldest message is older than 3s, at most one sealed segment waits for its newest
	// to age, and everything older than 3s plus one run's worth goes.
	var deleted, cuts int64
	var lastBase int64 = -1
	for i := range 60 {
		h.clock.Advance(time.Second)
		h.publishN("held", 1)
		h.ack(s.ID, refs(h.claimAll(s.ID, "m"))...)
		deleted += run().MessagesDeleted
		segs, files := h.segments("held")
		if len(segs) > 2 || files != len(segs) {
			t.Fatalf("second %d: %d segments, %d files: at most the active one and one sealed one waiting", i, len(segs), files)
		}
		if base := segs[len(segs)-1].BaseIndex; base != lastBase {
			cuts++
			lastBase = base
		}
		// Offset 10+j was published at second j. A segment is sealed at the first run its oldest
		// is older than 3s (so it holds at most 5 seconds) and deleted at the first run its
		// newest is: nothing published more than 10 s ago is left.
		if want := int64(10 + i - 10); segs[0].BaseIndex < want {
			t.Fatalf("second %d: first retained offset %d, want at least %d", i, segs[0].BaseIndex, want)
		}
	}
	if cuts > 60/4+1 {
		t.Fatalf("%d cuts in 60 runs: a segment is sealed only once its oldest message is older than 3s", cuts)
	}
	if deleted < 50 {
		t.Fatalf("deleted %d of 60 messages acked over 60 s with a 3s retention", deleted)
	}
	t.Logf("60 runs: %d cuts, %d deleted", cuts, deleted)
}

// TestZombieFloorSurvivesCrash: a floor zombie_ttl force-advanced is recorded in the state log
// before the run returns, so a crash (no final snapshot) keeps it, and the given-up messages are
// not delivered again.
func TestZombieFloorSurvivesCrash(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("z", storage.TopicConfig{Semantics: storage.PubSub, ZombieTTL: time.Hour})
	s := h.subscribe("z", "s", storage.StartPosition{Kind: storage.FromBeginning})
	h.publishN("z", 5)
	run := func() *storage.RetentionResult {
		t.Helper()
		res, err := h.e.RetentionApply(h.ctx)
		h.must(err, "retention")
		return res
	}
	equal(t, len(run().Zombies), 0, "first seen")
	h.clock.Advance(time.Hour + time.Second)
	h.publishN("z", 2)
	res := run()
	equal(t, len(res.Zombies), 1, "zombies")
	equal(t, res.Zombies[0].Messages, int64(5), "given up")
	h.crash()
	equal(t, h.stats(s.ID).Partitions[0].AckFloor, int64(5), "floor after a crash")
	ds := h.claim(s.ID, "m", 10)
	equal(t, len(ds), 2, "claimed after a crash")
	equal(t, ds[0].Offset, int64(5), "first claimed")
}

// TestZombieTTLZeroMeansDefault: a stored topic config without zombie_ttl (0: written before it
// existed, or by hand) means the default (7 days), not a zero TTL that force-advances every
// floor at the next retention run.
func TestZombieTTLZeroMeansDefault(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("z0", storage.TopicConfig{Semantics: storage.PubSub})
	h.e.mu.Lock()
	h.e.topics["z0"].meta.Config.ZombieTTL = 0
	h.e.mu.Unlock()
	s := h.subscribe("z0", "s", storage.StartPosition{Kind: storage.FromBeginning})
	h.publishN("z0", 5)
	res, err := h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, len(res.Zombies), 0, "zombies at first sight")
	h.clock.Advance(time.Minute)
	h.publishN("z0", 2)
	res, err = h.e.RetentionApply(h.ctx)
	h.must(err, "retention")
	equal(t, len(res.Zombies), 0, "zombies a minute later")
	equal(t, h.stats(s.ID).Partitions[0].AckFloor, int64(0), "floor")
}

// TestRetentionBacklog: RetentionResult.Backlog is what a run found removable and left in the
// log. A partition whose active segment cannot be sealed (no new segment file can be opened)
// keeps its expired messages: the backlog counts them and grows with what production adds;
// once files open again the next run removes them all and the backlog is 0. A segment whose
// file removal fails is out of the log all the same: removed, counted, not in the backlog.
func TestRetentionBacklog(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	h := newHarness(t, func(c *Config) { c.FS = efs })
	h.createTopic("bl", storage.TopicConfig{Semantics: storage.PubSub, ZeroSubscriptionRetention: 3 * time.Second})
	h.e.mu.RLock()
	dir := h.e.topics["bl"].parts[0].dir + string(filepath.Separator)
	h.e.mu.RUnlock()
	inDir := func(ops ...wlogtest.Op) wlogtest.Injector {
		return func(op wlogtest.Op, path string) error {
			if slices.Contains(ops, op) && strings.HasPrefix(path, dir) {
				return wlogtest.ErrInjected
			}
			return nil
		}
	}
	run := func() *storage.RetentionResult {
		t.Helper()
		res, err := h.e.RetentionApply(h.ctx)
		h.must(err, "retention")
		return res
	}

	h.publishN("bl", 10)
	h.clock.Advance(4 * time.Second)
	equal(t, run().Backlog, 0, "nothing removable is left after a healthy run")

	efs.SetInjector(inDir(wlogtest.OpOpen))
	h.publishN("bl", 10)
	h.clock.Advance(4 * time.Second)
	res := run()
	equal(t, res.MessagesDeleted, 0, "deleted while the segment cannot be sealed")
	equal(t, res.Backlog, 10, "backlog: the expired messages of the segment that could not be sealed")
	h.publishN("bl", 5)
	h.clock.Advance(4 * time.Second)
	equal(t, run().Backlog, 15, "backlog after production went on")

	efs.SetInjector(nil)
	res = run()
	equal(t, res.MessagesDeleted, 15, "deleted once the segment can be sealed")
	equal(t, res.Backlog, 0, "backlog after the removal")

	// Sealed by a run (its oldest messages may go, not its newest), then removed by the next.
	h.publishN("bl", 5)
	h.clock.Advance(2 * time.Second)
	h.publishN("bl", 1)
	h.clock.Advance(2 * time.Second)
	equal(t, run().MessagesDeleted, 0, "deleted with the newest message 2s old")
	h.clock.Advance(2 * time.Second)
	efs.SetInjector(inDir(wlogtest.OpRemove, wlogtest.OpRename))
	res = run()
	efs.SetInjector(nil)
	equal(t, res.MessagesDeleted, 6, "deleted though the file removal failed (the records left the log)")
	equal(t, res.Backlog, 0, "backlog after a removal whose file stayed")
	msgs, err := h.e.MessagesRead(h.ctx, &storage.MessagesReadParams{Topic: "bl", Partition: 0, Limit: 100})
	h.must(err, "read")
	equal(t, len(msgs), 0, "messages readable")
}

package wal

import (
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestSnapshotEncodesWithoutEngineLock checks that a snapshot is encoded with Engine.mu released
// (encoding a DLQ of a million entries takes hundreds of milliseconds, during which every
// operation would wait), and that a change made while it is encoded is not in it but replayed
// from the state log after it.
func TestSnapshotEncodesWithoutEngineLock(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("q", storage.TopicConfig{Partitions: 1})
	q := h.queueSub("q")
	h.publishN("q", 50)
	ds := h.claim(q.ID, "m", 50)
	_, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m", Refs: refs(ds), ToDLQ: true})
	h.must(err, "nack to DLQ")
	equal(t, h.stats(q.ID).DeadLettered, 50, "dead-lettered")

	calls := 0
	h.e.snapshotEncodeHook = func() {
		calls++
		if calls > 1 {
			return
		}
		if !h.e.mu.TryLock() {
			t.Error("the snapshot is encoded with Engine.mu held")
			return
		}
		h.e.mu.Unlock()
		n, err := h.e.DLQPurge(h.ctx, &storage.DLQPurgeParams{SubscriptionID: q.ID, IDs: []int64{7}})
		if err != nil || n != 1 {
			t.Errorf("purge while the snapshot is encoded: %d, %v", n, err)
		}
	}
	h.must(h.e.snapshot(false), "snapshot")
	equal(t, calls, 1, "hook calls")
	h.e.snapshotEncodeHook = nil

	// The snapshot holds 50 entries; the purge after its marker is replayed.
	h.crash()
	equal(t, h.stats(q.ID).DeadLettered, 49, "dead-lettered after the crash")
	list, err := h.e.DLQList(h.ctx, &storage.DLQListParams{SubscriptionID: q.ID, AfterID: 6, Limit: 1})
	h.must(err, "list")
	equal(t, list[0].ID, 8, "entry after 6")
	h.restart()
	equal(t, h.stats(q.ID).DeadLettered, 49, "dead-lettered after the restart")
}

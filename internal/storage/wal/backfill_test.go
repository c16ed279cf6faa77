package wal

import (
	"slices"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// Backfill changes survive a crash without a final snapshot: replaying record 27 restores the
// range, its state and the floors a skip raised.
func TestBackfillRecordReplay(t *testing.T) {
	h := newHarness(t)
	h.createTopic("bf", storage.TopicConfig{Semantics: storage.PubSub})
	h.publishN("bf", 10)
	s := h.subscribe("bf", "g", storage.StartPosition{Kind: storage.FromBeginning})
	h.crash()
	got, err := h.e.SubscriptionGet(h.ctx, s.ID)
	h.must(err, "SubscriptionGet")
	if got.Backfill == nil || got.Backfill.Total != 10 || !slices.Equal(got.Backfill.End, []int64{10}) {
		t.Fatalf("backfill after a crash (record 7): %+v", got.Backfill)
	}
	_, err = h.e.SubscriptionBackfill(h.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: storage.BackfillCancel})
	h.must(err, "cancel")
	h.crash()
	got, err = h.e.SubscriptionGet(h.ctx, s.ID)
	h.must(err, "SubscriptionGet")
	if got.Backfill.State != storage.BackfillCancelled {
		t.Fatalf("state after cancel and a crash: %s", got.Backfill.State)
	}
	ds := h.claim(s.ID, "m", 3)
	h.ack(s.ID, ds[0].Ref())
	res, err := h.e.SubscriptionBackfill(h.ctx, &storage.SubscriptionBackfillParams{ID: s.ID, Action: storage.BackfillSkip})
	h.must(err, "skip")
	if res.Skipped != 9 {
		t.Errorf("skipped %d, want 9", res.Skipped)
	}
	h.crash()
	got, err = h.e.SubscriptionGet(h.ctx, s.ID)
	h.must(err, "SubscriptionGet")
	st := h.stats(s.ID)
	if got.Backfill.Skipped != 9 || st.Partitions[0].AckFloor != 10 || st.Partitions[0].Cursor != 10 {
		t.Fatalf("after skip and a crash: backfill %+v, partition %+v", got.Backfill, st.Partitions[0])
	}
}

package wal

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// TestPoisonHistoryCrash: failure histories (poison rules) are rebuilt from the state log alone
// (recFailure) after a crash, for a pending message and a replayed DLQ copy, so a rule fires
// after the crash as it would have before; the poison DLQ entry (rule, failures) survives
// crashes too.
func TestPoisonHistoryCrash(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("jobs", storage.TopicConfig{MaxDeliveries: 10, PoisonRules: storage.PoisonRules{DistinctMembers: true}})
	q := h.queueSub("jobs")
	h.publishN("jobs", 2)
	nack := func(member, reason string, want int) {
		t.Helper()
		h.clock.Advance(time.Second)
		ds := h.claim(q.ID, member, 2)
		res, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: member, Refs: refs(ds), Reason: reason})
		h.must(err, "nack")
		equal(t, res.DeadLettered, want, member+" nacks: dead-lettered")
	}
	nack("a", "bad", 0)
	// Offset 1 to the DLQ and back: a replayed copy with its own history.
	h.clock.Advance(time.Second)
	ds := h.claim(q.ID, "c", 2)
	equal(t, len(ds), 2, "claimed again")
	_, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "c", Refs: refs(ds[1:]), ToDLQ: true, Reason: "x"})
	h.must(err, "nack to the DLQ")
	_, err = h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "c", Refs: refs(ds[:1]), Reason: "other"})
	h.must(err, "nack")
	n, err := h.e.DLQReplay(h.ctx, &storage.DLQReplayParams{SubscriptionID: q.ID})
	h.must(err, "replay")
	equal(t, n, 1, "replayed")
	nack("a", "bad", 0) // offset 0: a, c, a; the replayed copy of 1: a

	want := projectCrashed(h.e)
	h.crash()
	diffProjection(t, want, project(h.e))

	nack("b", "bad", 2) // both: "bad" from a before the crash, now from b
	dlq, err := h.e.DLQList(h.ctx, &storage.DLQListParams{SubscriptionID: q.ID})
	h.must(err, "list")
	equal(t, len(dlq), 2, "DLQ entries")
	for _, en := range dlq {
		equal(t, en.Rule, storage.RuleSameReason, "rule")
		equal(t, en.Reason, storage.DLQPoison, "reason")
	}
	equal(t, len(dlq[0].Failures)+len(dlq[1].Failures), 4+2, "failures: offset 0 a, c, a, b; the copy a, b")
	want = projectCrashed(h.e)
	h.crash()
	diffProjection(t, want, project(h.e))
}

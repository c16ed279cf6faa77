package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// TestRefcountJoinWaitsForDeliveries: a group joining a refcount topic waits for the delivery
// transactions of the topic's other groups in flight and sees what they completed: an ack that
// commits during the join is not missed, so the joiner is not added to the message it completed.
// Here a session holds group a's delivery state and completes offset 0 (as a's ack would); the
// join must wait for it, then skip offset 0.
func TestRefcountJoinWaitsForDeliveries(t *testing.T) {
	t.Parallel()
	e := logOpen(t, testConfig(t, nil))
	logTopic(t, e, "rc", storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount})
	a := logSub(t, e, "rc", "a")
	logPublish(t, e, "rc", 0, "m")
	ack := lockRows(t, e.sql(`UPDATE spool.sub_partitions SET ack_floor = 1, cursor = 1 WHERE sub_id = $1`), a.ID)
	join := goOp("join", func() (*storage.Subscription, error) {
		return e.SubscriptionCreate(t.Context(), &storage.SubscriptionCreateParams{Topic: "rc", Group: "c",
			Start: storage.StartPosition{Kind: storage.FromBeginning}})
	})
	awaitBlockedBy(t, e, ack.pid())
	if err := ack.tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	out := awaitOut(t, join, time.Now(), "join")
	if out.err != nil {
		t.Fatal(out.err)
	}
	c := out.res.(*storage.Subscription)
	res := must(e.DeliveriesClaim(t.Context(), &storage.DeliveriesClaimParams{SubscriptionID: c.ID, Member: "m", Max: 10}))(t)
	if len(res.Deliveries) != 0 {
		t.Errorf("the joiner got %d:%d, completed by a's ack that committed during the join", res.Deliveries[0].Partition, res.Deliveries[0].Offset)
	}
}

// TestMessageCompletionOneSnapshot: a retention that commits between MessageCompletion's bounds
// check and its reads does not make the message vanish half way: the call reads one snapshot
// (the record as it was) or reports the offset out of range, never an internal "no rows".
// Not parallel: it sets a package hook.
func TestMessageCompletionOneSnapshot(t *testing.T) {
	e := logOpen(t, testConfig(t, nil))
	logTopic(t, e, "snap", storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount})
	logSub(t, e, "snap", "a")
	logPublish(t, e, "snap", 0, "m")
	completionBoundsHook = func() {
		// What a retention of offset 0 commits, from another session.
		if _, err := e.pool.Exec(t.Context(), e.sql(`WITH t AS (SELECT id FROM spool.topics WHERE name = 'snap'),
			d AS (DELETE FROM spool.messages WHERE topic_id = (SELECT id FROM t))
			UPDATE spool.partitions SET low_offset = 1 WHERE topic_id = (SELECT id FROM t)`)); err != nil {
			t.Errorf("retention: %v", err)
		}
	}
	t.Cleanup(func() { completionBoundsHook = nil })
	_, err := e.MessageCompletion(t.Context(), &storage.MessageCompletionParams{Topic: "snap", Partition: 0, Offset: 0})
	completionBoundsHook = nil
	if err != nil && !errors.Is(err, storage.ErrOffsetOutOfRange) {
		t.Fatalf("completion during a retention: %v, want the record or ErrOffsetOutOfRange", err)
	}
}

// TestSizeRetentionDeletesCompletions: the size bound removes the completion records of the
// messages it removes, as the age rules do (none is left below a partition's low offset).
func TestSizeRetentionDeletesCompletions(t *testing.T) {
	t.Parallel()
	e := logOpen(t, testConfig(t, nil))
	logTopic(t, e, "szc", storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount, MaxMessages: 2})
	a := logSub(t, e, "szc", "a")
	logPublish(t, e, "szc", 0, "m0", "m1", "m2", "m3")
	res := must(e.DeliveriesClaim(t.Context(), &storage.DeliveriesClaimParams{SubscriptionID: a.ID, Member: "m", Max: 10}))(t)
	refs := make([]storage.DeliveryRef, len(res.Deliveries))
	for i, d := range res.Deliveries {
		refs[i] = d.Ref()
	}
	must(e.DeliveriesAck(t.Context(), &storage.DeliveriesAckParams{SubscriptionID: a.ID, Member: "m", Refs: refs}))(t)
	ret := must(e.RetentionApply(t.Context()))(t)
	if len(ret.SizeRemoved) != 1 || ret.SizeRemoved[0].Messages != 2 {
		t.Fatalf("size bound removed %+v, want 2 messages", ret.SizeRemoved)
	}
	var below int
	if err := e.pool.QueryRow(t.Context(), e.sql(`SELECT count(*) FROM spool.completions c JOIN spool.partitions p
		ON p.topic_id = c.topic_id AND p.partition = c.partition WHERE c.hi <= p.low_offset
		AND c.topic_id = (SELECT id FROM spool.topics WHERE name = 'szc')`)).Scan(&below); err != nil {
		t.Fatal(err)
	}
	if below != 0 {
		t.Fatalf("%d completion records below the low offset after the size bound", below)
	}
}

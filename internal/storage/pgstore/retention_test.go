package pgstore

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// TestZombieWatchesForgetDeletedTopics: the instance's view of a topic's floors (zombie_ttl)
// goes with the topic, so deleted topics leave nothing behind in memory.
func TestZombieWatchesForgetDeletedTopics(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC))
	e, err := Open(t.Context(), testConfig(t, clock))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := t.Context()
	for _, name := range []string{"w.keep", "w.gone"} {
		if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: name, Config: storage.TopicConfig{}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.RetentionApply(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(e.watches.topics); n != 2 {
		t.Fatalf("%d topics watched, want 2 (each has its queue subscription)", n)
	}
	if err := e.TopicDelete(ctx, &storage.TopicDeleteParams{Name: "w.gone", Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.RetentionApply(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(e.watches.topics); n != 1 {
		t.Fatalf("%d topics watched after a delete, want 1", n)
	}
}

// TestSizeBoundRunLimit: one run reads at most about sizeRunLimit messages for a topic's size
// bound, per partition its share, and removes them oldest first across partitions; it stops
// where a partition's share is used up (that partition may hold older messages than the other
// candidates), and the next runs go on until the topic is within its bound.
func TestSizeBoundRunLimit(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC))
	e, err := Open(t.Context(), testConfig(t, clock))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.sizeRunLimit = 8 // 8 per partition (the floor of a partition's share is min(100, limit))
	ctx := t.Context()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "lim",
		Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MaxMessages: 4}}); err != nil {
		t.Fatal(err)
	}
	// Partition 0 holds the 10 oldest, partition 1 the 10 newest: the first run may only take
	// partition 0's first 8 (its share), though 16 must go; the second takes the 8 more needed.
	for _, p := range []int32{0, 1} {
		msgs := make([]storage.AppendMessage, 10)
		for i := range msgs {
			msgs[i] = storage.AppendMessage{Partition: p, Payload: []byte("x")}
		}
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "lim", Messages: msgs}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
	}
	lows := func() []int64 {
		t.Helper()
		st, err := e.TopicStats(ctx, "lim")
		if err != nil {
			t.Fatal(err)
		}
		return []int64{st.Partitions[0].LowOffset, st.Partitions[1].LowOffset}
	}
	want := [][]int64{{8, 0}, {10, 6}, {10, 6}}
	for run, w := range want {
		res, err := e.RetentionApply(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := lows(); got[0] != w[0] || got[1] != w[1] {
			t.Fatalf("run %d: low offsets %v, want %v (%+v)", run+1, got, w, res.SizeRemoved)
		}
	}
}

// TestZombieLocksPartitionsFirst: a retention run that force-advances a stuck floor (zombie_ttl)
// takes the topic's partition rows before the subscription's sub_partitions row (the documented
// order), so a transaction holding a partition row and then wanting that sub_partitions row (as
// a refcount SubscriptionCreate does) is not deadlocked: while the run waits for the partition,
// the sub_partitions row is free (NOWAIT succeeds). message_retention makes the same run remove
// the given-up messages (advanceLow locks the partition).
func TestZombieLocksPartitionsFirst(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC))
	e := logOpen(t, testConfig(t, clock))
	logTopic(t, e, "zl", storage.TopicConfig{Semantics: storage.PubSub, ZombieTTL: time.Hour, MessageRetention: time.Minute})
	s := logSub(t, e, "zl", "s")
	logPublish(t, e, "zl", 0, "m0", "m1")
	must(e.RetentionApply(t.Context()))(t) // first sight of the floor
	clock.Advance(time.Hour + time.Second)
	logPublish(t, e, "zl", 0, "m2")
	other := lockRows(t, e.sql(`SELECT 1 FROM spool.partitions WHERE topic_id = (SELECT id FROM spool.topics WHERE name = 'zl') FOR UPDATE`))
	run := goOp("retention", func() (*storage.RetentionResult, error) { return e.RetentionApply(t.Context()) })
	awaitBlockedBy(t, e, other.pid())
	if _, err := other.tx.Exec(t.Context(), e.sql(`SELECT 1 FROM spool.sub_partitions WHERE sub_id = $1 FOR UPDATE NOWAIT`), s.ID); err != nil {
		t.Fatalf("sub_partitions row locked by retention while it waits for the partition: %v", err)
	}
	other.release()
	out := awaitOut(t, run, time.Now(), "retention")
	if out.err != nil {
		t.Fatal(out.err)
	}
	if res := out.res.(*storage.RetentionResult); len(res.Zombies) != 1 || res.MessagesDeleted+res.MessagesExpired != 2 {
		t.Fatalf("zombies %+v, removed %d, want 1 zombie and m0, m1 removed (message_retention)", res.Zombies, res.MessagesDeleted+res.MessagesExpired)
	}
}

// TestZombieFloorRaisedByRetention: a floor that retention itself raised (drop_oldest) is no
// progress of the subscription: it stays stuck for zombie_ttl from when it was first seen and is
// force-advanced then, as on the embedded engine.
func TestZombieFloorRaisedByRetention(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC))
	e := logOpen(t, testConfig(t, clock))
	logTopic(t, e, "zr", storage.TopicConfig{Semantics: storage.PubSub, ZombieTTL: time.Hour,
		MaxMessages: 1, SizePolicy: storage.SizeDropOldest})
	logSub(t, e, "zr", "s")
	logPublish(t, e, "zr", 0, "m0", "m1")
	res := must(e.RetentionApply(t.Context()))(t) // first sight of floor 0; drop_oldest raises it to 1
	if len(res.Zombies) != 0 || res.MessagesExpired != 1 {
		t.Fatalf("first run: zombies %+v, expired %d, want none and m0", res.Zombies, res.MessagesExpired)
	}
	clock.Advance(time.Hour + time.Second)
	logPublish(t, e, "zr", 0, "m2")
	res = must(e.RetentionApply(t.Context()))(t)
	if len(res.Zombies) != 1 {
		t.Fatalf("zombies %+v after zombie_ttl stuck, want the subscription", res.Zombies)
	}
}

// TestRetentionBacklogBlockedDrop: RetentionResult.Backlog counts the messages of the buckets
// that hold nothing retained and are still stored. While another session holds the bucket lock
// (another instance creating or dropping buckets), a run removes messages from the retained
// range but drops no bucket: the backlog is the whole bucket it could have dropped, not the one
// that still holds a retained message of another topic. Once the lock is free the next run drops
// it and the backlog is 0.
func TestRetentionBacklogBlockedDrop(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC))
	e := logOpen(t, testConfig(t, clock))
	ctx := t.Context()
	logTopic(t, e, "bk", storage.TopicConfig{Semantics: storage.PubSub, ZeroSubscriptionRetention: time.Minute})
	logTopic(t, e, "keep", storage.TopicConfig{Semantics: storage.PubSub})
	logSub(t, e, "keep", "s")
	logPublish(t, e, "bk", 0, "a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9") // bucket 09:00
	clock.Advance(time.Hour)
	logPublish(t, e, "bk", 0, "b0", "b1", "b2", "b3", "b4") // bucket 10:00
	logPublish(t, e, "keep", 0, "k0")                       // retained: bucket 10:00 stays
	clock.Advance(2 * time.Hour)
	bucketExists := func(name string) bool {
		var ok bool
		if err := e.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", e.schema+"."+name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	first := bucketName(time.Date(2031, 3, 14, 9, 0, 0, 0, time.UTC).Unix())
	if !bucketExists(first) {
		t.Fatalf("bucket %s missing", first)
	}

	other := lockRows(t, e.sql(bucketLockSQL))
	res := must(e.RetentionApply(ctx))(t)
	if res.MessagesDeleted != 15 || res.Backlog != 10 {
		t.Fatalf("run with the bucket lock held: deleted %d, backlog %d; want 15 and 10 (bucket 09:00)", res.MessagesDeleted, res.Backlog)
	}
	other.release()
	res = must(e.RetentionApply(ctx))(t)
	if res.Backlog != 0 || bucketExists(first) {
		t.Fatalf("run with the bucket lock free: backlog %d, bucket %s still there: %v", res.Backlog, first, bucketExists(first))
	}
}

package pgstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestProducerIDsBoundInstances: Config.MaxProducerIDs bounds spool.producer_ids over the
// instances sharing it: an instance counts at Open what the others inserted, and at each
// maintenance pass what they inserted since; PublishTx is refused past the bound too, leaving
// the caller's transaction usable and nothing staged; the prune of a maintenance pass makes room.
func TestProducerIDsBoundInstances(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := storagetest.NewFakeClock(logBase)
	cfg := testConfig(t, clock)
	cfg.MaxProducerIDs = 10
	e1 := logOpen(t, cfg)
	logTopic(t, e1, "pb.a", storage.TopicConfig{DedupWindow: time.Minute})
	ids := func(prefix string, n int) []storage.AppendMessage {
		var ms []storage.AppendMessage
		for i := range n {
			ms = append(ms, storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("x"), ProducerID: fmt.Sprint(prefix, i)})
		}
		return ms
	}
	publish := func(e *Engine, ms ...storage.AppendMessage) error {
		_, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "pb.a", Messages: ms})
		return err
	}
	if err := publish(e1, ids("one-", 6)...); err != nil {
		t.Fatal(err)
	}
	e2 := logOpen(t, cfg) // counts e1's 6 at Open
	if err := publish(e2, ids("two-", 5)...); !errors.Is(err, storage.ErrRateLimited) {
		t.Fatalf("5 new ids on the second instance beside the first's 6: %v, want ErrRateLimited", err)
	}
	if err := publish(e2, ids("two-", 4)...); err != nil {
		t.Fatalf("4 new ids on the second instance: %v", err)
	}
	// e1 learns of e2's 4 at its next count (a maintenance pass).
	if err := e1.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := publish(e1, ids("late-", 1)...); !errors.Is(err, storage.ErrRateLimited) {
		t.Fatalf("an 11th id on the first instance after its count: %v, want ErrRateLimited", err)
	}
	if got := e1.ids.estimate(); got != 10 {
		t.Fatalf("the first instance's estimate: %d, want 10", got)
	}

	tx := must(e1.pool.Begin(ctx))(t)
	defer tx.Rollback(context.Background())
	_, err := e1.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "pb.a", Messages: ids("tx-", 1)})
	if !errors.Is(err, storage.ErrRateLimited) {
		t.Fatalf("PublishTx of a new id at the bound: %v, want ErrRateLimited", err)
	}
	// The savepoint rolled back: the transaction goes on, and a message without id is staged.
	must(e1.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "pb.a",
		Messages: []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("no id")}}}))(t)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := e1.pool.QueryRow(ctx, e1.sql("SELECT count(*) FROM spool.producer_ids")).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 10 {
		t.Fatalf("producer ids stored: %d, want 10", rows)
	}

	clock.Advance(time.Minute) // every id expires; a maintenance pass prunes and counts
	// A count leaves expired rows out, before any prune deleted them: they are room.
	if err := e1.countProducerIDs(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e1.ids.estimate(); n != 0 {
		t.Fatalf("the first instance's estimate once every id expired, before the prune: %d, want 0", n)
	}
	// One instance prunes at a time: this pass skips the prune while e1's maintenance loop holds
	// it, so pass again until e2 has counted what is left.
	testutil.Eventually(t, 30*time.Second, "the expired ids pruned and counted", func() error {
		if err := e2.maintain(ctx); err != nil {
			t.Fatal(err)
		}
		if n := e2.ids.estimate(); n != 0 {
			return fmt.Errorf("the second instance's estimate: %d, want 0", n)
		}
		return nil
	})
	if err := publish(e2, ids("new-", 10)...); err != nil {
		t.Fatalf("10 new ids once the others were pruned: %v", err)
	}
}

// TestIDCountSnapshot: a count's snapshot decides which of the instance's publishes it saw, so
// that a publish committing while the count runs is neither counted twice nor missed.
func TestIDCountSnapshot(t *testing.T) {
	t.Parallel()
	snap, err := parseSnapshot("100:110:103,107")
	if err != nil {
		t.Fatal(err)
	}
	for x, want := range map[uint64]bool{99: true, 100: true, 103: false, 105: true, 107: false, 110: false, 120: false} {
		if snap.sees(x) != want {
			t.Errorf("snapshot 100:110:103,107 sees %d: %v, want %v", x, !want, want)
		}
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x"} {
		if _, err := parseSnapshot(bad); err == nil {
			t.Errorf("parseSnapshot(%q): no error", bad)
		}
	}
	var c idCount
	c.add("50", 3) // before any count
	c.start()
	c.add("105", 2) // committed before the count's snapshot: seen by it
	c.add("103", 4) // running when the snapshot was taken: not seen
	c.add("111", 1) // started after it: not seen
	c.set(20, snap)
	if got := c.estimate(); got != 25 {
		t.Fatalf("estimate after the count: %d, want 20 counted + 5 not seen", got)
	}
	c.add("104", 7) // committed before the last count's snapshot: it saw them
	c.add("130", 1)
	if got := c.estimate(); got != 26 {
		t.Fatalf("estimate after later publishes: %d, want 26", got)
	}
	c.start()
	c.set(0, nil) // a failed count changes nothing
	if got := c.estimate(); got != 26 {
		t.Fatalf("estimate after a failed count: %d, want 26", got)
	}
}

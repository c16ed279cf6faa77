package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
)

// awaitSequenced polls until spool.staged is empty: every committed transactional publish is in
// the log.
func awaitSequenced(t *testing.T, e *Engine) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "staged messages sequenced", func() error {
		var n int
		if err := e.pool.QueryRow(t.Context(), e.sql("SELECT count(*) FROM spool.staged")).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d staged", n)
		}
		return nil
	})
}

// openAppend appends payload to topic's partition inside tx as the broker's appends and the
// sequencer do (the partition row lock, the row in the bucket of now), leaving tx open.
func openAppend(t *testing.T, e *Engine, tx pgx.Tx, topic string, part int32, payload string) {
	t.Helper()
	var id int64
	if err := tx.QueryRow(t.Context(), e.sql("SELECT id FROM spool.topics WHERE name = $1"), topic).Scan(&id); err != nil {
		t.Fatal(err)
	}
	now := e.clock.Now()
	must(0, e.ensureBucket(t.Context(), now))(t)
	name := topic
	plan := stagedPlan([]stagedRow{{topicID: id, partition: part, payload: []byte(payload), size: int32(len(payload)), topic: &name}})
	must(e.appendInTx(t.Context(), tx, plan, 1, now, ""))(t)
}

// stagedPublish publishes payload to topic's partition with PublishTx in a transaction of its own
// on e's pool and returns the transaction, open.
func stagedPublish(t *testing.T, e *Engine, topic string, part int32, payload string) pgx.Tx {
	t.Helper()
	tx := must(e.pool.Begin(t.Context()))(t)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	res := must(e.PublishTx(t.Context(), tx, &storage.MessagesAppendParams{Topic: topic,
		Messages: []storage.AppendMessage{{Partition: part, Payload: []byte(payload)}}}))(t)
	if p := res.Positions[0]; p.Partition != part || p.Offset != -1 || p.Duplicate {
		t.Fatalf("PublishTx position %+v, want partition %d, offset -1 (assigned when sequenced)", p, part)
	}
	return tx
}

// TestCommitOrderTwoInstances: transactional publishes neither wait for nor hold up other
// publishers, and a cursor never skips the message of a slow transaction, with two broker
// instances on one schema. A publishes on instance 1 and stays open; B publishes on instance 2
// and commits; a broker append C on instance 2 returns at once (it waited for A before issue 20);
// groups on both instances see B and C; A commits and is delivered after them, at the next offset,
// on both instances, every message once.
func TestCommitOrderTwoInstances(t *testing.T) {
	t.Parallel()
	e1, e2 := twoInstances(t, time.Minute)
	ctx := t.Context()
	logTopic(t, e1, "order", storage.TopicConfig{Semantics: storage.PubSub})
	g1 := logSub(t, e1, "order", "g1")
	g2 := logSub(t, e2, "order", "g2")

	txA := stagedPublish(t, e1, "order", 0, "A")
	txB := stagedPublish(t, e2, "order", 0, "B")
	if err := txB.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := e2.MessagesAppend(cctx, &storage.MessagesAppendParams{Topic: "order",
		Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("C")}}})
	if err != nil {
		t.Fatalf("a broker append while A is open: %v", err)
	}
	awaitSequenced(t, e1)
	if res.Positions[0].Offset != 0 && res.Positions[0].Offset != 1 {
		t.Fatalf("C at offset %d, want 0 or 1 (B and C in either order)", res.Positions[0].Offset)
	}
	want := []string{"0:0=B", "0:1=C"}
	if res.Positions[0].Offset == 0 {
		want = []string{"0:0=C", "0:1=B"}
	}
	equalStrings(t, claimPayloads(t, e1, g1.ID), want, "g1 on instance 1 while A is open")
	equalStrings(t, claimPayloads(t, e2, g2.ID), want, "g2 on instance 2 while A is open")

	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	awaitSequenced(t, e1)
	equalStrings(t, claimPayloads(t, e1, g1.ID), []string{"0:2=A"}, "g1 after A commits")
	equalStrings(t, claimPayloads(t, e2, g2.ID), []string{"0:2=A"}, "g2 after A commits")
}

// TestStagedCommitOrder: messages of transactions that committed one after the other, each
// sequenced before the next commits, are in the log in that order whatever order they staged in
// (staging order applies among the rows committed when a sequencing transaction runs), and the
// messages of one transaction keep their order; a rolled-back transaction leaves nothing staged and takes no offset.
func TestStagedCommitOrder(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "corder", storage.TopicConfig{Partitions: 2})
	q := must(e.SubscriptionGetByGroup(ctx, "corder", storage.QueueGroup))(t)
	var txs []pgx.Tx
	for i := range 4 {
		tx := must(e.pool.Begin(ctx))(t)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		var msgs []storage.AppendMessage
		for j := range 3 {
			msgs = append(msgs, storage.AppendMessage{Partition: int32(j % 2), Payload: fmt.Appendf(nil, "t%d.%d", i, j)})
		}
		must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "corder", Messages: msgs}))(t)
		txs = append(txs, tx)
	}
	// Commit in the order 3, 1, 0 (each sequenced before the next commits); roll 2 back.
	must(0, txs[2].Rollback(ctx))(t)
	for _, i := range []int{3, 1, 0} {
		if err := txs[i].Commit(ctx); err != nil {
			t.Fatal(err)
		}
		awaitSequenced(t, e)
	}
	got := claimPayloads(t, e, q.ID)
	slices.Sort(got) // partitions in any order
	equalStrings(t, got, []string{
		"0:0=t3.0", "0:1=t3.2", "0:2=t1.0", "0:3=t1.2", "0:4=t0.0", "0:5=t0.2",
		"1:0=t3.1", "1:1=t1.1", "1:2=t0.1"}, "claims")
}

// TestRetentionWithStagedMessages: an application's transaction that published and stays open
// writes nothing to the log and holds no partition row: retention runs to its end meanwhile (it
// waited for such transactions before issue 20), and the message is delivered once the
// transaction commits, in the bucket of its sequencing time.
func TestRetentionWithStagedMessages(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "slow.s", storage.TopicConfig{MessageRetention: time.Minute})
	q := must(e.SubscriptionGetByGroup(ctx, "slow.s", storage.QueueGroup))(t)
	logPublish(t, e, "slow.s", 0, "old")
	got := claimPayloads(t, e, q.ID)
	slices.Sort(got) // partitions in any order
	equalStrings(t, got, []string{"0:0=old"}, "claims of the old message")
	tx := stagedPublish(t, e, "slow.s", 0, "slow-tx")
	clock.Advance(3 * time.Hour)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := e.RetentionApply(rctx)
	if err != nil {
		t.Fatalf("retention while an application's transaction is open: %v", err)
	}
	if res.MessagesDeleted != 1 {
		t.Fatalf("retention: %+v, want the old message deleted", *res)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	awaitSequenced(t, e)
	equalStrings(t, claimPayloads(t, e, q.ID), []string{"0:1=slow-tx"}, "claims after the commit")
}

// TestTopicDeleteStagedMessages: committed transactional publishes that the sequencer has not
// moved into the log yet keep a topic from being deleted without force, as messages not done do;
// a forced delete removes them and the next retention run reports them as expired (invariant 1).
func TestTopicDeleteStagedMessages(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "del.q", storage.TopicConfig{})
	logTopic(t, e, "del.p", storage.TopicConfig{Semantics: storage.PubSub})
	logTopic(t, e, "del.b", storage.TopicConfig{})
	// Stage while the sequencers cannot run (their lock is held).
	lock := lockRows(t, "SELECT pg_advisory_xact_lock($1)", lockKey(e.schema, "sequencer"))
	for _, topic := range []string{"del.q", "del.p", "del.p", "del.b"} {
		must(0, stagedPublish(t, e, topic, 0, "m").Commit(ctx))(t)
	}
	for _, topic := range []string{"del.q", "del.p"} {
		err := e.TopicDelete(ctx, &storage.TopicDeleteParams{Name: topic})
		if !errors.Is(err, storage.ErrTopicHasSubscriptions) {
			t.Fatalf("delete %s without force with a committed staged message: %v, want ErrTopicHasSubscriptions", topic, err)
		}
		must(0, e.TopicDelete(ctx, &storage.TopicDeleteParams{Name: topic, Force: true}))(t)
	}
	res := must(e.RetentionApply(ctx))(t)
	want := []storage.ExpiredCount{{Topic: "del.p", Reason: storage.ExpiredTopicDeleted, Messages: 2},
		{Topic: "del.q", Reason: storage.ExpiredTopicDeleted, Messages: 1}}
	if !slices.Equal(res.Expired, want) || res.MessagesExpired != 3 {
		t.Fatalf("retention after the forced deletes: expired %d %+v, want %+v", res.MessagesExpired, res.Expired, want)
	}
	lock.release()
	awaitSequenced(t, e)
	if st := must(e.TopicStats(ctx, "del.b"))(t); st.Messages != 1 {
		t.Fatalf("del.b holds %d messages, want 1", st.Messages)
	}
	if res := must(e.RetentionApply(ctx))(t); res.MessagesExpired != 0 {
		t.Fatalf("second retention run: %+v, want nothing expired", *res)
	}
}

// TestSequencerDropsDeletedTopics: staged messages whose topic was deleted after the commit
// without them (as an instance older than TopicDelete's staged check does) are dropped by the
// sequencer, which goes on with the others, and counted as expired by the next retention run.
func TestSequencerDropsDeletedTopics(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "del.a", storage.TopicConfig{})
	logTopic(t, e, "del.b", storage.TopicConfig{})
	var idA int64
	must(0, e.pool.QueryRow(ctx, e.sql("SELECT id FROM spool.topics WHERE name = 'del.a'")).Scan(&idA))(t)
	lock := lockRows(t, "SELECT pg_advisory_xact_lock($1)", lockKey(e.schema, "sequencer"))
	for _, topic := range []string{"del.a", "del.b"} {
		must(0, stagedPublish(t, e, topic, 0, "m").Commit(ctx))(t)
	}
	must(e.pool.Exec(ctx, e.sql("DELETE FROM spool.topics WHERE id = $1"), idA))(t)
	lock.release()
	awaitSequenced(t, e)
	if st := must(e.TopicStats(ctx, "del.b"))(t); st.Messages != 1 {
		t.Fatalf("del.b holds %d messages, want 1", st.Messages)
	}
	if _, err := e.TopicStats(ctx, "del.a"); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("del.a: %v", err)
	}
	res := must(e.RetentionApply(ctx))(t)
	want := []storage.ExpiredCount{{Topic: fmt.Sprintf("(deleted topic %d)", idA), Reason: storage.ExpiredTopicDeleted, Messages: 1}}
	if !slices.Equal(res.Expired, want) {
		t.Fatalf("retention after the drop: %+v, want %+v", res.Expired, want)
	}
}

// TestSequencerBounded: a sequencing transaction takes at most sequenceBytes of staged messages
// past the first (and at most sequenceBatch rows), and the sequencer goes on until every committed
// message is in the log, in order.
func TestSequencerBounded(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "big", storage.TopicConfig{MaxMessageBytes: 4 << 20})
	lock := lockRows(t, "SELECT pg_advisory_xact_lock($1)", lockKey(e.schema, "sequencer"))
	const n = 5 // 3 MiB each: 3 transactions of at most 8 MiB past their first
	tx := must(e.pool.Begin(ctx))(t)
	for i := range n {
		p := make([]byte, 3<<20)
		p[0] = byte(i)
		must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "big", Messages: []storage.AppendMessage{{Partition: 0, Payload: p}}}))(t)
	}
	must(0, tx.Commit(ctx))(t)
	// What one sequencing transaction takes (run here and rolled back, while the sequencers wait
	// for their lock): 3 (0 + 3 + 3 MiB before the third < 8 MiB).
	peek := must(e.pool.Begin(ctx))(t)
	rows := must(peek.Query(ctx, e.sql(takeStagedSQL), sequenceBatch, sequenceBytes))(t)
	took := 0
	for rows.Next() {
		took++
	}
	rows.Close()
	must(0, rows.Err())(t)
	must(0, peek.Rollback(ctx))(t)
	if took != 3 {
		t.Fatalf("one sequencing transaction takes %d messages of 3 MiB, want 3", took)
	}
	seq0 := e.seqRows.Load()
	lock.release()
	awaitSequenced(t, e)
	// A read returns at most readBatchBytes (one 3 MiB message here): page on.
	var ms []*storage.Message
	for len(ms) < n {
		page := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "big", Partition: 0, Offset: int64(len(ms)), Limit: 10}))(t)
		if len(page) == 0 {
			t.Fatalf("read %d messages, want %d", len(ms), n)
		}
		ms = append(ms, page...)
	}
	for i, m := range ms {
		if m.Offset != int64(i) || m.Payload[0] != byte(i) {
			t.Fatalf("message %d: offset %d, payload starts %d", i, m.Offset, m.Payload[0])
		}
	}
	if got := e.seqRows.Load() - seq0; got != n {
		t.Fatalf("sequencer counted %d rows, want %d", got, n)
	}
}

// TestSequencerNoExtraTransactions: a sequencer that finds the sequencing lock held neither
// blocks a connection on it (it tries again later), and a wake-up that sequences fewer rows than
// a transaction's bounds ends there, without an empty transaction to find out.
func TestSequencerNoExtraTransactions(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, storagetest.NewFakeClock(logBase))
	cfg.PollInterval = time.Minute // only notifications wake the sequencer here
	e := logOpen(t, cfg)
	ctx := t.Context()
	logTopic(t, e, "quiet", storage.TopicConfig{})
	testutil.Eventually(t, 10*time.Second, "the wake-up at Open finished", func() error {
		if e.seqCycles.Load() == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	lock := lockRows(t, "SELECT pg_advisory_xact_lock($1)", lockKey(e.schema, "sequencer"))
	busy0 := e.seqBusy.Load()
	must(0, stagedPublish(t, e, "quiet", 0, "m").Commit(ctx))(t)
	testutil.Eventually(t, 10*time.Second, "the sequencer finding its lock held", func() error {
		if e.seqBusy.Load() == busy0 {
			return errors.New("not yet")
		}
		return nil
	})
	var waiting int
	must(0, e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", lock.pid()).Scan(&waiting))(t)
	if waiting != 0 {
		t.Fatalf("%d backends wait for the sequencing lock, want none (pg_try_advisory_xact_lock)", waiting)
	}
	empty0, cycles0 := e.seqEmpty.Load(), e.seqCycles.Load()
	lock.release()
	awaitSequenced(t, e)
	testutil.Eventually(t, 10*time.Second, "the wake-up finished", func() error {
		if e.seqCycles.Load() == cycles0 {
			return errors.New("not yet")
		}
		return nil
	})
	if n := e.seqEmpty.Load() - empty0; n != 0 {
		t.Fatalf("%d sequencing transactions found nothing after the one that took the message, want 0", n)
	}
}

// TestSequencerSkipsLockedTopic: a topic whose partition rows are held (a topic delete or update
// in progress) does not stall the transactional publishes of other topics; its own are sequenced
// once the rows are free.
func TestSequencerSkipsLockedTopic(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "held", storage.TopicConfig{})
	logTopic(t, e, "free", storage.TopicConfig{})
	b := lockRows(t, e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
		WHERE t.name = 'held' FOR UPDATE OF p`))
	must(0, stagedPublish(t, e, "held", 0, "h").Commit(ctx))(t)
	must(0, stagedPublish(t, e, "free", 0, "f").Commit(ctx))(t)
	testutil.Eventually(t, 10*time.Second, "free's message sequenced", func() error {
		st, err := e.TopicStats(ctx, "free")
		if err != nil {
			return err
		}
		if st.Messages != 1 {
			return fmt.Errorf("%d messages", st.Messages)
		}
		return nil
	})
	if st := must(e.TopicStats(ctx, "held"))(t); st.Messages != 0 {
		t.Fatalf("held holds %d messages while its partition rows are held, want 0", st.Messages)
	}
	b.release()
	awaitSequenced(t, e)
	if st := must(e.TopicStats(ctx, "held"))(t); st.Messages != 1 {
		t.Fatalf("held holds %d messages, want 1", st.Messages)
	}
}

// TestBrokerPublishWaitsForAppProducerID: a broker publish reusing a producer id that an open
// application transaction claimed waits for that transaction (docs/storage.md, "Producer
// de-duplication"), then answers a duplicate of the staged message.
func TestBrokerPublishWaitsForAppProducerID(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	logTopic(t, e, "ids", storage.TopicConfig{})
	tx := must(e.pool.Begin(ctx))(t)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "ids",
		Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("app"), ProducerID: "x"}}}))(t)
	out := goAppend(t, e, "ids", msg(0, "broker", "x"))
	awaitBlockedBy(t, e, int(tx.Conn().PgConn().PID()))
	must(0, tx.Commit(ctx))(t)
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	if p := o.res.Positions[0]; !p.Duplicate || p.Partition != 0 {
		t.Fatalf("broker publish of the application's id: %+v, want a duplicate in partition 0", p)
	}
}

// sequencerAwake reads through q whether settings.sequencer_awake_until is ahead (migration 0020).
func sequencerAwake(t *testing.T, e *Engine, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) bool {
	t.Helper()
	var yes bool
	must(0, q.QueryRow(t.Context(), e.sql(`SELECT value::double precision > extract(epoch FROM clock_timestamp())
		FROM spool.settings WHERE key = 'sequencer_awake_until'`)).Scan(&yes))(t)
	return yes
}

// awaitAwake waits until an instance's sequencer says it is awake.
func awaitAwake(t *testing.T, e *Engine) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "the sequencer says it is awake", func() error {
		if !sequencerAwake(t, e, e.pool) {
			return errors.New("not awake")
		}
		return nil
	})
}

// TestStagingNotifiesOnceAwakeInstanceClosed: an instance that closes while its sequencer is
// awake sets sequencer_awake_until back, so that publishers notify the other instances at once
// (a rolling restart does not leave them polling every poll_interval).
func TestStagingNotifiesOnceAwakeInstanceClosed(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "closing", storage.TopicConfig{})
	tx := stagedPublish(t, e, "closing", 0, "m")
	must(0, tx.Commit(ctx))(t)
	awaitSequenced(t, e)
	awaitAwake(t, e)
	other := must(pgx.Connect(ctx, testURL(t)))(t)
	t.Cleanup(func() { _ = other.Close(context.Background()) })
	must(0, e.Close())(t)
	if sequencerAwake(t, e, other) {
		t.Fatal("sequencer_awake_until still ahead after the awake instance closed")
	}
}

// TestBrokerPublishDoesNotQueueBehindAppProducerID: an application's transaction that claimed a
// producer id and stays open holds up a broker publish of that id for claimLockTimeout only: the
// publish fails alone, retryable (storage.ErrUnavailable), and a publish combined with it in one
// transaction is stored. (Before, the lane's transaction waited until Config.TxTimeout and all
// of its calls failed.)
func TestBrokerPublishDoesNotQueueBehindAppProducerID(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	const topic = "ids.open"
	logTopic(t, e, topic, storage.TopicConfig{})
	app := must(e.pool.Begin(ctx))(t)
	t.Cleanup(func() { _ = app.Rollback(context.Background()) })
	must(e.PublishTx(ctx, app, &storage.MessagesAppendParams{Topic: topic,
		Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("app"), ProducerID: "x"}}}))(t)

	// The two calls queue behind a publish held on the partition row, so one transaction takes both.
	b := lockRows(t, e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
		WHERE t.name = $1 AND p.partition = 0 FOR UPDATE OF p`), topic)
	first := goAppend(t, e, topic, msg(0, "first", ""))
	awaitBlockedBy(t, e, b.pid())
	held := goAppend(t, e, topic, msg(0, "broker", "x"))
	awaitAppendsQueued(t, e, topic, 1)
	plain := goAppend(t, e, topic, msg(0, "plain", ""))
	awaitAppendsQueued(t, e, topic, 2)
	b.release()

	if o := <-first; o.err != nil {
		t.Fatalf("first publish: %v", o.err)
	}
	if o := <-plain; o.err != nil {
		t.Fatalf("a publish combined with the held producer id's, with the application's transaction open: %v", o.err)
	}
	o := <-held
	if !errors.Is(o.err, storage.ErrUnavailable) || !strings.Contains(o.err.Error(), "producer id") {
		t.Fatalf("publish of a producer id an open transaction holds: %+v, want a retryable ErrUnavailable naming the producer id", o)
	}
	if st := app.Conn().PgConn().TxStatus(); st != 'T' {
		t.Fatalf("the application's transaction is %q, want still open", st)
	}
	must(0, app.Commit(ctx))(t)
	o = <-goAppend(t, e, topic, msg(0, "broker", "x"))
	if o.err != nil || !o.res.Positions[0].Duplicate {
		t.Fatalf("the publish again once the application committed: %+v, want a duplicate", o)
	}
}

// TestSequencerLinksTransactionRuns: two transactions stage messages of one partition
// interleaved (A: a1 a2, B: b1 b2, A: a3, B: b3 with keys a and b). Sequenced together, each
// transaction's messages stay consecutive (A first: its first row is older) and its run of one
// key is linked up to its last message, so a batch claim never splits it; a transaction's
// messages of another partition are not linked to those.
func TestSequencerLinksTransactionRuns(t *testing.T) {
	t.Parallel()
	e1, _ := twoInstances(t, time.Minute)
	ctx := t.Context()
	logTopic(t, e1, "tl", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	begin := func() pgx.Tx {
		tx := must(e1.pool.Begin(ctx))(t)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	stage := func(tx pgx.Tx, part int32, key string, payloads ...string) {
		t.Helper()
		var msgs []storage.AppendMessage
		for _, p := range payloads {
			msgs = append(msgs, storage.AppendMessage{Partition: part, Key: []byte(key), Payload: []byte(p)})
		}
		must(e1.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tl", Messages: msgs}))(t)
	}
	// Hold the sequencer off until both committed: take its lock in a transaction of our own.
	hold := begin()
	must(hold.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(e1.schema, "sequencer")))(t)
	txA, txB := begin(), begin()
	stage(txA, 0, "a", "a1", "a2")
	stage(txB, 0, "b", "b1", "b2")
	stage(txA, 0, "a", "a3")
	stage(txA, 1, "a", "x1")
	stage(txB, 0, "b", "b3")
	must(0, txB.Commit(ctx))(t)
	must(0, txA.Commit(ctx))(t)
	must(0, hold.Commit(ctx))(t)
	e1.wakeSequencer()
	awaitSequenced(t, e1)

	type row struct {
		part    int32
		payload string
		linked  bool
	}
	rows := must(e1.pool.Query(ctx, e1.sql(`SELECT m.partition, convert_from(m.payload, 'UTF8'), m.linked FROM spool.messages m
		JOIN spool.topics t ON t.id = m.topic_id WHERE t.name = 'tl' ORDER BY m.partition, m."offset"`)))(t)
	got := must(pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.part, &x.payload, &x.linked)
		return x, err
	}))(t)
	want := []row{{0, "a1", true}, {0, "a2", true}, {0, "a3", false}, {0, "b1", true}, {0, "b2", true}, {0, "b3", false}, {1, "x1", false}}
	if !slices.Equal(got, want) {
		t.Fatalf("log %v, want %v", got, want)
	}
}

// TestSequencerNotStarvedByHandedOverRow: transactions that keep a partition's row held without
// a gap (as a busy lane does: its next transaction waits for the row while the one before
// commits, and PostgreSQL hands the row straight to it) do not keep a committed transactional
// publish of that partition out of the log: after a few skips the sequencer waits for the row.
// Each round queues the next holder behind the open one before committing it. The holders lock
// the row without updating it: an append's UPDATE waiting behind another one lets go of the row
// for an instant when that one commits (it then locks the new version), which a sequencer may
// hit by chance but not reliably (seen: after 4 to 561 rounds). Each round waits for the
// sequencer's next try, so the bound is in tries, not time.
func TestSequencerNotStarvedByHandedOverRow(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	const topic = "busy"
	logTopic(t, e, topic, storage.TopicConfig{})
	lockSQL := e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
		WHERE t.name = $1 AND p.partition = 0 FOR NO KEY UPDATE OF p`)
	begin := func() pgx.Tx {
		tx := must(e.pool.Begin(ctx))(t)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	holder := begin()
	must(holder.Exec(ctx, lockSQL, topic))(t)
	must(0, stagedPublish(t, e, topic, 0, "staged").Commit(ctx))(t)
	for rounds := 1; ; rounds++ {
		next := begin()
		took := make(chan error, 1)
		go func() {
			_, err := next.Exec(ctx, lockSQL, topic)
			took <- err
		}()
		pid := next.Conn().PgConn().PID()
		hpid := holder.Conn().PgConn().PID()
		skips := e.seqSkips.Load()
		// The next holder waits for the row, and the sequencer skipped it once more or waits
		// for it too: its tries fall while the row is held, not in the instant of a hand-over.
		testutil.Eventually(t, 10*time.Second, "the next holder and the sequencer at the row", func() error {
			var next, others int
			// The next holder may wait behind the sequencer (then only it is named).
			err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pid = $1 AND cardinality(pg_blocking_pids(pid)) > 0),
				count(*) FILTER (WHERE pid <> $1 AND pg_blocking_pids(pid) && ARRAY[$1, $2]::int[])
				FROM pg_stat_activity`, pid, hpid).Scan(&next, &others)
			if err != nil {
				return err
			}
			if next == 0 || (others == 0 && e.seqSkips.Load() == skips) {
				return fmt.Errorf("next holder waiting: %d, sequencer waiting: %d, skips: %d", next, others, e.seqSkips.Load()-skips)
			}
			return nil
		})
		must(0, holder.Commit(ctx))(t)
		must(0, <-took)(t)
		holder = next
		var staged int
		must(0, e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.staged")).Scan(&staged))(t)
		if staged == 0 {
			break
		}
		if rounds == 20 { // a wait comes after seqSkipsBeforeWait skips
			t.Fatalf("the staged message is not sequenced after %d rounds handing the row over", rounds)
		}
	}
	must(0, holder.Commit(ctx))(t)
	ms := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: 0, Limit: 10}))(t)
	if len(ms) != 1 || ms[0].Offset != 0 || string(ms[0].Payload) != "staged" {
		t.Fatalf("partition holds %v, want the staged message at offset 0", ms)
	}
}

// TestStagingQuietWhileSequencerAwake (migration 0020): once a sequencer took staged messages,
// staging transactions (PublishTx and spool.publish) commit without a NOTIFY, which would take a
// database-wide lock through their commit's flush, and their messages are still sequenced (the
// awake instance looks every few milliseconds); once no instance is awake they notify again.
// Notifications of different transactions arrive in commit order, so a sentinel sent after a
// commit tells whether that commit notified.
func TestStagingQuietWhileSequencerAwake(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, storagetest.NewFakeClock(logBase))
	cfg.PollInterval = time.Minute // what is sequenced within the test: woken, or by the awake polling
	e := logOpen(t, cfg)
	ctx := t.Context()
	logTopic(t, e, "quiet", storage.TopicConfig{})
	listener := must(pgx.Connect(ctx, testURL(t)))(t)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	must(listener.Exec(ctx, "LISTEN "+pgx.Identifier{e.channel()}.Sanitize()))(t)
	sentinel := 0
	// notified commits a staging transaction made by stage and reports whether it notified.
	notified := func(stage func(tx pgx.Tx)) bool {
		t.Helper()
		tx := must(e.pool.Begin(ctx))(t)
		stage(tx)
		must(0, tx.Commit(ctx))(t)
		sentinel++
		mark := fmt.Sprintf("sentinel-%d", sentinel)
		must(e.pool.Exec(ctx, "SELECT pg_notify($1, $2)", e.channel(), mark))(t)
		staged := false
		for {
			n := must(listener.WaitForNotification(ctx))(t)
			switch n.Payload {
			case stagedPayload:
				staged = true
			case mark:
				return staged
			}
		}
	}
	publishTx := func(tx pgx.Tx) {
		must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "quiet",
			Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("go")}}}))(t)
	}
	publishSQL := func(tx pgx.Tx) {
		must(tx.Exec(ctx, e.sql("SELECT * FROM spool.publish('quiet', 'sql'::bytea)")))(t)
	}
	sleep := func() {
		must(e.pool.Exec(ctx, e.sql("UPDATE spool.settings SET value = '0' WHERE key = 'sequencer_awake_until'")))(t)
	}

	if !notified(publishTx) {
		t.Fatal("a staging transaction with no sequencer awake did not notify")
	}
	awaitSequenced(t, e)
	awaitAwake(t, e)
	for i, stage := range []func(pgx.Tx){publishTx, publishSQL} {
		if notified(stage) {
			t.Fatalf("staging %d notified while a sequencer is awake", i)
		}
		awaitSequenced(t, e) // by the awake sequencer, without a notification
	}
	stored := 3
	for i, stage := range []func(pgx.Tx){publishTx, publishSQL} {
		// The sequencer may say it is awake once more right after the rows it took last (it
		// renews the time after sequencing): then the next try finds it asleep.
		ok := false
		for try := 0; try < 2 && !ok; try++ {
			sleep()
			ok = notified(stage)
			stored++
			awaitSequenced(t, e)
		}
		if !ok {
			t.Fatalf("staging %d did not notify with no sequencer awake", i)
		}
	}
	got := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "quiet", Limit: 10}))(t)
	if len(got) != stored {
		t.Fatalf("%d messages in the log, want the %d staged", len(got), stored)
	}

}

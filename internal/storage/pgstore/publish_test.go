package pgstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestPublishTxRollbackLeavesNothing: a rolled-back PublishTx leaves no message and consumes no
// offset; the next publish gets the same offsets.
func TestPublishTxRollbackLeavesNothing(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "tx.rb", storage.TopicConfig{Partitions: 2})
	tx := must(e.pool.Begin(ctx))(t)
	res := must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.rb", Messages: []storage.AppendMessage{
		{Partition: 0, Payload: []byte("a")}, {Partition: 1, Payload: []byte("b")}, {Partition: 1, Payload: []byte("c")}}}))(t)
	if p := res.Positions; p[0].Partition != 0 || p[1].Partition != 1 || p[2].Partition != 1 || p[2].Offset != -1 {
		t.Fatalf("positions %+v", res.Positions)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var staged int
	if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.staged")).Scan(&staged); err != nil || staged != 0 {
		t.Fatalf("staged rows after rollback: %d (%v)", staged, err)
	}
	st := must(e.TopicStats(ctx, "tx.rb"))(t)
	if st.Messages != 0 || st.Bytes != 0 || st.Partitions[0].HighWater != 0 || st.Partitions[1].HighWater != 0 {
		t.Fatalf("stats after rollback: %+v", st)
	}
	for p := range int32(2) {
		if ms := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "tx.rb", Partition: p}))(t); len(ms) != 0 {
			t.Fatalf("partition %d after rollback: %+v", p, ms)
		}
	}
	pos := logPublish(t, e, "tx.rb", 1, "d")
	if pos[0].Offset != 0 {
		t.Fatalf("offset after rollback: %d, want 0", pos[0].Offset)
	}
}

// TestPublishTxCommitDelivers: messages published in a transaction are invisible until it
// commits, then delivered; the instance is woken through the NOTIFY sent inside the transaction.
// A failing PublishTx leaves the caller's transaction usable.
func TestPublishTxCommitDelivers(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "tx.ok", storage.TopicConfig{})
	q := must(e.SubscriptionGetByGroup(ctx, "tx.ok", storage.QueueGroup))(t)
	notes := make(chan storage.Notification, 64)
	defer e.NotifyRegister(func(n storage.Notification) {
		select {
		case notes <- n:
		default:
		}
	})()

	tx := must(e.pool.Begin(ctx))(t)
	defer tx.Rollback(context.Background())
	must(tx.Exec(ctx, e.sql("CREATE TABLE spool.app_orders (id int)")))(t)
	must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.ok", Messages: []storage.AppendMessage{
		{Partition: storage.PartitionAuto, Payload: []byte("one"), Headers: map[string]string{"h": "v"}},
		{Partition: storage.PartitionAuto, Payload: []byte("two")}}}))(t)
	_, err := e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.ok", Messages: []storage.AppendMessage{
		{Partition: 5, Payload: []byte("bad")}}})
	if !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("PublishTx to a bad partition: %v", err)
	}
	_, err = e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.none", Messages: []storage.AppendMessage{
		{Partition: storage.PartitionAuto, Payload: []byte("x")}}})
	if !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("PublishTx to an unknown topic: %v", err)
	}
	must(tx.Exec(ctx, e.sql("INSERT INTO spool.app_orders VALUES (1)")))(t) // the transaction is still usable
	equalStrings(t, claimPayloads(t, e, q.ID), nil, "claims before commit")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	awaitNotification(t, notes, storage.Notification{Kind: storage.NotifyMessages, Topic: "tx.ok"})
	equalStrings(t, claimPayloads(t, e, q.ID), []string{"0:0=one", "0:1=two"}, "claims after commit")
	ms := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "tx.ok"}))(t)
	if len(ms) != 2 || ms[0].Headers["h"] != "v" {
		t.Fatalf("read after commit: %+v", ms)
	}
}

// psqlPath finds the real psql client: on PATH, else next to $SPOOL_TEST_PG_CTL (the server
// binaries scripts/test.sh uses). Without it the test is skipped, or fails when
// SPOOL_TEST_REQUIRE_PG=1 (CI): the SQL function must be shown working from psql there.
func psqlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	if ctl := os.Getenv("SPOOL_TEST_PG_CTL"); ctl != "" {
		if p := filepath.Join(filepath.Dir(ctl), "psql"); fileExists(p) {
			return p
		}
	}
	if os.Getenv("SPOOL_TEST_REQUIRE_PG") == "1" {
		t.Fatal("psql not found (PATH, next to $SPOOL_TEST_PG_CTL) but SPOOL_TEST_REQUIRE_PG=1")
	}
	t.Skip("psql not installed")
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// clientSQL runs SQL through the real psql binary (unaligned, tuples only, stop on error) on the
// test database and returns its output.
func clientSQL(t *testing.T, sql string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), psqlPath(t), testURL(t), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("psql: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// TestPublishSQLFunction calls spool.publish from the real psql (clientSQL) and reads the messages
// through the engine: keyed messages land where storage.PartitionForKey puts them, explicit
// partitions, headers and the other fields are stored once sequenced (gapless), a
// producer id repeated is a duplicate, a rolled-back call leaves nothing, and errors are clear.
func TestPublishSQLFunction(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	const parts = 5
	logTopic(t, e, "sql.t", storage.TopicConfig{Partitions: parts, MaxMessageBytes: 100})
	fn := e.schema + ".publish"

	// The function stages the message: its offset and time are NULL, known once sequenced.
	out, err := clientSQL(t, fmt.Sprintf(`SELECT partition, "offset" IS NULL, published_at IS NULL, duplicate FROM %s('sql.t', 'first'::bytea, to_partition => 3)`, fn))
	if err != nil {
		t.Fatal(err)
	}
	if out != "3|t|t|f" {
		t.Fatalf("explicit partition: %q, want 3|t|t|f", out)
	}
	next := make([]int64, parts)
	next[3] = 1
	for i := range 12 {
		key := fmt.Sprintf("key-%d", i)
		out, err := clientSQL(t, fmt.Sprintf(`SELECT partition FROM %s('sql.t', convert_to('p%d', 'UTF8'), convert_to('%s', 'UTF8'), '{"h":"v%d"}')`,
			fn, i, key, i))
		if err != nil {
			t.Fatal(err)
		}
		want := storage.PartitionForKey([]byte(key), parts)
		if out != strconv.Itoa(int(want)) {
			t.Fatalf("key %q: got partition %q, want %d", key, out, want)
		}
		next[want]++
	}
	// Inside a transaction that rolls back: nothing.
	if _, err := clientSQL(t, fmt.Sprintf(`BEGIN; SELECT * FROM %s('sql.t', 'gone'::bytea, to_partition => 0); ROLLBACK;`, fn)); err != nil {
		t.Fatal(err)
	}
	// Keyless: some partition; producer id and expiry stored.
	out, err = clientSQL(t, fmt.Sprintf(`SELECT partition FROM %s('sql.t', 'free'::bytea, producer_id => 'prod-1',
		expires_at => '2099-01-01 00:00:00+00')`, fn))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := strconv.Atoi(out)
	if err != nil || kp < 0 || kp >= parts {
		t.Fatalf("keyless: %q", out)
	}
	next[kp]++
	// The same producer id again: a duplicate of the first, with its position once sequenced.
	awaitSequenced(t, e)
	out, err = clientSQL(t, fmt.Sprintf(`SELECT partition || ' ' || "offset" || ' ' || duplicate FROM %s('sql.t', 'free'::bytea, producer_id => 'prod-1')`, fn))
	if err != nil || out != fmt.Sprintf("%d %d true", kp, next[kp]-1) {
		t.Fatalf("a repeated producer id: %q (%v), want %d %d true", out, err, kp, next[kp]-1)
	}

	for _, c := range []struct{ sql, want string }{
		{fmt.Sprintf(`SELECT * FROM %s('sql.none', 'x'::bytea)`, fn), `topic "sql.none" not found`},
		{fmt.Sprintf(`SELECT * FROM %s('sql.t', 'x'::bytea, to_partition => 5)`, fn), "partition 5 out of range"},
		{fmt.Sprintf(`SELECT * FROM %s('sql.t', convert_to(repeat('x', 101), 'UTF8'))`, fn), "is 101 bytes"},
		{fmt.Sprintf(`SELECT * FROM %s('sql.t', 'x'::bytea, headers => '{"n": 1}')`, fn), "header values must be strings"},
	} {
		out, err := clientSQL(t, c.sql)
		if err == nil || !strings.Contains(out, c.want) {
			t.Fatalf("%s: got %q (%v), want an error containing %q", c.sql, out, err, c.want)
		}
	}

	awaitSequenced(t, e)
	st := must(e.TopicStats(ctx, "sql.t"))(t)
	for p := range parts {
		if st.Partitions[p].HighWater != next[p] {
			t.Fatalf("partition %d: high water %d, want %d", p, st.Partitions[p].HighWater, next[p])
		}
		ms := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "sql.t", Partition: int32(p)}))(t)
		if int64(len(ms)) != next[p] {
			t.Fatalf("partition %d: read %d messages, want %d", p, len(ms), next[p])
		}
		for _, m := range ms {
			if len(m.Key) > 0 && storage.PartitionForKey(m.Key, parts) != int32(p) {
				t.Fatalf("key %q stored in partition %d", m.Key, p)
			}
			if len(m.Key) > 0 && m.Headers["h"] != "v"+strings.TrimPrefix(string(m.Payload), "p") {
				t.Fatalf("message %s: headers %v", m.Payload, m.Headers)
			}
			if string(m.Payload) == "free" && (m.ProducerID != "prod-1" || m.ExpiresAt.Year() != 2099) {
				t.Fatalf("keyless message: %+v", m)
			}
		}
	}
	// The engine's own publishes continue after the function's.
	pos := logPublish(t, e, "sql.t", 3, "engine")
	if pos[0].Offset != next[3] {
		t.Fatalf("engine publish after SQL: offset %d, want %d", pos[0].Offset, next[3])
	}
	q := must(e.SubscriptionGetByGroup(ctx, "sql.t", storage.QueueGroup))(t)
	if got := claimPayloads(t, e, q.ID); int64(len(got)) != st.Messages+1 {
		t.Fatalf("claimed %d messages, want %d: %q", len(got), st.Messages+1, got)
	}
}

// TestPublishTxDedup: PublishTx de-duplicates by producer id like MessagesAppend: inside one
// transaction, against a committed copy, and a rolled-back transaction leaves its ids unclaimed.
func TestPublishTxDedup(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "tx.dd", storage.TopicConfig{Partitions: 2})
	msg := func(id, payload string) storage.AppendMessage {
		return storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte(payload), ProducerID: id}
	}
	publishTx := func(msgs ...storage.AppendMessage) []storage.MessagePosition {
		t.Helper()
		tx := must(e.pool.Begin(ctx))(t)
		defer tx.Rollback(context.Background())
		res := must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.dd", Messages: msgs}))(t)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return res.Positions
	}
	tx := must(e.pool.Begin(ctx))(t)
	must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.dd", Messages: []storage.AppendMessage{msg("a", "rolled back")}}))(t)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	tx = must(e.pool.Begin(ctx))(t)
	first := must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.dd", Messages: []storage.AppendMessage{msg("a", "1"), msg("b", "2")}}))(t).Positions
	again := must(e.PublishTx(ctx, tx, &storage.MessagesAppendParams{Topic: "tx.dd", Messages: []storage.AppendMessage{msg("b", "3")}}))(t).Positions
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if first[0].Duplicate || first[1].Duplicate {
		t.Fatalf("first copies marked duplicate (the rolled-back id must not count): %+v", first)
	}
	if !again[0].Duplicate || again[0].Offset != first[1].Offset || again[0].Partition != first[1].Partition {
		t.Fatalf("b again in the same transaction: %+v, want the duplicate of %+v", again[0], first[1])
	}
	awaitSequenced(t, e)
	stored := map[string]storage.MessagePosition{}
	for p := range int32(2) {
		for _, m := range must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "tx.dd", Partition: p}))(t) {
			stored[m.ProducerID] = storage.MessagePosition{Partition: m.Partition, Offset: m.Offset, PublishedAt: m.PublishedAt, Duplicate: true}
		}
	}
	later := publishTx(msg("a", "4"), msg("c", "5"))
	if !later[0].Duplicate || later[0] != stored["a"] || later[1].Duplicate {
		t.Fatalf("a again, c new, in a later transaction: %+v, want a's stored position %+v", later, stored["a"])
	}
	awaitSequenced(t, e)
	st := must(e.TopicStats(ctx, "tx.dd"))(t)
	if st.Messages != 3 {
		t.Fatalf("messages stored: %d, want 3 (a, b, c)", st.Messages)
	}
}

// TestProducerIDsPruned: maintenance deletes the producer ids whose window ended, and only those:
// spool.producer_ids stays bounded by the window.
func TestProducerIDsPruned(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "pr.short", storage.TopicConfig{DedupWindow: time.Minute})
	logTopic(t, e, "pr.long", storage.TopicConfig{DedupWindow: time.Hour})
	for _, topic := range []string{"pr.short", "pr.long"} {
		var msgs []storage.AppendMessage
		for i := range 20 {
			msgs = append(msgs, storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("x"), ProducerID: fmt.Sprintf("id-%d", i)})
		}
		must(e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: topic, Messages: msgs}))(t)
	}
	count := func() int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.producer_ids")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 40 {
		t.Fatalf("producer ids: %d, want 40", n)
	}
	clock.Advance(time.Minute)
	// One instance prunes at a time: this call skips the job while the engine's maintenance loop
	// holds it (that run may have read the clock before the advance), so call again until done.
	testutil.Eventually(t, 30*time.Second, "the short window's ids pruned", func() error {
		if err := e.maintain(ctx); err != nil {
			t.Fatal(err)
		}
		if n := count(); n != 20 {
			return fmt.Errorf("producer ids after the short window: %d, want the long topic's 20", n)
		}
		return nil
	})
	if n := count(); n != 20 {
		t.Fatalf("producer ids: %d, want the long topic's 20", n)
	}
}

// TestProducerIDsPruneBatchesAndLocks: the prune deletes expired ids in batches, skips the rows a
// publish holds (it never waits for one) and runs on one instance at a time (it skips the job
// while another holds its advisory lock).
func TestProducerIDsPruneBatchesAndLocks(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "pb.short", storage.TopicConfig{DedupWindow: time.Minute})
	var msgs []storage.AppendMessage
	for i := range 10 {
		msgs = append(msgs, storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("x"), ProducerID: fmt.Sprintf("id-%d", i)})
	}
	must(e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "pb.short", Messages: msgs}))(t)
	count := func() int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.producer_ids")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Another instance prunes (it holds the job's lock), and a publish holds id-0 (taking it
	// over); both before the ids expire, so that this engine's own maintenance loop cannot prune
	// first.
	other, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) // a no-op once rolled back below
	// Waits for a run of the maintenance loop that holds it.
	if _, err := other.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(e.schema, "producer_ids")); err != nil {
		t.Fatalf("taking the prune lock: %v", err)
	}
	pub, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Rollback(ctx)
	if _, err := pub.Exec(ctx, e.sql("SELECT 1 FROM spool.producer_ids WHERE producer_id = 'id-0' FOR UPDATE")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	now := clock.Now()
	if err := e.pruneProducerIDs(ctx, now, 3); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 10 {
		t.Fatalf("producer ids after a prune while another instance holds the job: %d, want 10", n)
	}
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// The job is free: the 9 ids nobody holds go, 3 at a time (this call, or the maintenance loop
	// that got the job first), the held one stays. The timeout only reports a prune that waits
	// for the held row.
	testutil.Eventually(t, 30*time.Second, "the 9 ids nobody holds pruned", func() error {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := e.pruneProducerIDs(pctx, now, 3); err != nil {
			t.Fatalf("prune beside a publish holding an id: %v (it waited for the row)", err)
		}
		if n := count(); n != 1 {
			return fmt.Errorf("%d producer ids left, want 1 (the held one)", n)
		}
		return nil
	})
}

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

	"github.com/spoolmq/spool/internal/storage"
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
	if res.Positions[2].Offset != 1 {
		t.Fatalf("positions %+v", res.Positions)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
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
// partitions, headers and the other fields are stored, a rolled-back call leaves nothing, errors
// are clear, and the bucket of the database's (real) time is created by the function.
func TestPublishSQLFunction(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	const parts = 5
	logTopic(t, e, "sql.t", storage.TopicConfig{Partitions: parts, MaxMessageBytes: 100})
	fn := e.schema + ".publish"

	// First publish: the partitions have no time yet, so the database clock (today) is used and
	// its bucket does not exist: the function creates it.
	out, err := clientSQL(t, fmt.Sprintf(`SELECT partition, "offset" FROM %s('sql.t', 'first'::bytea, to_partition => 3)`, fn))
	if err != nil {
		t.Fatal(err)
	}
	if out != "3|0" {
		t.Fatalf("explicit partition: %q, want 3|0", out)
	}
	next := make([]int64, parts)
	next[3] = 1
	for i := range 12 {
		key := fmt.Sprintf("key-%d", i)
		out, err := clientSQL(t, fmt.Sprintf(`SELECT partition || ' ' || "offset" FROM %s('sql.t', convert_to('p%d', 'UTF8'), convert_to('%s', 'UTF8'), '{"h":"v%d"}')`,
			fn, i, key, i))
		if err != nil {
			t.Fatal(err)
		}
		want := storage.PartitionForKey([]byte(key), parts)
		if out != fmt.Sprintf("%d %d", want, next[want]) {
			t.Fatalf("key %q: got %q, want partition %d offset %d", key, out, want, next[want])
		}
		next[want]++
	}
	// Inside a transaction that rolls back: nothing.
	if _, err := clientSQL(t, fmt.Sprintf(`BEGIN; SELECT * FROM %s('sql.t', 'gone'::bytea, to_partition => 0); ROLLBACK;`, fn)); err != nil {
		t.Fatal(err)
	}
	// Keyless: some partition; producer id and expiry stored.
	out, err = clientSQL(t, fmt.Sprintf(`SELECT partition || ' ' || "offset" FROM %s('sql.t', 'free'::bytea, producer_id => 'prod-1',
		expires_at => '2099-01-01 00:00:00+00')`, fn))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(out)
	kp, _ := strconv.Atoi(fields[0])
	if len(fields) != 2 || fields[1] != strconv.FormatInt(next[kp], 10) {
		t.Fatalf("keyless: %q", out)
	}
	next[kp]++

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

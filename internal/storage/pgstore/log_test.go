package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
)

// logBase is where the log tests' fake clocks start (whole seconds, like the suite's).
var logBase = time.Date(2031, time.March, 14, 9, 26, 53, 0, time.UTC)

// logOpen opens an engine on cfg and closes it at the end of the test.
// openConns opens an engine on a fresh schema with a pool of conns connections.
func openConns(t testing.TB, conns int) *Engine {
	t.Helper()
	cfg := testConfig(t, nil)
	cfg.MaxConns = int32(conns)
	return logOpen(t, cfg)
}

func logOpen(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := Open(t.Context(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e
}

// logEngine opens an engine on a fresh schema with a fake clock.
func logEngine(t *testing.T) (*Engine, *storagetest.FakeClock) {
	t.Helper()
	clock := storagetest.NewFakeClock(logBase)
	return logOpen(t, testConfig(t, clock)), clock
}

// must fails the test on err: must(f())(t).
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func logTopic(t *testing.T, e *Engine, name string, cfg storage.TopicConfig) {
	t.Helper()
	must(e.TopicCreate(t.Context(), &storage.TopicCreateParams{Name: name, Config: cfg}))(t)
}

func logSub(t *testing.T, e *Engine, topic, group string) *storage.Subscription {
	t.Helper()
	return must(e.SubscriptionCreate(t.Context(), &storage.SubscriptionCreateParams{Topic: topic, Group: group,
		Start: storage.StartPosition{Kind: storage.FromBeginning}}))(t)
}

func logPublish(t *testing.T, e *Engine, topic string, part int32, payloads ...string) []storage.MessagePosition {
	t.Helper()
	var msgs []storage.AppendMessage
	for _, p := range payloads {
		msgs = append(msgs, storage.AppendMessage{Partition: part, Payload: []byte(p)})
	}
	return must(e.MessagesAppend(t.Context(), &storage.MessagesAppendParams{Topic: topic, Messages: msgs}))(t).Positions
}

// claimPayloads claims everything claimable for a subscription and returns "partition:offset=payload".
func claimPayloads(t *testing.T, e *Engine, sub int64) []string {
	t.Helper()
	res := must(e.DeliveriesClaim(t.Context(), &storage.DeliveriesClaimParams{SubscriptionID: sub, Member: "m", Max: 100}))(t)
	var out []string
	var refs []storage.DeliveryRef
	for _, d := range res.Deliveries {
		out = append(out, fmt.Sprintf("%d:%d=%s", d.Partition, d.Offset, d.Payload))
		refs = append(refs, d.Ref())
	}
	if len(refs) > 0 {
		must(e.DeliveriesAck(t.Context(), &storage.DeliveriesAckParams{SubscriptionID: sub, Member: "m", Refs: refs}))(t)
	}
	return out
}

func equalStrings(t *testing.T, got, want []string, what string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: got %q, want %q", what, got, want)
	}
}

// backendPID returns the PostgreSQL backend of a transaction.
func backendPID(t *testing.T, tx pgx.Tx) int {
	t.Helper()
	var pid int
	if err := tx.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// awaitBlockedBy polls until some backend waits for a lock held by pid.
func awaitBlockedBy(t *testing.T, e *Engine, pid int) {
	t.Helper()
	awaitWaiters(t, e, pid, true)
}

// waitersOf counts the backends that wait for a lock held by backend pid.
func waitersOf(t *testing.T, e *Engine, pid int) (int, error) {
	var n int
	err := e.pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", pid).Scan(&n)
	return n, err
}

// awaitWaiters polls until some backend waits for a lock held by pid (waiting) or none does.
func awaitWaiters(t *testing.T, e *Engine, pid int, waiting bool) {
	t.Helper()
	what := fmt.Sprintf("a backend waiting for backend %d", pid)
	if !waiting {
		what = fmt.Sprintf("no backend waiting for backend %d", pid)
	}
	testutil.Eventually(t, 10*time.Second, what, func() error {
		n, err := waitersOf(t, e, pid)
		if err != nil {
			return err
		}
		if waiting && n == 0 {
			return errors.New("none yet")
		}
		if !waiting && n > 0 {
			return fmt.Errorf("%d still waiting", n)
		}
		return nil
	})
}

// TestMessagesAppendTimeout: a publish whose transaction waits for a row another session holds
// fails after Config.TxTimeout with a retryable TIMEOUT instead of waiting for that session, and
// stores nothing: once the session lets go, the partition's high-water mark has not moved, a read
// finds no trace of it, and the next publish takes the offset the timed-out one would have taken.
// The held row is first the topic's (a publish that does not remember the topic waits in its
// first batch, for its FOR SHARE lock), then the partition's (it waits in its last batch, the one
// carrying the COMMIT; the test lets go only once PostgreSQL cancelled the wait, so that the
// outcome is known: rolled back).
func TestMessagesAppendTimeout(t *testing.T) {
	t.Parallel()
	e := openTxTimeout(t, 4)
	ctx := t.Context()
	logTopic(t, e, "pub.t", storage.TopicConfig{Semantics: storage.PubSub})
	logPublish(t, e, "pub.t", 0, "a")
	publish := func() (*storage.MessagesAppendResult, error) {
		return e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "pub.t",
			Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("lost")}}})
	}
	read := func() []string {
		var out []string
		for _, m := range must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "pub.t", Partition: 0}))(t) {
			out = append(out, fmt.Sprintf("%d=%s", m.Offset, m.Payload))
		}
		return out
	}
	for _, held := range []struct{ what, query string }{
		{"the topic row", `SELECT 1 FROM spool.topics WHERE name = $1 FOR UPDATE`},
		{"the partition row", `SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
			WHERE t.name = $1 AND p.partition = 0 FOR UPDATE OF p`},
	} {
		if held.what == "the topic row" {
			e.forgetTopic("pub.t") // a remembered topic is checked under the partition row's lock only
		} else if err := e.checkAppend(&storage.MessagesAppendParams{Topic: "pub.t"}); err != nil { // remembers it
			t.Fatal(err)
		}
		b := lockRows(t, e.sql(held.query), "pub.t")
		t0 := time.Now()
		checkTimeoutErr(t, awaitOut(t, goOp("publish", publish), t0, "the publish waiting for "+held.what))
		awaitWaiters(t, e, b.pid(), false)
		checkPoolIdle(t, e)
		b.release()

		ts := must(e.TopicStats(ctx, "pub.t"))(t)
		if hw := ts.Partitions[0].HighWater; hw != 1 {
			t.Fatalf("after the publish that waited for %s timed out: high-water mark %d, want 1", held.what, hw)
		}
		equalStrings(t, read(), []string{"0=a"}, "partition 0 after the publish that waited for "+held.what+" timed out")
	}

	pos := logPublish(t, e, "pub.t", 0, "b")
	if pos[0].Offset != 1 {
		t.Fatalf("publish after the blockers let go: offset %d, want 1", pos[0].Offset)
	}
	equalStrings(t, read(), []string{"0=a", "1=b"}, "partition 0 after the last publish")
}

// TestLogCommitOrderTwoPartitions: with A on partition 0 and B on partition 1, B does not wait; it
// is consumed while A is open, and A is still delivered to every group after it commits.
func TestLogCommitOrderTwoPartitions(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "order2", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	g1 := logSub(t, e, "order2", "g1")
	g2 := logSub(t, e, "order2", "g2")

	txA := must(e.pool.Begin(ctx))(t)
	defer txA.Rollback(context.Background())
	must(e.PublishTx(ctx, txA, &storage.MessagesAppendParams{Topic: "order2",
		Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("A")}}}))(t)

	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := e.MessagesAppend(bctx, &storage.MessagesAppendParams{Topic: "order2",
		Messages: []storage.AppendMessage{{Partition: 1, Payload: []byte("B")}}}); err != nil {
		t.Fatalf("B to another partition while A is open: %v", err)
	}
	for _, g := range []*storage.Subscription{g1, g2} {
		equalStrings(t, claimPayloads(t, e, g.ID), []string{"1:0=B"}, "group "+g.Group+" before A commits")
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	awaitSequenced(t, e)
	for _, g := range []*storage.Subscription{g1, g2} {
		equalStrings(t, claimPayloads(t, e, g.ID), []string{"0:0=A"}, "group "+g.Group+" after A commits")
	}
}

// TestLogConcurrentPublishersGapless: concurrent multi-partition publishers never deadlock
// (partition rows are locked in order) and leave gapless offsets with non-decreasing times.
func TestLogConcurrentPublishersGapless(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	logTopic(t, e, "many", storage.TopicConfig{Partitions: 3})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 10 {
				var msgs []storage.AppendMessage
				for j := range 5 {
					msgs = append(msgs, storage.AppendMessage{Partition: int32((w + i + j) % 3), Payload: []byte("x")})
				}
				if _, err := e.MessagesAppend(t.Context(), &storage.MessagesAppendParams{Topic: "many", Messages: msgs}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := must(e.TopicStats(t.Context(), "many"))(t)
	if st.Messages != 400 {
		t.Fatalf("messages %d, want 400", st.Messages)
	}
	for p := range int32(3) {
		ms := must(e.MessagesRead(t.Context(), &storage.MessagesReadParams{Topic: "many", Partition: p, Limit: 1000}))(t)
		for i, m := range ms {
			if m.Offset != int64(i) {
				t.Fatalf("partition %d: offset %d at index %d", p, m.Offset, i)
			}
		}
		if int64(len(ms)) != st.Partitions[p].HighWater {
			t.Fatalf("partition %d: read %d, high water %d", p, len(ms), st.Partitions[p].HighWater)
		}
	}
}

// bucketNames lists the registered buckets.
func bucketNames(t *testing.T, e *Engine) []string {
	t.Helper()
	rows := must(e.pool.Query(t.Context(), e.sql("SELECT name FROM spool.buckets ORDER BY start_at")))(t)
	return must(pgx.CollectRows(rows, pgx.RowTo[string]))(t)
}

func tableExists(t *testing.T, e *Engine, name string) bool {
	t.Helper()
	var ok bool
	if err := e.pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", e.schema+"."+name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// dropSoon is a PUB_SUB topic whose messages retention removes a minute after their publish.
var dropSoon = storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Minute,
	ZeroSubscriptionRetention: time.Minute, MaxRetention: 48 * time.Hour}

// TestRetentionWaitsForBucketLock: retention waits for the bucket lock that a bucket's creation
// (this instance's maintenance making the next bucket, or another instance) holds for a moment,
// and then drops what it may, instead of skipping its drops for the run.
func TestRetentionWaitsForBucketLock(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	old := bucketName(e.bucketStart(clock.Now()))
	logTopic(t, e, "drop", dropSoon)
	logPublish(t, e, "drop", 0, "a")
	clock.Advance(3 * time.Hour)
	logPublish(t, e, "drop", 0, "b")
	b := lockRows(t, e.sql(bucketLockSQL))
	done := make(chan error, 1)
	go func() {
		_, err := e.RetentionApply(ctx)
		done <- err
	}()
	awaitBlockedBy(t, e, b.pid())
	b.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if contains(bucketNames(t, e), old) || tableExists(t, e, old) {
		t.Fatalf("bucket %s kept: retention skipped it while the bucket lock was held", old)
	}
}

// TestLogBucketsCreatedForAnyTimeAndDropped: buckets are created on demand for any clock time;
// retention drops a bucket once no partition retains a message in it, and keeps it while one
// does.
func TestLogBucketsCreatedForAnyTimeAndDropped(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	old := bucketName(e.bucketStart(clock.Now()))
	logTopic(t, e, "drop", dropSoon)
	logTopic(t, e, "keep", storage.TopicConfig{})
	logPublish(t, e, "drop", 0, "a", "b", "c")
	logPublish(t, e, "keep", 0, "k")

	clock.Advance(3 * time.Hour)
	logPublish(t, e, "drop", 0, "d")
	cur := bucketName(e.bucketStart(clock.Now()))
	if !contains(bucketNames(t, e), old) || !contains(bucketNames(t, e), cur) {
		t.Fatalf("buckets %v, want %s and %s", bucketNames(t, e), old, cur)
	}

	res := must(e.RetentionApply(ctx))(t)
	if res.MessagesDeleted != 3 || res.MessagesExpired != 0 || res.BytesDeleted <= 0 {
		t.Fatalf("retention: %+v, want 3 deleted", *res)
	}
	if !contains(bucketNames(t, e), old) || !tableExists(t, e, old) {
		t.Fatalf("bucket %s dropped while topic keep retains a message in it", old)
	}
	ms := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "drop"}))(t)
	if len(ms) != 1 || string(ms[0].Payload) != "d" || ms[0].Offset != 3 {
		t.Fatalf("drop after retention: %+v", ms)
	}

	if err := e.TopicDelete(ctx, &storage.TopicDeleteParams{Name: "keep", Force: true}); err != nil {
		t.Fatal(err)
	}
	must(e.RetentionApply(ctx))(t)
	if contains(bucketNames(t, e), old) || tableExists(t, e, old) {
		t.Fatalf("bucket %s kept after its last retained message went", old)
	}
	if !contains(bucketNames(t, e), cur) {
		t.Fatalf("current bucket %s dropped", cur)
	}
	ms = must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "drop"}))(t)
	if len(ms) != 1 || string(ms[0].Payload) != "d" {
		t.Fatalf("drop after bucket drop: %+v", ms)
	}

	// A publish into the dropped bucket's time (a clock far behind) creates it again.
	clock.Set(logBase)
	logTopic(t, e, "late", storage.TopicConfig{})
	logPublish(t, e, "late", 0, "late")
	if !contains(bucketNames(t, e), old) {
		t.Fatalf("bucket %s not recreated for a publish in its range", old)
	}
	ms = must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "late"}))(t)
	if len(ms) != 1 || !ms[0].PublishedAt.Equal(logBase) {
		t.Fatalf("late: %+v", ms)
	}
	// The statements that name a bucket are not kept in the engine's SQL cache: one per bucket
	// would grow it for the life of the process.
	if e.schema == DefaultSchema {
		t.Fatal("the test engine must use a schema of its own (the cache is not used otherwise)")
	}
	e.queries.Range(func(k, _ any) bool {
		if q := k.(string); strings.Contains(q, old) || strings.Contains(q, cur) {
			t.Errorf("cached statement names a bucket: %.120s", q)
		}
		return true
	})
}

// TestLogBucketDropLeftByStoppedInstance: an instance that stopped between removing a bucket from
// spool.buckets and dropping its table (attached still, detached, or dropped without saying so)
// left a row in spool.bucket_drops; the next retention run of another instance finishes it (the
// table is dropped, the row goes) and a publish in that time range is stored again. The row of a
// live instance's drop in progress is left alone.
func TestLogBucketDropLeftByStoppedInstance(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "drop", dropSoon)
	var names []string
	for range 4 { // four buckets, an hour apart
		names = append(names, bucketName(e.bucketStart(clock.Now())))
		logPublish(t, e, "drop", 0, "m")
		clock.Advance(time.Hour)
	}
	logPublish(t, e, "drop", 0, "now")
	// What each stopped instance left: the bucket unlisted, its drop recorded for an instance that
	// is gone (or, for names[3], for this live instance: in progress), and its table attached
	// (names[0], names[3]), detached (names[1]) or dropped (names[2]).
	gone := pgtype.UUID{Bytes: [16]byte{0: 1, 6: 0x40, 8: 0x80}, Valid: true}
	for i, name := range names {
		inst := gone
		if i == 3 {
			inst = e.instanceUUID()
		}
		if _, err := e.pool.Exec(ctx, e.sql(`WITH b AS (DELETE FROM spool.buckets WHERE name = $1 RETURNING name, start_at, end_at)
			INSERT INTO spool.bucket_drops SELECT name, start_at, end_at, $2::uuid FROM b`), name, inst); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, e.sql("ALTER TABLE spool.messages DETACH PARTITION spool."+names[1])); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, e.sql("DROP TABLE spool."+names[2])); err != nil {
		t.Fatal(err)
	}
	if err := e.TopicDelete(ctx, &storage.TopicDeleteParams{Name: "drop", Force: true}); err != nil {
		t.Fatal(err) // nothing retained in them any more
	}

	must(e.RetentionApply(ctx))(t)
	for _, name := range names[:3] {
		if tableExists(t, e, name) {
			t.Errorf("bucket %s left by a stopped instance: table still there", name)
		}
	}
	var drops []string
	rows := must(e.pool.Query(ctx, e.sql("SELECT name FROM spool.bucket_drops ORDER BY name")))(t)
	drops = must(pgx.CollectRows(rows, pgx.RowTo[string]))(t)
	if len(drops) != 1 || drops[0] != names[3] || !tableExists(t, e, names[3]) {
		t.Fatalf("bucket drops after retention: %v (table %s there: %v), want only the live instance's %s",
			drops, names[3], tableExists(t, e, names[3]), names[3])
	}

	// No bucket ends before now: nothing to drop, and no error (max() of no rows is NULL).
	if _, err := e.dropBuckets(ctx, e.now()); err != nil {
		t.Fatalf("drop buckets with none to drop: %v", err)
	}

	// A publish in the time of a finished bucket makes it again.
	clock.Set(logBase)
	logTopic(t, e, "late", storage.TopicConfig{})
	logPublish(t, e, "late", 0, "late")
	if !contains(bucketNames(t, e), names[0]) {
		t.Fatalf("bucket %s not made again for a publish in its range: %v", names[0], bucketNames(t, e))
	}
}

// TestLogRetentionConcurrentInstances: RetentionApply on two instances at once removes each
// message once and counts it once.
func TestLogRetentionConcurrentInstances(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(logBase)
	cfg := testConfig(t, clock)
	e1 := logOpen(t, cfg)
	e2 := logOpen(t, cfg)
	const topics = 6
	for i := range topics {
		name := fmt.Sprintf("r%d", i)
		logTopic(t, e1, name, storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MessageRetention: time.Minute,
			ZeroSubscriptionRetention: time.Minute})
		logPublish(t, e1, name, 0, "a", "b")
		logPublish(t, e1, name, 1, "c")
	}
	clock.Advance(time.Hour)
	var wg sync.WaitGroup
	results := make([]*storage.RetentionResult, 2)
	errs := make([]error, 2)
	for i, e := range []*Engine{e1, e2} {
		wg.Go(func() { results[i], errs[i] = e.RetentionApply(t.Context()) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// An instance that found a topic locked skipped it; a second pass finishes.
	third := must(e1.RetentionApply(t.Context()))(t)
	total := results[0].MessagesDeleted + results[1].MessagesDeleted + third.MessagesDeleted
	if total != 3*topics {
		t.Fatalf("deleted %d + %d + %d, want %d in all", results[0].MessagesDeleted, results[1].MessagesDeleted, third.MessagesDeleted, 3*topics)
	}
	for i := range topics {
		st := must(e2.TopicStats(t.Context(), fmt.Sprintf("r%d", i)))(t)
		if st.Messages != 0 || st.Bytes != 0 {
			t.Fatalf("topic r%d after retention: %+v", i, st)
		}
	}
}

// TestLogMaintenance: maintenance creates the current and the next bucket and removes the
// ephemeral subscriptions and rows of instances whose heartbeat is stale, not its own.
func TestLogMaintenance(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	if err := e.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	now := clock.Now()
	names := bucketNames(t, e)
	for _, want := range []string{bucketName(e.bucketStart(now)), bucketName(e.bucketStart(now.Add(e.bucket.width)))} {
		if !contains(names, want) {
			t.Fatalf("buckets %v miss %s", names, want)
		}
	}

	logTopic(t, e, "eph", storage.TopicConfig{Semantics: storage.PubSub})
	mine := must(e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "eph", Group: "mine", Ephemeral: true}))(t)
	theirs := must(e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "eph", Group: "theirs", Ephemeral: true}))(t)
	const dead = "00000000-0000-4000-8000-000000000001"
	// In one transaction: the engine's own maintenance loop may run between two statements and
	// remove the stale instance row before the subscription names it as its owner.
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, e.sql("INSERT INTO spool.instances (id, started_at, heartbeat_at) VALUES ($1, $2, $2)"), dead, now.Add(-time.Hour)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, e.sql("UPDATE spool.subscriptions SET owner = $1 WHERE id = $2"), dead, theirs.ID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour) // our own heartbeat is stale by the fake clock too: it must stay
	runStaleInstanceJob(t, e, clock.Now())
	if _, err := e.SubscriptionGet(ctx, theirs.ID); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Fatalf("ephemeral subscription of a dead instance: %v, want not found", err)
	}
	must(e.SubscriptionGet(ctx, mine.ID))(t)
	var n int
	if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.instances")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d instance rows, want 1 (ours)", n)
	}
}

// runStaleInstanceJob runs the stale-instance job at now. The engine's own maintenance loop may
// hold the job's lock at this moment (its first run, at Open, can be slow on a loaded machine);
// the job is then skipped, so it retries until the job ran.
func runStaleInstanceJob(t *testing.T, e *Engine, now time.Time) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "the stale-instance job ran", func() error {
		ran, err := e.removeStaleInstances(t.Context(), now)
		if err == nil && !ran {
			err = errors.New("skipped: another transaction holds the job's lock")
		}
		return err
	})
}

// TestStaleInstanceJobRemovesOrphans: an ephemeral subscription whose owner has no instance row
// (left by an owner removed between two statements of an older job) is removed with the stale
// instances; this instance's own stays.
func TestStaleInstanceJobRemovesOrphans(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "orphan", storage.TopicConfig{Semantics: storage.PubSub})
	mine := must(e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "orphan", Group: "mine", Ephemeral: true}))(t)
	orphan := must(e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "orphan", Group: "orphan", Ephemeral: true}))(t)
	must(e.pool.Exec(ctx, e.sql("UPDATE spool.subscriptions SET owner = $1 WHERE id = $2"), "00000000-0000-4000-8000-000000000002", orphan.ID))(t)
	runStaleInstanceJob(t, e, clock.Now())
	if _, err := e.SubscriptionGet(ctx, orphan.ID); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Fatalf("ephemeral subscription of an owner without a row: %v, want not found", err)
	}
	must(e.SubscriptionGet(ctx, mine.ID))(t)
}

// TestHeartbeatRegistersAgain: an instance whose row another instance removed (found stale
// after a long pause) registers again at its next heartbeat, with its start time, so that its
// ephemeral subscriptions are not taken for orphans from then on.
func TestHeartbeatRegistersAgain(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, storagetest.NewFakeClock(logBase))
	cfg.InstanceHeartbeat = 20 * time.Millisecond
	e := logOpen(t, cfg)
	ctx := t.Context()
	if tag := must(e.pool.Exec(ctx, e.sql("DELETE FROM spool.instances WHERE id = $1"), e.instanceUUID()))(t); tag.RowsAffected() != 1 {
		t.Fatalf("deleted %d instance rows, want 1", tag.RowsAffected())
	}
	testutil.Eventually(t, 10*time.Second, "the instance registered again", func() error {
		var started time.Time
		err := e.pool.QueryRow(ctx, e.sql("SELECT started_at FROM spool.instances WHERE id = $1"), e.instanceUUID()).Scan(&started)
		if err != nil {
			return err
		}
		if !started.Equal(e.startedAt) {
			return fmt.Errorf("started_at %v, want %v", started, e.startedAt)
		}
		return nil
	})
}

// BenchmarkLogAppend publishes batches of 1 KiB messages from parallel goroutines (the broker's
// shape: one MessagesAppend per batch); reports messages per second.
func BenchmarkLogAppend(b *testing.B) {
	for _, batch := range []int{1, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			e := openConns(b, 16)
			if _, err := e.TopicCreate(b.Context(), &storage.TopicCreateParams{Name: "bench", Config: storage.TopicConfig{Partitions: 4}}); err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 1024)
			msgs := make([]storage.AppendMessage, batch)
			for i := range msgs {
				msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload}
			}
			b.SetParallelism(4)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := e.MessagesAppend(b.Context(), &storage.MessagesAppendParams{Topic: "bench", Messages: msgs}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "msg/s")
		})
	}
}

package pgpublish_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	neturl "net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/pgpublish"
)

// setup opens a PostgreSQL engine (a broker's) on a fresh schema with a QUEUE topic "orders" of
// three partitions, and a pool an application would use.
func setup(t *testing.T) (*pgstore.Engine, *pgxpool.Pool, string) {
	t.Helper()
	url := testutil.DatabaseURL(t)
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "t_pub_" + hex.EncodeToString(b[:])
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	})
	eng, err := pgstore.Open(ctx, pgstore.Config{URL: url, Schema: schema, Migrate: true, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: "orders",
		Config: storage.TopicConfig{Partitions: 3, MaxMessageBytes: 1000}}); err != nil {
		t.Fatal(err)
	}
	return eng, pool, schema
}

func highWater(t *testing.T, eng *pgstore.Engine) int64 {
	t.Helper()
	st, err := eng.TopicStats(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range st.Partitions {
		n += p.HighWater
	}
	return n
}

// sequenced polls until the broker sequenced every committed message (spool.staged is empty).
func sequenced(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "staged messages sequenced", func() error {
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{schema, "staged"}.Sanitize()).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d staged", n)
		}
		return nil
	})
}

// TestPublishRollbackAndCommit: a rolled-back publish leaves nothing (no offset either); a
// committed one is in the partition the broker would choose, wakes the broker, and is delivered
// with its key, headers and payload.
func TestPublishRollbackAndCommit(t *testing.T) {
	eng, pool, schema := setup(t)
	ctx := t.Context()
	woken := make(chan string, 16)
	defer eng.NotifyRegister(func(n storage.Notification) {
		if n.Kind == storage.NotifyMessages {
			select {
			case woken <- n.Topic:
			default:
			}
		}
	})()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgpublish.PublishSchema(ctx, tx, schema, "orders", pgpublish.Message{Key: []byte("k"), Payload: []byte("gone")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := highWater(t, eng); n != 0 {
		t.Fatalf("after rollback the topic's high-water marks add up to %d, want 0", n)
	}

	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	two := int32(2)
	msgs := []pgpublish.Message{
		{Key: []byte("customer-7"), Headers: map[string]string{"type": "created"}, Payload: []byte("a")},
		{Key: []byte("customer-9"), Payload: []byte("b")},
		{Partition: &two, Payload: []byte("c"), ProducerID: "p-1"},
	}
	pos, err := pgpublish.PublishSchema(ctx, tx, schema, "orders", msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int32{storage.PartitionForKey(msgs[0].Key, 3), storage.PartitionForKey(msgs[1].Key, 3), 2} {
		if pos[i].Partition != want {
			t.Errorf("message %d in partition %d, want %d (as the broker places it)", i, pos[i].Partition, want)
		}
	}
	select {
	case <-woken:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine was not woken after the commit")
	}
	q, err := eng.SubscriptionGetByGroup(ctx, "orders", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*storage.Delivery{}
	for _, d := range res.Deliveries {
		got[string(d.Payload)] = d
	}
	if len(got) != 3 {
		t.Fatalf("claimed %d deliveries, want the 3 committed messages", len(res.Deliveries))
	}
	for i, m := range msgs {
		d := got[string(m.Payload)]
		if d == nil || d.Partition != pos[i].Partition || pos[i].Offset != -1 || string(d.Key) != string(m.Key) ||
			d.Headers["type"] != m.Headers["type"] || d.ProducerID != m.ProducerID {
			t.Errorf("message %d: delivered %+v, published %+v at %+v", i, d, m, pos[i])
		}
	}
}

// TestPublishErrors: each refusal of spool.publish maps to its sentinel and nothing is stored.
func TestPublishErrors(t *testing.T) {
	eng, pool, schema := setup(t)
	ctx := t.Context()
	nine := int32(9)
	for _, c := range []struct {
		topic string
		msg   pgpublish.Message
		want  error
	}{
		{"missing", pgpublish.Message{Payload: []byte("x")}, pgpublish.ErrTopicNotFound},
		{"orders", pgpublish.Message{Payload: make([]byte, 1001)}, pgpublish.ErrMessageTooLarge},
		{"orders", pgpublish.Message{Partition: &nine, Payload: []byte("x")}, pgpublish.ErrInvalidArgument},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = pgpublish.PublishSchema(ctx, tx, schema, c.topic, c.msg)
		_ = tx.Rollback(ctx)
		if !errors.Is(err, c.want) {
			t.Errorf("publish to %q: %v, want %v", c.topic, err, c.want)
		}
	}
	if n := highWater(t, eng); n != 0 {
		t.Fatalf("refused publishes left high-water marks adding up to %d", n)
	}
}

// TestPublishDedup: spool.publish de-duplicates by producer id with the broker's own publishes
// (one table for both): a second copy, in the same transaction, in a later one or through the
// engine, is not stored and answers the first one's position with Duplicate; a rolled-back
// publish does not keep its id.
func TestPublishDedup(t *testing.T) {
	eng, pool, schema := setup(t)
	ctx := t.Context()
	publish := func(commit bool, msgs ...pgpublish.Message) []pgpublish.Position {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pos, err := pgpublish.PublishSchema(ctx, tx, schema, "orders", msgs...)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		return pos
	}
	publish(false, pgpublish.Message{Payload: []byte("x"), ProducerID: "gone"})
	pos := publish(true,
		pgpublish.Message{Key: []byte("k"), Payload: []byte("a"), ProducerID: "order-1"},
		pgpublish.Message{Key: []byte("other"), Payload: []byte("a2"), ProducerID: "order-1"},
		pgpublish.Message{Payload: []byte("b"), ProducerID: "gone"})
	if pos[0].Duplicate || pos[2].Duplicate {
		t.Fatalf("first copies are duplicates: %+v", pos)
	}
	same := func(got, want pgpublish.Position, what string) {
		t.Helper()
		if !got.Duplicate || got.Partition != want.Partition || got.Offset != want.Offset || !got.PublishedAt.Equal(want.PublishedAt) {
			t.Errorf("%s: %+v, want the duplicate of %+v", what, got, want)
		}
	}
	same(pos[1], pos[0], "second copy in the same transaction (not sequenced yet: offset -1)")
	if pos[0].Offset != -1 || !pos[0].PublishedAt.IsZero() {
		t.Errorf("position before the commit: %+v, want offset -1 and no time", pos[0])
	}
	// Once sequenced, a copy answers the stored message's position.
	sequenced(t, pool, schema)
	ms, err := eng.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "orders", Partition: pos[0].Partition})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ms, func(m *storage.Message) bool { return m.ProducerID == "order-1" })
	if i < 0 {
		t.Fatalf("order-1 not stored in partition %d", pos[0].Partition)
	}
	pos[0] = pgpublish.Position{Partition: ms[i].Partition, Offset: ms[i].Offset, PublishedAt: ms[i].PublishedAt}
	same(publish(true, pgpublish.Message{Payload: []byte("a3"), ProducerID: "order-1"})[0], pos[0], "copy in a later transaction")
	res, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "orders",
		Messages: []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("a4"), ProducerID: "order-1"},
			{Partition: storage.PartitionAuto, Payload: []byte("c"), ProducerID: "order-2"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := res.Positions[0]
	same(pgpublish.Position{Partition: got.Partition, Offset: got.Offset, PublishedAt: got.PublishedAt, Duplicate: got.Duplicate}, pos[0],
		"copy published through the engine")
	c := res.Positions[1]
	same(publish(true, pgpublish.Message{Payload: []byte("c2"), ProducerID: "order-2"})[0],
		pgpublish.Position{Partition: c.Partition, Offset: c.Offset, PublishedAt: c.PublishedAt}, "copy of the engine's message through spool.publish")
	sequenced(t, pool, schema)
	if n := highWater(t, eng); n != 3 {
		t.Fatalf("messages stored: %d, want 3 (order-1, gone, order-2)", n)
	}
}

// TestPublishTxDefaultSchema: PublishTx, the brief's transactional publish, stages in the default
// schema (spool) inside the caller's pgx.Tx: nothing after a rollback, the message after a commit.
// It runs in a database of its own, where spool is this test's schema only.
func TestPublishTxDefaultSchema(t *testing.T) {
	base := testutil.DatabaseURL(t)
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	var b [5]byte
	_, _ = rand.Read(b[:])
	db := "t_pubtx_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	})
	u, err := neturl.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	url := u.String()

	eng, err := pgstore.Open(ctx, pgstore.Config{URL: url, Schema: pgpublish.DefaultSchema, Migrate: true, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = eng.Close() }()
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: "orders", Config: storage.TopicConfig{Partitions: 3}}); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	publish := func(commit bool, payload string) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }() // pool.Close waits for it
		var ptx pgx.Tx = tx
		pos, err := pgpublish.PublishTx(ctx, ptx, "orders", pgpublish.Message{Key: []byte("k"), Payload: []byte(payload)})
		if err != nil {
			t.Fatal(err)
		}
		if len(pos) != 1 || pos[0].Partition != storage.PartitionForKey([]byte("k"), 3) || pos[0].Offset != -1 {
			t.Fatalf("PublishTx positions %+v", pos)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	publish(false, "gone")
	publish(true, "kept")
	sequenced(t, pool, pgpublish.DefaultSchema)
	ms, err := eng.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "orders", Partition: storage.PartitionForKey([]byte("k"), 3)})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || string(ms[0].Payload) != "kept" {
		t.Fatalf("stored %d messages (%v), want only the committed one", len(ms), ms)
	}
}

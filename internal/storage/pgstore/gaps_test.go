package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// bucketAttached reports whether the bucket table is a partition of spool.messages, not being
// detached.
func bucketAttached(t *testing.T, e *Engine, name string) bool {
	t.Helper()
	var ok bool
	err := e.pool.QueryRow(t.Context(), e.sql(`SELECT EXISTS (SELECT 1 FROM pg_inherits
		WHERE inhrelid = to_regclass('spool.`+name+`') AND inhparent = to_regclass('spool.messages') AND NOT inhdetachpending)`)).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestRetentionSparesBucketsOfOpenPublishers: a transaction that appended to the log and has not
// committed (a broker append or a sequencing transaction stalled between its statements and its
// COMMIT) keeps its bucket: retention neither unregisters nor detaches it while the transaction is
// open, on a partition that never published before and on one whose every message retention
// removed (both show no retained message to a reader), and the message is delivered once the
// transaction commits. This is the loss of issue 15: the bucket was detached under the open
// transaction and a claim passed the message meanwhile. (Applications' transactions no longer
// write to the log: TestRetentionWithStagedMessages.)
func TestRetentionSparesBucketsOfOpenPublishers(t *testing.T) {
	t.Parallel()
	for _, trimmed := range []bool{false, true} {
		t.Run(fmt.Sprintf("trimmed=%v", trimmed), func(t *testing.T) {
			t.Parallel()
			e, clock := logEngine(t)
			ctx := t.Context()
			logTopic(t, e, "slow", storage.TopicConfig{MessageRetention: time.Minute})
			q := must(e.SubscriptionGetByGroup(ctx, "slow", storage.QueueGroup))(t)
			if trimmed {
				logPublish(t, e, "slow", 0, "old")
				equalStrings(t, claimPayloads(t, e, q.ID), []string{"0:0=old"}, "claims of the old message")
				clock.Advance(3 * time.Hour)
				if res := must(e.RetentionApply(ctx))(t); res.MessagesDeleted != 1 {
					t.Fatalf("retention of the old message: %+v", *res)
				}
			}
			b := bucketName(e.bucketStart(clock.Now()))
			want := "0:0=slow-tx"
			if trimmed {
				want = "0:1=slow-tx"
			}

			tx := must(e.pool.Begin(ctx))(t)
			defer tx.Rollback(context.Background())
			openAppend(t, e, tx, "slow", 0, "slow-tx")
			clock.Advance(3 * time.Hour) // the bucket ended long ago as far as time goes

			done := make(chan error, 1)
			go func() {
				_, err := e.RetentionApply(context.Background())
				done <- err
			}()
			var returned bool
			testutil.Eventually(t, 30*time.Second, "retention returns or unregisters "+b, func() error {
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("retention: %v", err)
					}
					returned = true
					return nil
				default:
				}
				if !contains(bucketNames(t, e), b) {
					return nil
				}
				return errors.New("neither yet")
			})
			if !returned || !contains(bucketNames(t, e), b) || !bucketAttached(t, e, b) {
				// Let a blocked detach finish before failing.
				_ = tx.Commit(ctx)
				if !returned {
					<-done
				}
				t.Fatalf("retention took bucket %s away from an open publishing transaction (returned %v)", b, returned)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			equalStrings(t, claimPayloads(t, e, q.ID), []string{want}, "claims after the commit")
		})
	}
}

// TestClaimStopsAtUnreadableMessage: a message above its partition's low offset that a claim cannot
// read (its bucket is detached) is never passed: the claim fails (storage unavailable, retryable)
// and changes nothing,
// for a new message and for a redelivery; once the bucket is back, both are delivered.
func TestClaimStopsAtUnreadableMessage(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "gap", storage.TopicConfig{})
	q := must(e.SubscriptionGetByGroup(ctx, "gap", storage.QueueGroup))(t)
	old := bucketName(e.bucketStart(clock.Now()))
	logPublish(t, e, "gap", 0, "a", "b")
	first := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1}))(t)
	if len(first.Deliveries) != 1 || first.Deliveries[0].Offset != 0 {
		t.Fatalf("first claim: %+v", first.Deliveries)
	}
	must(e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m", Refs: []storage.DeliveryRef{first.Deliveries[0].Ref()}}))(t)
	clock.Advance(2 * time.Hour)
	logPublish(t, e, "gap", 0, "c", "d")

	detach := "ALTER TABLE spool.messages DETACH PARTITION spool." + old
	must(e.pool.Exec(ctx, e.sql(detach)))(t)
	for i := range 2 {
		_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 100})
		if !errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), "not readable") {
			t.Fatalf("claim %d with offsets 0 and 1 unreadable: %v, want an error", i, err)
		}
	}
	must(e.pool.Exec(ctx, e.sql("ALTER TABLE spool.messages ATTACH PARTITION spool."+old+" FOR VALUES FROM ("+
		pgTimeLiteral(time.Unix(e.bucketStart(logBase), 0))+") TO ("+pgTimeLiteral(time.Unix(e.bucketStart(logBase), 0).Add(e.bucket.width))+")")))(t)
	res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 100}))(t)
	var got []string
	for _, d := range res.Deliveries {
		got = append(got, fmt.Sprintf("%d=%s/%d", d.Offset, d.Payload, d.Attempt))
	}
	equalStrings(t, got, []string{"0=a/2", "1=b/1", "2=c/1", "3=d/1"}, "claim once the bucket is back")
}

// TestPublishIntoDetachingBucketIsRetryable: a publish whose bucket retention has unregistered and
// is detaching fails with a clear error and writes nothing, instead of failing to create the table
// again (42P07); once retention attached it again, the publish goes through.
func TestPublishIntoDetachingBucketIsRetryable(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "late", storage.TopicConfig{})
	b := bucket{name: bucketName(e.bucketStart(clock.Now())), startAt: time.Unix(e.bucketStart(clock.Now()), 0).UTC()}
	b.endAt = b.startAt.Add(e.bucket.width)
	b.startKey = b.startAt.Unix()
	if err := e.ensureBucket(ctx, clock.Now()); err != nil {
		t.Fatal(err)
	}
	// What dropBuckets does before its check: unregister, then detach.
	must(e.pool.Exec(ctx, e.sql("DELETE FROM spool.buckets WHERE name = $1"), b.name))(t)
	e.setBucketKnown(b.startKey, false)
	must(e.pool.Exec(ctx, e.sql("ALTER TABLE spool.messages DETACH PARTITION spool."+b.name)))(t)

	_, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "late", Messages: []storage.AppendMessage{{Partition: 0, Payload: []byte("x")}}})
	if !errors.Is(err, errBucketDetaching) || !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("publish into a detaching bucket: %v, want errBucketDetaching (storage unavailable)", err)
	}
	if st := must(e.TopicStats(ctx, "late"))(t); st.Partitions[0].HighWater != 0 {
		t.Fatalf("high water after the failed publish: %d", st.Partitions[0].HighWater)
	}
	if err := e.dropBucket(ctx, b); err != nil { // empty: dropped
		t.Fatal(err)
	}
	logPublish(t, e, "late", 0, "x")
	if !contains(bucketNames(t, e), b.name) {
		t.Fatalf("bucket %s not made again", b.name)
	}
}

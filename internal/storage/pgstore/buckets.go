package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolmq/spool/internal/storage"
)

// bucketState is the in-memory state of the message log: the buckets (partitions of
// spool.messages) known to exist, and the round-robin counter of keyless messages.
type bucketState struct {
	// width is the time span of one bucket (spool.settings bucket_seconds), set by start.
	width time.Duration

	mu    sync.Mutex
	known map[int64]struct{} // start of the bucket, Unix seconds

	// rr spreads keyless messages over partitions (see planAppend).
	rr atomic.Uint32
}

// bucketLockTimeout bounds how long bucket creation waits for the locks of DDL on spool.messages
// (ATTACH PARTITION conflicts with a DETACH CONCURRENTLY in progress): a creator then gets an
// error instead of waiting for as long as the detach does. (Before migration 0007, spool.publish
// created buckets inside applications' transactions, which such a wait could deadlock through the
// application.)
const bucketLockTimeout = "10s"

// bucketLockSQL takes the bucket lock: the row lock of spool.settings 'bucket_seconds', which
// engine instances (and spool.publish before migration 0007) take before creating or dropping a
// bucket (readers of the row are not blocked).
const bucketLockSQL = "SELECT 1 FROM spool.settings WHERE key = 'bucket_seconds' FOR UPDATE"

// lockBuckets takes the bucket lock until tx ends.
func (e *Engine) lockBuckets(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, e.sql(bucketLockSQL))
	return err
}

// lockBucketsBounded is lockBuckets with tx's lock_timeout set to bucketLockTimeout first (for
// the rest of tx): past it, the error has SQLSTATE 55P03.
func (e *Engine) lockBucketsBounded(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+bucketLockTimeout+"'"); err != nil {
		return err
	}
	return e.lockBuckets(ctx, tx)
}

// bucketStart returns the start (Unix seconds) of the bucket holding t.
func (e *Engine) bucketStart(t time.Time) int64 {
	w := int64(e.bucket.width / time.Second)
	s := t.Unix()
	start := s / w * w
	if s < 0 && s%w != 0 {
		start -= w
	}
	return start
}

// bucketName is the table name of the bucket starting at start (Unix seconds), without schema.
func bucketName(start int64) string {
	return "messages_" + time.Unix(start, 0).UTC().Format("20060102t150405")
}

// pgTimeLiteral formats a time as a timestamptz literal for DDL (which takes no parameters).
func pgTimeLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999") + "+00'"
}

// bucketKnown reports whether the bucket starting at start is known to exist.
func (e *Engine) bucketKnown(start int64) bool {
	e.bucket.mu.Lock()
	defer e.bucket.mu.Unlock()
	_, ok := e.bucket.known[start]
	return ok
}

func (e *Engine) setBucketKnown(start int64, known bool) {
	e.bucket.mu.Lock()
	defer e.bucket.mu.Unlock()
	if e.bucket.known == nil {
		e.bucket.known = map[int64]struct{}{}
	}
	if known {
		e.bucket.known[start] = struct{}{}
	} else {
		delete(e.bucket.known, start)
	}
}

// ensureBucket makes sure the bucket holding t exists. It is cheap when the bucket is known;
// otherwise it creates it in its own transaction (outside any publishing transaction): CREATE
// TABLE ... (LIKE spool.messages INCLUDING ALL) with a CHECK constraint matching the range, then
// ATTACH PARTITION (which takes SHARE UPDATE EXCLUSIVE on spool.messages, so readers and writers
// are not blocked), registered in spool.buckets. The bucket lock (bucketLockSQL) serializes
// creators of every instance and of spool.publish; a bucket created by another is found in
// spool.buckets.
func (e *Engine) ensureBucket(ctx context.Context, t time.Time) error {
	start := e.bucketStart(t)
	if e.bucketKnown(start) {
		return nil
	}
	return e.createBucket(ctx, start)
}

func (e *Engine) createBucket(ctx context.Context, start int64) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	from := time.Unix(start, 0).UTC()
	to := from.Add(e.bucket.width)
	name := bucketName(start)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if err := e.lockBucketsBounded(ctx, tx); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, e.sql("SELECT EXISTS (SELECT 1 FROM spool.buckets WHERE start_at = $1)"), from).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		var leftover bool
		if err := tx.QueryRow(ctx, e.sqlOnce("SELECT to_regclass('spool."+name+"') IS NOT NULL")).Scan(&leftover); err != nil {
			return err
		}
		if leftover {
			// Retention removed it from spool.buckets and is detaching it (dropBucket): it is
			// attached again if it holds retained messages, else dropped; then it can be made.
			return errBucketDetaching
		}
		rng := "FROM (" + pgTimeLiteral(from) + ") TO (" + pgTimeLiteral(to) + ")"
		ddl := "CREATE TABLE spool." + name + " (LIKE spool.messages INCLUDING ALL);\n" +
			"ALTER TABLE spool." + name + " ADD CONSTRAINT " + name + "_range CHECK (published_at >= " + pgTimeLiteral(from) +
			" AND published_at < " + pgTimeLiteral(to) + ");\n" +
			"ALTER TABLE spool.messages ATTACH PARTITION spool." + name + " FOR VALUES " + rng + ";\n" +
			"ALTER TABLE spool." + name + " DROP CONSTRAINT " + name + "_range"
		if _, err := tx.Exec(ctx, e.sqlOnce(ddl)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, e.sql("INSERT INTO spool.buckets (name, start_at, end_at) VALUES ($1, $2, $3)"), name, from, to)
		return err
	})
	if err != nil {
		return e.mapErr(fmt.Errorf("pgstore: create bucket %s [%s, %s): %w", name, from.Format(time.RFC3339), to.Format(time.RFC3339), err))
	}
	e.setBucketKnown(start, true)
	return nil
}

// errBucketDetaching is the error of a publish whose bucket retention is detaching: storage
// unavailable (retryable), nothing was written.
var errBucketDetaching = &storage.IOError{Kind: storage.ErrUnavailable, Reason: "time bucket being detached by retention, retry",
	Err: errors.New("the bucket is unregistered and its table not yet attached again or dropped")}

// bucket is a row of spool.buckets.
type bucket struct {
	name     string
	startAt  time.Time
	endAt    time.Time
	startKey int64
}

// dropBuckets detaches and drops the buckets that hold no retained message and that no open or
// later transaction can write to; it returns how many it dropped.
//
// A writer of the log (a broker append or a sequencing transaction: applications' transactions
// only stage, see sequencer.go) writes at greatest(its clock, the partition's last_published_at)
// while it holds the partition's row lock (takeOffsetsSQL), or, a lane append that guessed its
// offsets (appendpredict.go), before it takes the row, at the later of its clock and the time its
// instance's last append left, and commits only if that is not before the row's
// last_published_at; so every write a partition can still commit is at or after its committed
// last_published_at, and at or after low_published_at when
// it holds retained messages. A bucket is a candidate when it ends at or before now, at or before
// the low_published_at of every partition holding retained messages, and, for a partition that
// holds none whose row a writer holds now (an open transaction, stalled between its statements
// and its commit), at or before its last_published_at (writeFloorSQL):
// such a transaction has taken its offset and may not have written yet, and its committed
// low_published_at is not visible to us.
//
// Each bucket is removed from spool.buckets first (under the bucket lock, its row moved to
// spool.bucket_drops until the end: the drops of an instance that is gone are finished here too,
// orphanDropsSQL), detached with DETACH
// PARTITION CONCURRENTLY (outside a transaction block and without holding any lock of ours, so a
// transactional publisher creating a bucket meanwhile cannot deadlock with it), then checked: if a
// row at or above its partition's low offset is in it (a publisher whose clock is behind ours by
// more than the bucket's age wrote there meanwhile), it is attached again; otherwise dropped.
// Claims never take a missing offset above a partition's low offset for removed (see claimRead),
// so such a bucket is only late, never lost.
func (e *Engine) dropBuckets(ctx context.Context, now time.Time) (int, error) {
	var candidates []bucket
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		// The bucket lock is held for milliseconds (a bucket's creation, which this instance's
		// maintenance runs on a timer; another instance's listing below), so retention waits for
		// it rather than skipping its drops; held longer than bucketLockTimeout, the drops wait
		// for the next run.
		if err := e.lockBucketsBounded(ctx, tx); err != nil {
			if pgCode(err) == "55P03" {
				e.log.Info("pgstore: retention skips bucket drops: the bucket lock is held", "waited", bucketLockTimeout)
				return errSkipDrops
			}
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout TO DEFAULT"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, e.sql(orphanDropsSQL), e.instanceUUID())
		if err != nil {
			return err
		}
		if candidates, err = appendBuckets(candidates, rows); err != nil {
			return err
		}
		if len(candidates) > 0 {
			e.log.Info("pgstore: retention finishes the drop of buckets a stopped instance left", "buckets", len(candidates))
		}
		var latest pgtype.Timestamptz
		if err := tx.QueryRow(ctx, e.sql(candidateLimitSQL), now).Scan(&latest); err != nil {
			return err
		}
		if !latest.Valid {
			return nil // no bucket ends before the limit of retained messages
		}
		limit := latest.Time
		var floor pgtype.Timestamptz
		if err := tx.QueryRow(ctx, e.sql(writeFloorSQL), limit).Scan(&floor); err != nil {
			return err
		}
		if floor.Valid && floor.InfinityModifier == pgtype.NegativeInfinity {
			return nil // a publisher holds a partition that never published: any bucket may be its
		}
		if floor.Valid && floor.InfinityModifier == pgtype.Finite && floor.Time.Before(limit) {
			limit = floor.Time
		}
		rows, err = tx.Query(ctx, e.sql(`WITH gone AS (DELETE FROM spool.buckets b WHERE b.end_at <= $1
			RETURNING name, start_at, end_at)
			INSERT INTO spool.bucket_drops (name, start_at, end_at, instance) SELECT name, start_at, end_at, $2 FROM gone
			RETURNING name, start_at, end_at`), limit, e.instanceUUID())
		if err != nil {
			return err
		}
		candidates, err = appendBuckets(candidates, rows)
		return err
	})
	if errors.Is(err, errSkipDrops) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pgstore: retention: list buckets: %w", err)
	}
	dropped := 0
	var firstErr error
	for _, b := range candidates {
		e.setBucketKnown(b.startKey, false)
		if err := e.dropBucket(ctx, b); err != nil {
			e.log.Warn("pgstore: drop bucket", "bucket", b.name, "err", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		dropped++
	}
	return dropped, firstErr
}

// errSkipDrops: dropBuckets did not get the bucket lock in time (nothing changed).
var errSkipDrops = errors.New("pgstore: bucket lock busy")

// orphanDropsSQL takes over the buckets being dropped by instances that are gone (bucket_drops,
// migration 0019): an instance that stopped between removing a bucket from spool.buckets and
// dropping its table.
const orphanDropsSQL = `UPDATE spool.bucket_drops d SET instance = $1
WHERE NOT EXISTS (SELECT 1 FROM spool.instances i WHERE i.id = d.instance)
RETURNING name, start_at, end_at`

// appendBuckets appends the buckets (name, start_at, end_at) of rows to bs and closes rows.
func appendBuckets(bs []bucket, rows pgx.Rows) ([]bucket, error) {
	defer rows.Close()
	for rows.Next() {
		var b bucket
		if err := rows.Scan(&b.name, &b.startAt, &b.endAt); err != nil {
			return bs, err
		}
		b.startKey = b.startAt.Unix()
		bs = append(bs, b)
	}
	return bs, rows.Err()
}

// candidateLimitSQL is the latest end of a bucket that may be dropped as far as committed data
// says: the newest bucket end at or before now ($1) and at or before the low_published_at of every
// partition holding retained messages; NULL when there is none.
const candidateLimitSQL = `SELECT max(b.end_at) FROM spool.buckets b
WHERE b.end_at <= $1
  AND b.end_at <= coalesce((SELECT min(low_published_at) FROM spool.partitions), 'infinity')`

// writeFloorSQL is the earliest publish time that an open transaction can still write at, among
// the partitions that hold no retained message and last published before $1: the
// last_published_at ('-infinity' when it never published) of those whose row is locked now (a
// publisher holds it until it commits or rolls back). NULL when none is locked. The rows that are
// free are locked FOR SHARE until the transaction ends, which a publisher arriving meanwhile
// waits for; it then writes at its own clock, after $1 (a bucket ended before now).
const writeFloorSQL = `WITH quiet AS MATERIALIZED (
	SELECT topic_id, partition, last_published_at FROM spool.partitions
	WHERE low_published_at IS NULL AND (last_published_at IS NULL OR last_published_at < $1)
), free AS MATERIALIZED (
	SELECT p.topic_id, p.partition FROM spool.partitions p
	WHERE p.low_published_at IS NULL AND (p.last_published_at IS NULL OR p.last_published_at < $1)
	FOR SHARE SKIP LOCKED
)
SELECT min(coalesce(q.last_published_at, '-infinity'))
FROM quiet q
WHERE NOT EXISTS (SELECT 1 FROM free f WHERE f.topic_id = q.topic_id AND f.partition = q.partition)`

// dropBucket detaches and drops one bucket already removed from spool.buckets; see dropBuckets.
func (e *Engine) dropBucket(ctx context.Context, b bucket) error {
	reattach := func() error {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if err := e.lockBuckets(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, e.sqlOnce("ALTER TABLE spool.messages ATTACH PARTITION spool."+b.name+
				" FOR VALUES FROM ("+pgTimeLiteral(b.startAt)+") TO ("+pgTimeLiteral(b.endAt)+")")); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, e.sql("INSERT INTO spool.buckets (name, start_at, end_at) VALUES ($1, $2, $3)"), b.name, b.startAt, b.endAt); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, e.sql("DELETE FROM spool.bucket_drops WHERE name = $1"), b.name)
			return err
		})
		if err != nil {
			return fmt.Errorf("reattach: %w", err)
		}
		e.setBucketKnown(b.startKey, true)
		return nil
	}
	var exists, attached bool
	err := e.pool.QueryRow(ctx, e.sqlOnce(`SELECT to_regclass('spool.`+b.name+`') IS NOT NULL, EXISTS (SELECT 1 FROM pg_inherits
		WHERE inhrelid = to_regclass('spool.`+b.name+`') AND inhparent = to_regclass('spool.messages'))`)).Scan(&exists, &attached)
	if err != nil {
		return err
	}
	if !exists { // dropped by an instance that stopped before it said so
		return e.forgetDrop(ctx, b)
	}
	if attached {
		_, err := e.pool.Exec(ctx, e.sqlOnce("ALTER TABLE spool.messages DETACH PARTITION spool."+b.name+" CONCURRENTLY"))
		if err != nil {
			if pgCode(err) == "55000" { // an earlier detach was interrupted: finish it
				_, err = e.pool.Exec(ctx, e.sqlOnce("ALTER TABLE spool.messages DETACH PARTITION spool."+b.name+" FINALIZE"))
			}
			if err != nil {
				return errors.Join(fmt.Errorf("detach: %w", err), e.reregister(ctx, b))
			}
		}
	}
	var retained bool
	err = e.pool.QueryRow(ctx, e.sqlOnce(`SELECT EXISTS (SELECT 1 FROM spool.partitions p WHERE EXISTS (
		SELECT 1 FROM spool.`+b.name+` d WHERE d.topic_id = p.topic_id AND d.partition = p.partition AND d."offset" >= p.low_offset))`)).Scan(&retained)
	if err != nil {
		return errors.Join(fmt.Errorf("check: %w", err), reattach())
	}
	if retained {
		e.log.Warn("pgstore: bucket still holds retained messages, attached again", "bucket", b.name)
		return reattach()
	}
	if _, err := e.pool.Exec(ctx, e.sqlOnce("DROP TABLE spool."+b.name)); err != nil {
		return fmt.Errorf("drop: %w", err)
	}
	e.log.Debug("pgstore: dropped bucket", "bucket", b.name)
	return e.forgetDrop(ctx, b)
}

// forgetDrop forgets a bucket whose table is dropped (bucket_drops).
func (e *Engine) forgetDrop(ctx context.Context, b bucket) error {
	if _, err := e.pool.Exec(ctx, e.sql("DELETE FROM spool.bucket_drops WHERE name = $1"), b.name); err != nil {
		return fmt.Errorf("forget the dropped bucket: %w", err)
	}
	return nil
}

// reregister puts a bucket that could not be detached back into spool.buckets.
func (e *Engine) reregister(ctx context.Context, b bucket) error {
	_, err := e.pool.Exec(ctx, e.sql(`WITH back AS (DELETE FROM spool.bucket_drops WHERE name = $1)
		INSERT INTO spool.buckets (name, start_at, end_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`),
		b.name, b.startAt, b.endAt)
	if err == nil {
		e.setBucketKnown(b.startKey, true)
	}
	return err
}

// tryXactLock takes a transaction-level advisory lock if it is free.
func tryXactLock(ctx context.Context, tx pgx.Tx, key int64) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&ok)
	return ok, err
}

package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// maintenanceInterval is how often an instance runs maintenance: often enough to create the next
// bucket well before it is needed and to notice dead instances within a few heartbeats.
func (e *Engine) maintenanceInterval() time.Duration {
	return max(min(e.bucket.width/4, 30*time.Second, 3*e.cfg.InstanceHeartbeat), 10*time.Millisecond)
}

// staleHeartbeats is how many heartbeat intervals an instance may miss before maintenance
// considers it dead and removes its ephemeral subscriptions. The interval counted is the larger
// of this instance's and one minute (the longest Config.InstanceHeartbeat allows), since other
// instances may be configured with a longer heartbeat than ours.
const staleHeartbeats = 4

// maintenanceLoop runs maintenance at start and then every maintenanceInterval until Close.
func (e *Engine) maintenanceLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.maintenanceInterval())
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(e.bgCtx, time.Minute)
		if err := e.maintain(ctx); err != nil && e.bgCtx.Err() == nil {
			e.log.Warn("pgstore: maintenance", "err", err)
		}
		cancel()
		select {
		case <-e.bgCtx.Done():
			return
		case <-t.C:
		}
	}
}

// maintain pre-creates the current and the next bucket, removes the ephemeral subscriptions
// (and rows) of instances whose heartbeat is stale (see staleHeartbeats), deletes expired
// producer ids and counts those left (countProducerIDs). The jobs are safe on several instances
// at once: bucket creation takes the bucket lock, the cleanup and the prune run under
// pg_try_advisory_xact_lock (an instance that does not get it skips the job), and the prune
// deletes only expired rows.
func (e *Engine) maintain(ctx context.Context) error {
	// Every instance counts, also one that skipped the prune or failed a step before it: its
	// estimate takes in the ids of other instances and the room expiry made (the count leaves
	// expired rows out: Config.MaxProducerIDs).
	err := e.maintainSteps(ctx, e.clockNow())
	if cerr := e.countProducerIDs(ctx); err == nil {
		err = cerr
	}
	return err
}

func (e *Engine) maintainSteps(ctx context.Context, now time.Time) error {
	if err := e.ensureBucket(ctx, now); err != nil {
		return err
	}
	if err := e.ensureBucket(ctx, now.Add(e.bucket.width)); err != nil {
		return err
	}
	if _, err := e.removeStaleInstances(ctx, now); err != nil {
		return err
	}
	return e.pruneProducerIDs(ctx, now, pruneProducerIDsBatch)
}

// pruneProducerIDsBatch bounds the rows one prune transaction deletes, so that it holds few row
// locks for a short time.
const pruneProducerIDsBatch = 1000

// pruneProducerIDs deletes the producer ids whose dedup_window ended (migrations/0006): a publish
// takes over an expired id anyway, so this only bounds the table. It deletes at most batch rows
// per transaction, skipping the rows a publish holds (taking one over): a publish never waits
// for the prune, nor the prune for it. One instance prunes at a time (the others skip the job
// while it holds the advisory lock), so instances do not scan the same rows.
func (e *Engine) pruneProducerIDs(ctx context.Context, now time.Time, batch int) error {
	for {
		ran, n := false, int64(0)
		err := e.tx(ctx, func(tx pgx.Tx) error {
			ok, err := tryXactLock(ctx, tx, lockKey(e.schema, "producer_ids"))
			if err != nil || !ok {
				return err
			}
			ran = true
			tag, err := tx.Exec(ctx, e.sql(`DELETE FROM spool.producer_ids WHERE ctid = ANY (ARRAY(
				SELECT ctid FROM spool.producer_ids WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`), now, batch)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return fmt.Errorf("pgstore: prune producer ids: %w", err)
		}
		if !ran || n < int64(batch) {
			return nil
		}
	}
}

// removeStaleInstances deletes the instance rows whose heartbeat is older than staleHeartbeats
// intervals and the ephemeral subscriptions they owned (their members are gone with them), and
// the ephemeral subscriptions of owners that have no row any more. One statement: with two, an
// owner committed between them (read committed) left its subscription behind once its row was
// gone. It reports false, doing nothing, when another transaction (of this or another
// instance) holds the job's lock.
func (e *Engine) removeStaleInstances(ctx context.Context, now time.Time) (ran bool, err error) {
	cutoff := now.Add(-staleHeartbeats * max(e.cfg.InstanceHeartbeat, time.Minute))
	err = e.tx(ctx, func(tx pgx.Tx) error {
		ok, err := tryXactLock(ctx, tx, lockKey(e.schema, "instances"))
		if err != nil || !ok {
			return err
		}
		ran = true
		var instances, subs int64
		err = tx.QueryRow(ctx, e.sql(`WITH gone AS (
	DELETE FROM spool.instances WHERE heartbeat_at < $1 AND id <> $2 RETURNING id),
subs AS (
	DELETE FROM spool.subscriptions s WHERE s.ephemeral AND s.owner <> $2
	AND (s.owner IN (SELECT id FROM gone) OR NOT EXISTS (SELECT 1 FROM spool.instances i WHERE i.id = s.owner))
	RETURNING 1)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM subs)`), cutoff, e.instanceUUID()).Scan(&instances, &subs)
		if err != nil {
			return fmt.Errorf("pgstore: remove stale instances and their ephemeral subscriptions: %w", err)
		}
		if instances > 0 || subs > 0 {
			e.log.Info("pgstore: removed stale instances", "instances", instances, "ephemeral_subscriptions", subs)
		}
		return nil
	})
	return ran && err == nil, err
}

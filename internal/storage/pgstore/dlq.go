package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
)

// DLQList lists a subscription's dead-lettered messages in ID order, after AfterID, at most Limit
// (default 100) and storage.ReadBatchBytes of messages (at least one). A CANCELLED subscription has none. Bounded by Config.TxTimeout (past it: TIMEOUT,
// retryable).
func (e *Engine) DLQList(ctx context.Context, p *storage.DLQListParams) ([]*storage.DLQEntry, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "DLQ list", func(ctx context.Context) ([]*storage.DLQEntry, error) {
		return e.dlqList(ctx, p)
	})
}

// dlqList runs DLQList with ctx bounded by Config.TxTimeout.
func (e *Engine) dlqList(ctx context.Context, p *storage.DLQListParams) ([]*storage.DLQEntry, error) {
	limit := p.Limit
	if limit == 0 {
		limit = 100
	}
	s, err := e.loadSub(ctx, e.pool, p.SubscriptionID, noLock)
	if err != nil {
		return nil, e.mapErr(err)
	}
	out := []*storage.DLQEntry{}
	if s.State == storage.Cancelled {
		return out, nil
	}
	// The first entry, then the next ones while their running size stays within $4.
	rows, err := e.pool.Query(ctx, e.sql(`SELECT m.id, m.reason, m.attempts, m.last_error, m.dead_at, m.rule, m.failures, m.partition, m."offset", `+msgCols+`
		FROM (
			SELECT m.*, row_number() OVER w AS n,
				sum(octet_length(m.payload) + coalesce(octet_length(m.key), 0) + coalesce(octet_length(m.headers::text), 0)) OVER w AS upto
			FROM spool.dlq m WHERE m.sub_id = $1 AND m.replay IS NULL AND m.id > $2
			WINDOW w AS (ORDER BY m.id ROWS UNBOUNDED PRECEDING)
			ORDER BY m.id LIMIT $3
		) m WHERE m.n = 1 OR m.upto <= $4 ORDER BY m.id`), s.ID, p.AfterID, limit, storage.ReadBatchBytes)
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: subscription %d: list DLQ: %w", s.ID, err))
	}
	defer rows.Close()
	for rows.Next() {
		en := &storage.DLQEntry{SubscriptionID: s.ID}
		var reason, rule string
		var fs []byte
		m, err := scanMsg(rows, s.Topic, &en.ID, &reason, &en.Attempts, &en.LastError, &en.DeadAt, &rule, &fs)
		if errors.Is(err, storage.ErrCorrupt) {
			return nil, err
		}
		if err != nil {
			return nil, e.mapErr(fmt.Errorf("pgstore: subscription %d: list DLQ: %w", s.ID, err))
		}
		en.Message = *m
		en.Reason = storage.DLQReason(reason)
		en.Rule = storage.PoisonRule(rule)
		var hist []policy.Failure
		if err := decodeFailures(fs, &hist); err != nil {
			return nil, err
		}
		en.Failures = policy.Failures(hist)
		en.DeadAt = en.DeadAt.UTC()
		out = append(out, en)
	}
	if err := rows.Err(); err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: subscription %d: list DLQ: %w", s.ID, err))
	}
	return out, nil
}

// DLQPurge removes DLQ entries (all of them when IDs is empty; IDs not in the DLQ are ignored)
// and returns how many. Durable when it returns. Taking its locks is bounded by Config.TxTimeout
// like DLQReplay's (see dlqMove).
func (e *Engine) DLQPurge(ctx context.Context, p *storage.DLQPurgeParams) (int, error) {
	if err := p.Check(); err != nil {
		return 0, err
	}
	var topic string
	return e.dlqMove(ctx, "DLQ purge", p.SubscriptionID, p.IDs, false, `DELETE FROM spool.dlq
		WHERE sub_id = $1 AND replay IS NULL AND (cardinality($2::bigint[]) = 0 OR id = ANY ($2))`, &topic)
}

// DLQRecovered returns nothing: the leases of this engine are rows that outlive a restart of
// the broker (expired, the next claim dead-letters them and says so).
func (e *Engine) DLQRecovered(ctx context.Context) ([]storage.DeadLetterCount, error) {
	return nil, nil
}

// DLQReplay moves DLQ entries (all of them when IDs is empty; IDs not in the DLQ are ignored) back
// to their subscription only, due at once with a fresh attempt count, and returns how many. A
// replayed message is delivered from the entry's copy, so it does not matter whether the log still
// holds it. Durable when it returns. Taking its locks is bounded by Config.TxTimeout: past it, the
// call fails with TIMEOUT (retryable) and nothing changes; the update itself is not bounded (see
// dlqMove).
func (e *Engine) DLQReplay(ctx context.Context, p *storage.DLQReplayParams) (int, error) {
	if err := p.Check(); err != nil {
		return 0, err
	}
	var topic string
	n, err := e.dlqMove(ctx, "DLQ replay", p.SubscriptionID, p.IDs, true, `UPDATE spool.dlq SET replay = 'waiting', replay_attempt = 0,
			replay_member = '', replay_due = $3, rule = '', failures = NULL
		WHERE sub_id = $1 AND replay IS NULL AND (cardinality($2::bigint[]) = 0 OR id = ANY ($2))`, &topic)
	if err == nil && n > 0 {
		e.announceToOthers(storage.Notification{Kind: storage.NotifyMessages, Topic: topic})
	}
	return n, err
}

// dlqMove runs a purge or replay (what) statement ($1 subscription, $2 IDs, $3 now withNow) under
// the subscription's sub_partitions locks, sets *topic to the subscription's topic and returns how
// many entries it changed. Taking the
// locks is bounded by Config.TxTimeout; the statement is not, since it changes as many rows as the
// DLQ holds (txLocksBounded): a DLQ of millions of entries must still be purgeable.
func (e *Engine) dlqMove(ctx context.Context, what string, id int64, ids []int64, withNow bool, stmt string, topic *string) (int, error) {
	if ids == nil {
		ids = []int64{}
	}
	var n int
	err := e.txLocksBounded(ctx, what, func(ctx context.Context, tx pgx.Tx, locked func() error) error {
		s, err := e.loadSub(ctx, tx, id, noLock)
		if err != nil {
			return err
		}
		if s.State == storage.Cancelled {
			return fmt.Errorf("%w: subscription %d is %s", storage.ErrSubscriptionNotActive, id, s.State)
		}
		*topic = s.Topic
		if err := e.lockSubState(ctx, tx, id); err != nil {
			return err
		}
		if err := locked(); err != nil {
			return err
		}
		args := []any{id, ids}
		if withNow {
			args = append(args, e.now())
		}
		ct, err := tx.Exec(ctx, e.sql(stmt), args...)
		if err != nil {
			return fmt.Errorf("pgstore: subscription %d: DLQ: %w", id, err)
		}
		n = int(ct.RowsAffected())
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// expireDLQ removes the DLQ entries of the topic's subscriptions that are dead since before
// cutoff (max_retention) and returns how many. Called by RetentionApply inside its transaction.
// It locks the topic's sub_partitions rows first (partition, then subscription order, as
// trimDeliveryState does), so that it never waits for a DLQ row while holding what a delivery
// operation of the subscription waits for.
func (e *Engine) expireDLQ(ctx context.Context, tx pgx.Tx, topicID int64, cutoff time.Time) (int64, error) {
	b := &pgx.Batch{}
	b.Queue(e.sql(`SELECT 1 FROM spool.sub_partitions sp JOIN spool.subscriptions s ON s.id = sp.sub_id
		WHERE s.topic_id = $1 AND EXISTS (SELECT 1 FROM spool.dlq q WHERE q.sub_id = s.id AND q.replay IS NULL AND q.dead_at < $2)
		ORDER BY sp.partition, sp.sub_id FOR UPDATE OF sp`), topicID, cutoff)
	var n int64
	b.Queue(e.sql(`DELETE FROM spool.dlq q USING spool.subscriptions s
		WHERE q.topic_id = $1 AND q.replay IS NULL AND q.dead_at < $2 AND s.id = q.sub_id
		  AND s.state NOT IN ('CANCELLED', 'DELETED')`), topicID, cutoff).Exec(func(ct pgconn.CommandTag) error {
		n = ct.RowsAffected()
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("pgstore: topic %d: expire DLQ entries: %w", topicID, err)
	}
	return n, nil
}

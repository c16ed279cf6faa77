package pgstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolmq/spool/internal/storage"
)

// ephemeralGroupPrefix names the group of an ephemeral subscription created without one:
// "$ephemeral-<id>".
const ephemeralGroupPrefix = "$ephemeral-"

// partBounds are the committed bounds of one topic partition.
type partBounds struct {
	next, low int64
}

// resolveStart turns a start position into the first offset of every partition of t. It locks
// the topic's partition rows FOR SHARE (in partition order): publishers in flight commit first,
// and retention cannot move a low offset before the subscription's rows are committed (it would
// not raise their floors). Time searches use published_at, which is non-decreasing per partition.
func (e *Engine) resolveStart(ctx context.Context, tx pgx.Tx, t *topicRow, sp storage.StartPosition) ([]int64, error) {
	starts, _, err := e.resolveStartBounds(ctx, tx, t, sp)
	return starts, err
}

// resolveStartBackfill resolves a start position like resolveStart and makes the backfill range
// from it to the partitions' ends, cut to the newest maxMessages; the starts it returns are
// raised past the cut.
func (e *Engine) resolveStartBackfill(ctx context.Context, tx pgx.Tx, t *topicRow, sp storage.StartPosition, maxMessages int64) ([]int64, *storage.Backfill, error) {
	starts, parts, err := e.resolveStartBounds(ctx, tx, t, sp)
	if err != nil {
		return nil, nil, err
	}
	if t.cfg.Semantics == storage.Queue {
		return starts, nil, nil // a queue is never cut nor paced (see storage.Backfill)
	}
	bf, starts := newBackfill(starts, parts, maxMessages, e.now())
	return starts, bf, nil
}

// newBackfill makes the backfill from starts (start offsets or floors) to the ends of parts,
// and returns it (nil: nothing to catch up) with the starts raised past the cut.
func newBackfill(starts []int64, parts []partBounds, maxMessages int64, now time.Time) (*storage.Backfill, []int64) {
	from, ends := make([]int64, len(starts)), make([]int64, len(starts))
	for i := range starts {
		from[i], ends[i] = starts[i], starts[i]
		if i < len(parts) {
			from[i], ends[i] = max(starts[i], parts[i].low), parts[i].next
		}
	}
	bf, cut := storage.NewBackfill(from, ends, maxMessages, now)
	out := slices.Clone(starts)
	for i := range out {
		if cut[i] > from[i] {
			out[i] = cut[i]
		}
	}
	return bf, out
}

// resolveStartBounds is resolveStart, also returning the partitions' bounds it read.
func (e *Engine) resolveStartBounds(ctx context.Context, tx pgx.Tx, t *topicRow, sp storage.StartPosition) ([]int64, []partBounds, error) {
	rows, err := tx.Query(ctx, e.sql("SELECT next_offset, low_offset FROM spool.partitions WHERE topic_id = $1 ORDER BY partition FOR SHARE"), t.id)
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: topic %q: partitions: %w", t.name, err)
	}
	var parts []partBounds
	for rows.Next() {
		var b partBounds
		if err := rows.Scan(&b.next, &b.low); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("pgstore: topic %q: partitions: %w", t.name, err)
		}
		parts = append(parts, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("pgstore: topic %q: partitions: %w", t.name, err)
	}
	if len(parts) != t.cfg.Partitions {
		return nil, nil, fmt.Errorf("%w: topic %q has %d partition rows, config says %d", storage.ErrCorrupt, t.name, len(parts), t.cfg.Partitions)
	}
	starts := make([]int64, len(parts))
	switch sp.Kind {
	case storage.FromNow:
		for i, p := range parts {
			starts[i] = p.next
		}
	case storage.FromBeginning:
		for i, p := range parts {
			starts[i] = p.low
		}
	case storage.FromTimestamp:
		if sp.Time.IsZero() {
			for i, p := range parts {
				starts[i] = p.low
			}
			break
		}
		if err := e.searchTime(ctx, tx, t, sp.Time, starts); err != nil {
			return nil, nil, err
		}
	case storage.FromMessageID:
		if int(sp.Partition) >= len(parts) {
			return nil, nil, invalid("start position: partition %d out of range, topic %q has %d", sp.Partition, t.name, len(parts))
		}
		p := parts[sp.Partition]
		if sp.Offset > p.next {
			return nil, nil, fmt.Errorf("%w: start offset %d is above the high-water mark %d of topic %q partition %d",
				storage.ErrOffsetOutOfRange, sp.Offset, p.next, t.name, sp.Partition)
		}
		// A message below the first retained one starts at the first retained one.
		o := max(sp.Offset, p.low)
		ts := e.now()
		if o < p.next {
			var at time.Time
			err := tx.QueryRow(ctx, e.sql(`SELECT published_at FROM spool.messages WHERE topic_id = $1 AND partition = $2 AND "offset" = $3`),
				t.id, sp.Partition, o).Scan(&at)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				return nil, nil, fmt.Errorf("%w: topic %q partition %d: retained message %d is missing", storage.ErrCorrupt, t.name, sp.Partition, o)
			case err != nil:
				return nil, nil, fmt.Errorf("pgstore: topic %q: read start message: %w", t.name, err)
			}
			ts = at
		}
		if err := e.searchTime(ctx, tx, t, ts, starts); err != nil {
			return nil, nil, err
		}
		starts[sp.Partition] = o
	}
	return starts, parts, nil
}

// searchTimesCTE defines found (partition, k, off): for every partition of topic $1 and every
// time $2[k] (k from 1), the first retained offset published at or after it, or the partition's
// high-water mark when there is none. The statements that use it (searchTimeSQL, retention's
// retentionBoundsSQL) add their SELECT after it, so that the offsets come from one snapshot.
//
// published_at does not decrease with the offset in a partition, so it is a binary search over
// [low_offset, next_offset], all partitions and times together, one step per round of the
// recursive query (about log2 of the retained count): each step reads the message at the middle
// offset through the position index. A scan "published_at >= $2 ORDER BY offset LIMIT 1" would
// instead read every message of the bucket that holds the time up to the first match (millions in
// a busy bucket: the whole bucket for a time near its end). Each step also knows that the message
// it reads was published within [lo_at, hi_at] (the times read at the bounds so far, at first the
// partition's low_published_at and last_published_at), which lets PostgreSQL skip the buckets
// outside it. A missing message (a corrupt log) counts as published before the time. (OFFSET 0
// keeps the planner from copying the read into each of the four uses of x.at; PostgreSQL 15 still
// plans it twice: two index probes per step.) The planner prices every step as a read of every
// bucket and would compile the statement with JIT past a hundred buckets (0.4 s for a search of a
// millisecond): run it after noJIT.
const searchTimesCTE = `WITH RECURSIVE s (partition, k, target, lo, hi, lo_at, hi_at) AS (
	SELECT p.partition, t.k, t.target, p.low_offset, p.next_offset,
		coalesce(p.low_published_at, '-infinity'::timestamptz), coalesce(p.last_published_at, 'infinity'::timestamptz)
	FROM spool.partitions p CROSS JOIN unnest($2::timestamptz[]) WITH ORDINALITY AS t (target, k)
	WHERE p.topic_id = $1
	UNION ALL
	SELECT s.partition, s.k, s.target,
		CASE WHEN x.at >= s.target THEN s.lo ELSE c.mid + 1 END,
		CASE WHEN x.at >= s.target THEN c.mid ELSE s.hi END,
		CASE WHEN x.at < s.target THEN x.at ELSE s.lo_at END,
		CASE WHEN x.at >= s.target THEN x.at ELSE s.hi_at END
	FROM s
	CROSS JOIN LATERAL (SELECT (s.lo + s.hi) / 2 AS mid) c
	CROSS JOIN LATERAL (SELECT (SELECT m.published_at FROM spool.messages m
		WHERE m.topic_id = $1 AND m.partition = s.partition AND m."offset" = c.mid
		  AND m.published_at >= s.lo_at AND m.published_at <= s.hi_at) AS at OFFSET 0) x
	WHERE s.lo < s.hi),
found (partition, k, off) AS (SELECT partition, k, lo FROM s WHERE lo >= hi)
`

// searchTimeSQL returns, for every partition of topic $1, the first retained offset published at
// or after the one time in $2 (an array), or the partition's high-water mark when there is none
// (partition, offset; in partition order). See searchTimesCTE.
const searchTimeSQL = searchTimesCTE + `SELECT partition, off FROM found ORDER BY partition`

// noJIT turns JIT compiling off for the rest of tx (see searchTimesCTE).
func noJIT(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "SET LOCAL jit = off")
	return err
}

// searchTime sets starts[i] to the first retained offset of partition i published at or after
// at, or to its high-water mark when there is none. The partition rows must be locked.
func (e *Engine) searchTime(ctx context.Context, tx pgx.Tx, t *topicRow, at time.Time, starts []int64) error {
	if err := noJIT(ctx, tx); err != nil {
		return fmt.Errorf("pgstore: topic %q: search by time: %w", t.name, err)
	}
	rows, err := tx.Query(ctx, e.sql(searchTimeSQL), t.id, []time.Time{at})
	if err != nil {
		return fmt.Errorf("pgstore: topic %q: search by time: %w", t.name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			return fmt.Errorf("pgstore: topic %q: search by time: %w", t.name, err)
		}
		if int(p) < len(starts) {
			starts[p] = o
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgstore: topic %q: search by time: %w", t.name, err)
	}
	return nil
}

// insertSub inserts an ACTIVE subscription of t with one sub_partitions row per partition
// (ack_floor = cursor = starts[i]). An empty group (ephemeral subscriptions) becomes
// "$ephemeral-<id>". An ephemeral subscription is owned by this instance. A live subscription of
// the same group is storage.ErrSubscriptionExists (unique index subscriptions_live_group).
func (e *Engine) insertSub(ctx context.Context, tx pgx.Tx, t *topicRow, group, pattern string, ephemeral bool,
	start storage.StartPosition, starts []int64, now time.Time, hbTimeout time.Duration, maxBackfill int64, bf *storage.Backfill) (*subRow, error) {
	startJSON, err := json.Marshal(start)
	if err != nil {
		return nil, fmt.Errorf("pgstore: encode start position: %w", err)
	}
	var bfJSON []byte
	if bf != nil {
		if bfJSON, err = json.Marshal(bf); err != nil {
			return nil, fmt.Errorf("pgstore: encode backfill: %w", err)
		}
	}
	var owner pgtype.UUID
	if ephemeral {
		owner = e.instanceUUID()
	}
	s, err := scanSub(tx.QueryRow(ctx, e.sql(`WITH n AS (SELECT nextval('spool.subscriptions_id_seq') AS id)
		INSERT INTO spool.subscriptions (id, topic_id, topic, group_name, pattern, ephemeral, owner, state, start, created_at, updated_at,
			heartbeat_timeout_ms, last_heartbeat_at, max_backfill, backfill)
		SELECT n.id, $1, $2, CASE WHEN $3 = '' THEN $9 || n.id ELSE $3 END, $4, $5, $6, 'ACTIVE', $7, $8, $8,
			$10, COALESCE($11::timestamptz, now()), $12, $13 FROM n
		RETURNING `+subColumns),
		t.id, t.name, group, pattern, ephemeral, owner, startJSON, now, ephemeralGroupPrefix,
		cmp.Or(hbTimeout, storage.DefaultHeartbeatTimeout).Milliseconds(), e.beatTime(), maxBackfill, bfJSON))
	if isUniqueViolation(err) {
		return nil, fmt.Errorf("%w: topic %q group %q", storage.ErrSubscriptionExists, t.name, group)
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: create subscription on topic %q: %w", t.name, err)
	}
	if _, err := tx.Exec(ctx, e.sql(`INSERT INTO spool.sub_partitions (sub_id, partition, ack_floor, cursor, start_offset)
		SELECT $1, (u.ord - 1)::int, u.o, u.o, u.o FROM unnest($2::bigint[]) WITH ORDINALITY AS u(o, ord)`), s.ID, starts); err != nil {
		return nil, fmt.Errorf("pgstore: create subscription %d: partitions: %w", s.ID, err)
	}
	return s, nil
}

// SubscriptionCreate creates a subscription. On a QUEUE topic it fails with
// storage.ErrSubscriptionExists while the queue subscription is not CANCELLED (one created after a
// cancel gets the group storage.QueueGroup whatever Group says, and is durable). On a PUB_SUB
// topic a durable subscription needs a group with no other non-cancelled subscription on the
// topic; an ephemeral one without a group gets "$ephemeral-<id>" and belongs to this instance
// (removed at Close, or by maintenance when the instance's heartbeat is stale). The topic row is
// locked FOR SHARE, so a concurrent TopicUpdate or TopicDelete waits. Bounded by
// Config.TxTimeout (past it: TIMEOUT, retryable): the subscription gets one sub_partitions row per
// partition and no delivery state (nothing is copied), and its start offsets take an index lookup
// per partition.
func (e *Engine) SubscriptionCreate(ctx context.Context, params *storage.SubscriptionCreateParams) (*storage.Subscription, error) {
	start, err := params.Check()
	if err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "subscription create", func(ctx context.Context) (*storage.Subscription, error) {
		return e.subscriptionCreate(ctx, params, start)
	})
}

// checkCount fails with storage.ErrLimitExceeded when countSQL counts max or more rows, under the
// transaction-level advisory lock named lock: creations of every instance take turns on it, so
// the count is exact.
func (e *Engine) checkCount(ctx context.Context, tx pgx.Tx, lock, countSQL string, max int, what string) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(e.schema, lock)); err != nil {
		return fmt.Errorf("pgstore: %s: lock: %w", lock, err)
	}
	var n int
	if err := tx.QueryRow(ctx, e.sql(countSQL)).Scan(&n); err != nil {
		return fmt.Errorf("pgstore: %s: count: %w", lock, err)
	}
	if n >= max {
		return fmt.Errorf("%w: %d %s", storage.ErrLimitExceeded, n, what)
	}
	return nil
}

// subscriptionCreate runs SubscriptionCreate with ctx bounded by Config.TxTimeout.
func (e *Engine) subscriptionCreate(ctx context.Context, params *storage.SubscriptionCreateParams, start storage.StartPosition) (*storage.Subscription, error) {
	var out *storage.Subscription
	err := e.tx(ctx, func(tx pgx.Tx) error {
		t, err := e.loadTopic(ctx, tx, params.Topic, forShare)
		if err != nil {
			return err
		}
		group, ephemeral := params.Group, params.Ephemeral
		switch {
		case t.cfg.Semantics == storage.Queue:
			group, ephemeral = storage.QueueGroup, false
		case group == storage.QueueGroup:
			return invalid("group %q is reserved for QUEUE topics", storage.QueueGroup)
		case group == "" && !ephemeral:
			return invalid("a durable subscription to PUB_SUB topic %q needs a group", params.Topic)
		}
		if group != "" {
			var id int64
			var state string
			var ordering []byte
			err := tx.QueryRow(ctx, e.sql(`SELECT id, state, ordering FROM spool.subscriptions
				WHERE topic_id = $1 AND group_name = $2 AND state IN ('ACTIVE', 'PAUSED', 'DEAD') LIMIT 1`), t.id, group).Scan(&id, &state, &ordering)
			if err == nil {
				exists := storage.ErrSubscriptionExists
				var cur storage.Subscription
				if scanOrdering(&cur, ordering) != nil || cur.Ordering() != params.Ordering() {
					exists = storage.ErrModeConflict
				}
				return fmt.Errorf("%w: topic %q group %q (subscription %d, %s)", exists, params.Topic, group, id, state)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("pgstore: create subscription on topic %q: %w", params.Topic, err)
			}
		}
		if !ephemeral && params.MaxSubscriptions > 0 {
			if err := e.checkCount(ctx, tx, "sub-create", `SELECT count(*) FROM spool.subscriptions
				WHERE NOT ephemeral AND state <> 'DELETED'`, params.MaxSubscriptions,
				"subscriptions, the most this broker keeps (broker.max_subscriptions); delete groups or raise it"); err != nil {
				return err
			}
		}
		starts, bf, err := e.resolveStartBackfill(ctx, tx, t, start, params.MaxBackfillMessages)
		if err != nil {
			return err
		}
		var skips [][][2]int64
		if t.cfg.CompletionTracking == storage.Refcount {
			// Added to the pending messages only: its start skips those already complete.
			if starts, skips, err = e.refcountJoin(ctx, tx, t.id, 0, starts); err != nil {
				return err
			}
		}
		s, err := e.insertSub(ctx, tx, t, group, params.Pattern, ephemeral, start, starts, e.now(), params.HeartbeatTimeout,
			params.MaxBackfillMessages, bf)
		if err != nil {
			return err
		}
		if err := e.markSkipped(ctx, tx, s.ID, t.id, skips); err != nil {
			return err
		}
		if err := e.setOrdering(ctx, tx, s, params.Ordering()); err != nil {
			return err
		}
		out = &s.Subscription
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// lockSubState locks a subscription's sub_partitions rows (in partition order) before
// dropSubState deletes them, so that the wait for delivery transactions holding them is bounded
// with the locks (txLocksBounded) and not with the delete.
func (e *Engine) lockSubState(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := tx.Exec(ctx, e.sql("SELECT 1 FROM spool.sub_partitions WHERE sub_id = $1 ORDER BY partition FOR UPDATE"), id); err != nil {
		return fmt.Errorf("pgstore: subscription %d: lock delivery state: %w", id, err)
	}
	return nil
}

// dropSubState removes a subscription's delivery state (CANCELLED and DELETED subscriptions have
// none): its sub_partitions rows, with the spool.deliveries rows that reference them (the trigger
// sub_partition_gone, migration 0021), and its DLQ entries (spool.dlq, see 0002_deliveries.sql).
// Lock order: sub_partitions, then delivery rows, then dlq.
func (e *Engine) dropSubState(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := tx.Exec(ctx, e.sql("DELETE FROM spool.sub_partitions WHERE sub_id = $1"), id); err != nil {
		return fmt.Errorf("pgstore: subscription %d: drop delivery state: %w", id, err)
	}
	if _, err := tx.Exec(ctx, e.sql("DELETE FROM spool.dlq WHERE sub_id = $1"), id); err != nil {
		return fmt.Errorf("pgstore: subscription %d: drop DLQ: %w", id, err)
	}
	return nil
}

// deleteSub deletes a locked subscription: an ephemeral one is removed, a durable one keeps its
// row as DELETED (SubscriptionList with IncludeDeleted) without delivery state. Subscription rows
// are locked FOR NO KEY UPDATE by state changes, so that delivery operations inserting rows that
// reference the subscription (DLQ entries) do not wait for them while holding sub_partitions
// locks (lock order).
func (e *Engine) deleteSub(ctx context.Context, tx pgx.Tx, s *subRow) (*subRow, error) {
	if err := e.dropSubState(ctx, tx, s.ID); err != nil {
		return nil, err
	}
	if s.Ephemeral {
		if _, err := tx.Exec(ctx, e.sql("DELETE FROM spool.subscriptions WHERE id = $1"), s.ID); err != nil {
			return nil, fmt.Errorf("pgstore: delete subscription %d: %w", s.ID, err)
		}
		c := *s
		c.State, c.UpdatedAt = storage.Deleted, e.now()
		return &c, nil
	}
	return e.setSubState(ctx, tx, s.ID, storage.Deleted)
}

// setSubState sets a subscription's state and updated_at and returns the row.
func (e *Engine) setSubState(ctx context.Context, tx pgx.Tx, id int64, state storage.SubscriptionState) (*subRow, error) {
	// Becoming ACTIVE (resumed, resurrected) restarts the heartbeat timeout.
	s, err := scanSub(tx.QueryRow(ctx, e.sql(`UPDATE spool.subscriptions SET state = $2, updated_at = $3,
		last_heartbeat_at = CASE WHEN $2 = 'ACTIVE' THEN COALESCE($4::timestamptz, now()) ELSE last_heartbeat_at END
		WHERE id = $1 RETURNING `+subColumns),
		id, string(state), e.now(), e.beatTime()))
	if err != nil {
		return nil, fmt.Errorf("pgstore: subscription %d: set state %s: %w", id, state, err)
	}
	return s, nil
}

// SubscriptionDelete deletes a subscription and its delivery state at once. A durable one is kept
// as DELETED (SubscriptionList with IncludeDeleted); an ephemeral one is forgotten. Taking the
// locks is bounded by Config.TxTimeout (past it: TIMEOUT, retryable; nothing is deleted); the
// delete is not, since it removes as many rows as the subscription's DLQ holds (txLocksBounded).
func (e *Engine) SubscriptionDelete(ctx context.Context, id int64) error {
	var topic string
	err := e.txLocksBounded(ctx, "subscription delete", func(ctx context.Context, tx pgx.Tx, locked func() error) error {
		s, err := e.loadSub(ctx, tx, id, forNoKeyUpdate)
		if err != nil {
			return err
		}
		if err := e.lockSubState(ctx, tx, id); err != nil {
			return err
		}
		if err := locked(); err != nil {
			return err
		}
		topic = s.Topic
		_, err = e.deleteSub(ctx, tx, s)
		return err
	})
	if err != nil {
		return err
	}
	e.subscriptionChanged(topic, id)
	return nil
}

// SubscriptionGet returns a subscription that is not DELETED. Bounded by Config.TxTimeout (past
// it: TIMEOUT, retryable).
func (e *Engine) SubscriptionGet(ctx context.Context, id int64) (*storage.Subscription, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "subscription get", func(ctx context.Context) (*storage.Subscription, error) {
		s, err := e.loadSub(ctx, e.pool, id, noLock)
		if err != nil {
			return nil, e.mapErr(err)
		}
		return &s.Subscription, nil
	})
}

// SubscriptionGetByGroup returns the newest subscription of (topic, group) that is not DELETED.
// Bounded by Config.TxTimeout (past it: TIMEOUT, retryable).
func (e *Engine) SubscriptionGetByGroup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "subscription get", func(ctx context.Context) (*storage.Subscription, error) {
		s, err := scanSub(e.pool.QueryRow(ctx, e.sql("SELECT "+subColumns+` FROM spool.subscriptions
			WHERE topic = $1 AND group_name = $2 AND state <> 'DELETED' ORDER BY id DESC LIMIT 1`), topic, group))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("%w: topic %q group %q", storage.ErrSubscriptionNotFound, topic, group)
		}
		if err != nil {
			return nil, e.mapErr(fmt.Errorf("pgstore: subscription of topic %q group %q: %w", topic, group, err))
		}
		return &s.Subscription, nil
	})
}

// SubscriptionList lists subscriptions ordered by ID, optionally of one topic, DELETED ones only
// with IncludeDeleted. Bounded by Config.TxTimeout (past it: TIMEOUT, retryable).
func (e *Engine) SubscriptionList(ctx context.Context, params *storage.SubscriptionListParams) ([]*storage.Subscription, error) {
	var p storage.SubscriptionListParams
	if params != nil {
		p = *params
	}
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "subscription list", func(ctx context.Context) ([]*storage.Subscription, error) {
		return e.subscriptionList(ctx, &p)
	})
}

// subscriptionList runs SubscriptionList with ctx bounded by Config.TxTimeout.
func (e *Engine) subscriptionList(ctx context.Context, p *storage.SubscriptionListParams) ([]*storage.Subscription, error) {
	rows, err := e.pool.Query(ctx, e.sql("SELECT "+subColumns+` FROM spool.subscriptions
		WHERE ($1 = '' OR topic = $1) AND ($2 OR state <> 'DELETED') ORDER BY id`), p.Topic, p.IncludeDeleted)
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: list subscriptions: %w", err))
	}
	defer rows.Close()
	out := []*storage.Subscription{}
	for rows.Next() {
		s, err := scanSub(rows)
		if err != nil {
			if errors.Is(err, storage.ErrCorrupt) {
				return nil, err
			}
			return nil, e.mapErr(fmt.Errorf("pgstore: list subscriptions: %w", err))
		}
		out = append(out, &s.Subscription)
	}
	if err := rows.Err(); err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: list subscriptions: %w", err))
	}
	return out, nil
}

// SubscriptionUpdate changes a subscription's state following storage.CanTransition (setting the
// current state again is storage.ErrInvalidTransition too). CANCELLED drops the delivery state at
// once; DELETED is SubscriptionDelete. Bounded by Config.TxTimeout (past it: TIMEOUT, retryable;
// nothing changes), except, for CANCELLED and DELETED, the delete of the delivery state and DLQ
// once the locks are taken (as SubscriptionDelete).
func (e *Engine) SubscriptionUpdate(ctx context.Context, params *storage.SubscriptionUpdateParams) (*storage.Subscription, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	var out *storage.Subscription
	// A transaction that does not call locked is bounded whole, COMMIT included.
	err := e.txLocksBounded(ctx, "subscription update", func(ctx context.Context, tx pgx.Tx, locked func() error) error {
		s, err := e.loadSub(ctx, tx, params.ID, forNoKeyUpdate)
		if errors.Is(err, storage.ErrSubscriptionNotFound) {
			// A DELETED subscription is kept (listed with IncludeDeleted): its update is a
			// refused transition, DELETED being final, not an unknown subscription.
			var state string
			if qerr := tx.QueryRow(ctx, e.sql("SELECT state FROM spool.subscriptions WHERE id = $1"), params.ID).Scan(&state); qerr == nil && state == string(storage.Deleted) {
				return fmt.Errorf("%w: subscription %d from %s to %s", storage.ErrInvalidTransition, params.ID, state, params.State)
			}
		}
		if err != nil {
			return err
		}
		if !storage.CanTransition(s.State, params.State) {
			return fmt.Errorf("%w: subscription %d from %s to %s", storage.ErrInvalidTransition, params.ID, s.State, params.State)
		}
		if params.State == storage.Deleted || params.State == storage.Cancelled {
			if err := e.lockSubState(ctx, tx, s.ID); err != nil {
				return err
			}
			if err := locked(); err != nil {
				return err
			}
		}
		switch params.State {
		case storage.Deleted:
			s, err = e.deleteSub(ctx, tx, s)
		case storage.Cancelled:
			if err = e.dropSubState(ctx, tx, s.ID); err == nil {
				s, err = e.setSubState(ctx, tx, s.ID, params.State)
			}
		default:
			leftAt, back := s.UpdatedAt, s.State == storage.Dead && params.State == storage.Active
			s, err = e.setSubState(ctx, tx, s.ID, params.State)
			if err == nil && back {
				err = e.rejoinIfRefcount(ctx, tx, s.ID, leftAt)
			}
		}
		if err != nil {
			return err
		}
		out = &s.Subscription
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out.State == storage.Active {
		// Resumed (or revived): members connected to other instances may claim again.
		e.announceToOthers(storage.Notification{Kind: storage.NotifyMessages, Topic: out.Topic})
	}
	e.subscriptionChanged(out.Topic, out.ID)
	return out, nil
}

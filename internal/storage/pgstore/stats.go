package pgstore

import (
	"context"
	"fmt"

	"github.com/spoolmq/spool/internal/storage"
)

// statsSQL computes a subscription's figures per partition in one statement (one snapshot): its
// floor and cursor, the partition's high-water mark, the leased, waiting and acked-ahead offsets
// of its delivery rows and its skip runs (skipruns.go); and, on every row, the subscription's replayed DLQ entries (leased,
// waiting) and DLQ length. The replayed entries are counted through their partial index
// (dlq_replay_due, 0005), and the DLQ length as all entries less those, which an index-only scan of
// the primary key can count: a DLQ of millions still costs a count of its index entries.
var statsSQL = `
SELECT sp.partition, sp.ack_floor, sp.cursor, coalesce(p.next_offset, sp.cursor),
	coalesce(d.leased, 0), coalesce(d.waiting, 0), coalesce(d.acked, 0) + ` + skipCountSQL("sp.skips", "sp.cursor", "coalesce(p.next_offset, sp.cursor)") + `,
	r.leased, r.waiting, (SELECT count(*) FROM spool.dlq q WHERE q.sub_id = $1) - r.leased - r.waiting
FROM spool.sub_partitions sp
CROSS JOIN (SELECT count(*) FILTER (WHERE q.replay = 'leased') AS leased, count(*) FILTER (WHERE q.replay = 'waiting') AS waiting
	FROM spool.dlq q WHERE q.sub_id = $1 AND q.replay IS NOT NULL) r
LEFT JOIN spool.partitions p ON p.topic_id = $2 AND p.partition = sp.partition
LEFT JOIN LATERAL (
	SELECT sum(cardinality(x.offsets)) FILTER (WHERE x.state = 'leased') AS leased,
		sum(cardinality(x.offsets)) FILTER (WHERE x.state = 'waiting') AS waiting,
		sum(cardinality(x.offsets)) FILTER (WHERE x.state = 'acked') AS acked
	FROM spool.deliveries x WHERE x.sub_id = sp.sub_id AND x.partition = sp.partition) d ON true
WHERE sp.sub_id = $1
ORDER BY sp.partition`

// subStats computes the figures of subscription s (not CANCELLED) with q.
func (e *Engine) subStats(ctx context.Context, q querier, s *subRow) (*storage.SubscriptionStats, error) {
	st := &storage.SubscriptionStats{SubscriptionID: s.ID, Partitions: []storage.SubscriptionPartitionStats{}}
	rows, err := q.Query(ctx, e.sql(statsSQL), s.ID, s.topicID)
	if err != nil {
		return nil, fmt.Errorf("pgstore: subscription %d: stats: %w", s.ID, err)
	}
	defer rows.Close()
	var ahead, replayLeased, replayWaiting, dead int64
	for rows.Next() {
		var ps storage.SubscriptionPartitionStats
		var leased, waiting, acked int64
		if err := rows.Scan(&ps.Partition, &ps.AckFloor, &ps.Cursor, &ps.HighWater, &leased, &waiting, &acked,
			&replayLeased, &replayWaiting, &dead); err != nil {
			return nil, fmt.Errorf("pgstore: subscription %d: stats: %w", s.ID, err)
		}
		st.Lag += max(ps.HighWater-ps.Cursor, 0)
		st.InFlight += leased
		st.Redelivering += waiting
		ahead += acked
		st.Partitions = append(st.Partitions, ps)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: subscription %d: stats: %w", s.ID, err)
	}
	if len(st.Partitions) == 0 {
		// No delivery state (it was dropped): the DLQ went with it.
		return st, nil
	}
	st.InFlight += replayLeased
	st.Redelivering += replayWaiting
	st.DeadLettered = dead
	st.Pending = max(st.Lag+st.InFlight+st.Redelivering-ahead, 0)
	return st, nil
}

// SubscriptionStats returns a subscription's depth, lag, in-flight and DLQ figures, read in one
// statement. Redelivering counts every delivered-or-delayed message waiting to go out (backoff,
// nack delay, a NotBefore time, a replayed DLQ entry), so Pending = Lag + InFlight + Redelivering,
// less the messages acked before they were delivered (which stay in Lag until the cursor passes
// them). Leases that expired and were not processed by a claim yet count as InFlight. A CANCELLED
// subscription has no delivery state: its figures are zero. Bounded by Config.TxTimeout (past it:
// TIMEOUT, retryable).
func (e *Engine) SubscriptionStats(ctx context.Context, id int64) (*storage.SubscriptionStats, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "subscription stats", func(ctx context.Context) (*storage.SubscriptionStats, error) {
		return e.subscriptionStats(ctx, id)
	})
}

// subscriptionStats runs SubscriptionStats with ctx bounded by Config.TxTimeout.
func (e *Engine) subscriptionStats(ctx context.Context, id int64) (*storage.SubscriptionStats, error) {
	s, err := e.loadSub(ctx, e.pool, id, noLock)
	if err != nil {
		return nil, e.mapErr(err)
	}
	if s.State == storage.Cancelled {
		return &storage.SubscriptionStats{SubscriptionID: id}, nil
	}
	st, err := e.subStats(ctx, e.pool, s)
	if err != nil {
		return nil, e.mapErr(err)
	}
	return st, nil
}

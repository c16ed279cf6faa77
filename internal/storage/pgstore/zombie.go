package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// zombie_ttl (storage.TopicConfig.ZombieTTL, storage.Engine.RetentionApply): each instance
// remembers, per topic, the ack floors its retention runs saw and since when. Several instances
// each keep their own view: a floor is stuck for an instance once it saw the same floor more than
// zombie_ttl ago, which is never earlier than the truth because floors never go back. A restart
// forgets the views: it postpones a force-advance, never hastens it.

// watchKey is a subscription partition.
type watchKey struct {
	sub       int64
	partition int32
}

// floorWatch is the floor a run saw and since when it has not moved by the subscription's own
// doing.
type floorWatch struct {
	floor int64
	since time.Time
}

// floorWatches holds the views, by topic id. A topic's map is replaced by each committed run.
type floorWatches struct {
	mu     sync.Mutex
	topics map[int64]map[watchKey]floorWatch
}

func (w *floorWatches) get(topicID int64) map[watchKey]floorWatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.topics[topicID]
}

func (w *floorWatches) put(topicID int64, m map[watchKey]floorWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.topics == nil {
		w.topics = map[int64]map[watchKey]floorWatch{}
	}
	if len(m) == 0 {
		delete(w.topics, topicID)
		return
	}
	w.topics[topicID] = m
}

// keep forgets the views of topics not in live (deleted ones).
func (w *floorWatches) keep(live map[int64]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range w.topics {
		if !live[id] {
			delete(w.topics, id)
		}
	}
}

// zombieFloorsSQL lists the floors of the subscriptions of topic $1 that hold retention.
const zombieFloorsSQL = `SELECT sb.id, sb.group_name, sp.partition, sp.ack_floor
FROM spool.subscriptions sb JOIN spool.sub_partitions sp ON sp.sub_id = sb.id
WHERE sb.topic_id = $1 AND sb.state IN ('ACTIVE', 'PAUSED')
ORDER BY sb.id, sp.partition`

// advanceZombies force-advances, inside tx, the stuck floors of the subscriptions of topic
// topicID (name) that hold retention, given prev (the instance's view after its last run), and
// returns the new view. What the subscriptions gave up is counted in res.
func (e *Engine) advanceZombies(ctx context.Context, tx pgx.Tx, topicID int64, name string, cfg storage.TopicConfig,
	now time.Time, prev map[watchKey]floorWatch, res *storage.RetentionResult) (map[watchKey]floorWatch, error) {
	rows, err := tx.Query(ctx, e.sql(zombieFloorsSQL), topicID)
	if err != nil {
		return nil, fmt.Errorf("zombie_ttl: floors: %w", err)
	}
	type stuck struct {
		key   watchKey
		group string
		floor int64
	}
	var stale []stuck
	next := map[watchKey]floorWatch{}
	for rows.Next() {
		var k watchKey
		var group string
		var floor int64
		if err := rows.Scan(&k.sub, &group, &k.partition, &floor); err != nil {
			rows.Close()
			return nil, fmt.Errorf("zombie_ttl: floors: %w", err)
		}
		w, ok := prev[k]
		if !ok || w.floor != floor {
			w = floorWatch{floor: floor, since: now}
		} else if now.Sub(w.since) > cfg.ZombieTTL {
			stale = append(stale, stuck{k, group, floor})
		}
		next[k] = w
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("zombie_ttl: floors: %w", err)
	}
	if len(stale) == 0 {
		return next, nil
	}
	// Lock order (docs/storage.md): the topic's partition rows, in partition order, before any
	// sub_partitions row. forceSubFloor locks sub_partitions rows and advanceLow then the
	// partitions: taken the other way round, a SubscriptionCreate of a refcount topic (partitions,
	// then sub_partitions) would deadlock with this run.
	if _, err := tx.Exec(ctx, e.sql(`SELECT 1 FROM spool.partitions WHERE topic_id = $1 ORDER BY partition FOR UPDATE`), topicID); err != nil {
		return nil, fmt.Errorf("zombie_ttl: lock partitions: %w", err)
	}
	bounds := map[int32]int64{}
	rows, err = tx.Query(ctx, e.sql(searchTimeSQL), topicID, []time.Time{now.Add(-cfg.ZombieTTL)})
	if err != nil {
		return nil, fmt.Errorf("zombie_ttl: search by time: %w", err)
	}
	for rows.Next() {
		var p int32
		var off int64
		if err := rows.Scan(&p, &off); err != nil {
			rows.Close()
			return nil, fmt.Errorf("zombie_ttl: search by time: %w", err)
		}
		bounds[p] = off
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("zombie_ttl: search by time: %w", err)
	}
	for _, z := range stale {
		to, ok := bounds[z.key.partition]
		if !ok || to <= z.floor {
			continue
		}
		n, floor, moved, err := e.forceSubFloor(ctx, tx, z.key.sub, z.key.partition, z.floor, to)
		if err != nil {
			return nil, err
		}
		if !moved {
			delete(next, z.key) // it moved meanwhile: watched afresh at the next run
			continue
		}
		res.AddZombie(name, z.group, z.key.sub, n)
		w := next[z.key]
		w.floor = floor // since is kept: the subscription itself did not move
		next[z.key] = w
	}
	return next, nil
}

// rewatchFloors updates the floors of view (advanceZombies' result) to those of topicID after
// this run's removals, keeping their "since".
func (e *Engine) rewatchFloors(ctx context.Context, tx pgx.Tx, topicID int64, view map[watchKey]floorWatch) error {
	rows, err := tx.Query(ctx, e.sql(zombieFloorsSQL), topicID)
	if err != nil {
		return fmt.Errorf("zombie_ttl: floors after retention: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k watchKey
		var group string
		var floor int64
		if err := rows.Scan(&k.sub, &group, &k.partition, &floor); err != nil {
			return fmt.Errorf("zombie_ttl: floors after retention: %w", err)
		}
		if w, ok := view[k]; ok {
			w.floor = floor
			view[k] = w
		}
	}
	return rows.Err()
}

// forceSubFloor moves the ack floor of one subscription partition from floor to to (and its
// cursor, if below), dropping its delivery state below to, provided the floor is still floor
// (moved is false otherwise and nothing changes). newFloor is the floor after (past to when
// everything from to on up to the cursor was done). n is the number of messages of [floor, to) the
// subscription had not completed: leased or waiting ones, and never-delivered ones not acked
// ahead of the cursor.
func (e *Engine) forceSubFloor(ctx context.Context, tx pgx.Tx, sub int64, partition int32, floor, to int64) (n, newFloor int64, moved bool, err error) {
	var cursor, open, ahead int64
	err = tx.QueryRow(ctx, e.sql(`SELECT sp.cursor,
			(SELECT count(*) FROM spool.deliveries d CROSS JOIN LATERAL unnest(d.offsets) AS o
				WHERE d.sub_id = $1 AND d.partition = $2 AND d.lo < $4 AND d.state <> 'acked' AND o < $4),
			(SELECT count(*) FROM spool.deliveries d CROSS JOIN LATERAL unnest(d.offsets) AS o
				WHERE d.sub_id = $1 AND d.partition = $2 AND d.lo < $4 AND d.state = 'acked' AND o < $4)
				+ `+skipCountSQL("sp.skips", "greatest(sp.cursor, $3)", "$4")+`
		FROM spool.sub_partitions sp
		WHERE sp.sub_id = $1 AND sp.partition = $2 AND sp.ack_floor = $3
		FOR UPDATE`), sub, partition, floor, to).Scan(&cursor, &open, &ahead)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("zombie_ttl: subscription %d partition %d: %w", sub, partition, err)
	}
	b := &pgx.Batch{}
	b.Queue(e.sql(`DELETE FROM spool.deliveries
		WHERE sub_id = $1 AND partition = $2 AND lo < $3 AND offsets[cardinality(offsets)] < $3`), sub, partition, to)
	b.Queue(e.sql(`UPDATE spool.deliveries
		SET offsets = ARRAY(SELECT o FROM unnest(offsets) AS o WHERE o >= $3 ORDER BY o),
			lo = (SELECT min(o) FROM unnest(offsets) AS o WHERE o >= $3)
		WHERE sub_id = $1 AND partition = $2 AND lo < $3`), sub, partition, to)
	b.Queue(e.sql(`UPDATE spool.sub_partitions sp
		SET cursor = greatest(sp.cursor, $3),
			ack_floor = least(greatest(sp.cursor, $3), coalesce((SELECT min(d.lo) FROM spool.deliveries d
				WHERE d.sub_id = sp.sub_id AND d.partition = sp.partition), greatest(sp.cursor, $3)))
		WHERE sp.sub_id = $1 AND sp.partition = $2
		RETURNING sp.ack_floor`), sub, partition, to)
	br := tx.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(&newFloor)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("zombie_ttl: subscription %d partition %d: move floor to %d: %w", sub, partition, to, err)
	}
	return open + max(to-max(cursor, floor), 0) - ahead, newFloor, true, nil
}

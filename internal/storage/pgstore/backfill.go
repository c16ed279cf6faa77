package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// SubscriptionBackfill acts on a subscription's backfill (storage.Engine). Lock order: the
// subscription (FOR NO KEY UPDATE), then its sub_partitions rows (FOR UPDATE, partition order),
// then its delivery rows, as the other subscription changes take them. The partitions' bounds
// are read without a lock: a message appended meanwhile gets an offset at or above the end read,
// so it is past the range, which is what begin means. Bounded by Config.TxTimeout for its locks.
func (e *Engine) SubscriptionBackfill(ctx context.Context, params *storage.SubscriptionBackfillParams) (*storage.SubscriptionBackfillResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	var out *storage.SubscriptionBackfillResult
	err := e.txLocksBounded(ctx, "subscription backfill", func(ctx context.Context, tx pgx.Tx, locked func() error) error {
		s, err := e.loadSub(ctx, tx, params.ID, forNoKeyUpdate)
		if err != nil {
			return err
		}
		if s.State == storage.Cancelled {
			return fmt.Errorf("%w: subscription %d is %s", storage.ErrSubscriptionNotActive, s.ID, s.State)
		}
		floors, err := e.lockFloors(ctx, tx, s.ID)
		if err != nil {
			return err
		}
		if err := locked(); err != nil {
			return err
		}
		now := e.now()
		res := &storage.SubscriptionBackfillResult{}
		bf := s.Backfill.Clone()
		var raise []int64
		switch params.Action {
		case storage.BackfillBegin:
			var semantics string
			if err := tx.QueryRow(ctx, e.sql(`SELECT config->>'semantics' FROM spool.topics WHERE id = $1`), s.topicID).Scan(&semantics); err != nil {
				return fmt.Errorf("pgstore: subscription %d: topic: %w", s.ID, err)
			}
			if storage.Semantics(semantics) == storage.Queue {
				break // a queue is never cut nor paced (see storage.Backfill)
			}
			parts, err := e.partBounds(ctx, tx, s.topicID)
			if err != nil {
				return err
			}
			nb, cut := newBackfill(floors, parts, cmpOr(params.MaxMessages, s.MaxBackfillMessages), now)
			if nb != nil {
				bf, raise, res.Skipped = nb, cut, nb.Skipped
			}
		case storage.BackfillSkip:
			if err := storage.BackfillTransition(bf, params.Action, "", now); err != nil {
				return err
			}
			raise = slices.Clone(bf.End)
		default:
			if err := storage.BackfillTransition(bf, params.Action, params.Error, now); err != nil {
				return err
			}
		}
		for i, f := range raise {
			if i >= len(floors) || f <= floors[i] {
				continue
			}
			n, err := e.raiseFloor(ctx, tx, s.ID, int32(i), f)
			if err != nil {
				return err
			}
			if params.Action == storage.BackfillSkip {
				res.Skipped += n
			}
		}
		if params.Action == storage.BackfillSkip {
			bf.Skipped += res.Skipped
		}
		var bfJSON []byte
		if bf != nil {
			if bfJSON, err = json.Marshal(bf); err != nil {
				return fmt.Errorf("pgstore: encode backfill: %w", err)
			}
		}
		if s, err = scanSub(tx.QueryRow(ctx, e.sql(`UPDATE spool.subscriptions SET backfill = $2 WHERE id = $1 RETURNING `+subColumns),
			s.ID, bfJSON)); err != nil {
			return fmt.Errorf("pgstore: subscription %d: backfill: %w", s.ID, err)
		}
		res.Subscription = &s.Subscription
		out = res
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// lockFloors locks a subscription's sub_partitions rows (partition order) and returns their ack
// floors.
func (e *Engine) lockFloors(ctx context.Context, tx pgx.Tx, id int64) ([]int64, error) {
	rows, err := tx.Query(ctx, e.sql(`SELECT ack_floor FROM spool.sub_partitions WHERE sub_id = $1 ORDER BY partition FOR UPDATE`), id)
	if err != nil {
		return nil, fmt.Errorf("pgstore: subscription %d: lock floors: %w", id, err)
	}
	floors, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("pgstore: subscription %d: lock floors: %w", id, err)
	}
	return floors, nil
}

// partBounds reads the committed bounds of a topic's partitions, in partition order.
func (e *Engine) partBounds(ctx context.Context, tx pgx.Tx, topicID int64) ([]partBounds, error) {
	rows, err := tx.Query(ctx, e.sql("SELECT next_offset, low_offset FROM spool.partitions WHERE topic_id = $1 ORDER BY partition"), topicID)
	if err != nil {
		return nil, fmt.Errorf("pgstore: topic %d: partitions: %w", topicID, err)
	}
	var parts []partBounds
	for rows.Next() {
		var b partBounds
		if err := rows.Scan(&b.next, &b.low); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: topic %d: partitions: %w", topicID, err)
		}
		parts = append(parts, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: topic %d: partitions: %w", topicID, err)
	}
	return parts, nil
}

// raiseFloor raises the ack floor and cursor of one partition of a subscription (its row
// locked) to floor, dropping its delivery state below it as retention does (trimDeliveryState),
// and returns how many messages below floor were not done.
func (e *Engine) raiseFloor(ctx context.Context, tx pgx.Tx, id int64, partition int32, floor int64) (int64, error) {
	var notDone int64
	err := tx.QueryRow(ctx, e.sql(`SELECT greatest($3 - sp.ack_floor, 0) - coalesce((SELECT count(*) FROM spool.deliveries d, unnest(d.offsets) AS o
			WHERE d.sub_id = $1 AND d.partition = $2 AND d.state = 'acked' AND o < $3), 0)
			- `+skipCountSQL("sp.skips", "sp.cursor", "$3")+`
		FROM spool.sub_partitions sp WHERE sp.sub_id = $1 AND sp.partition = $2`), id, partition, floor).Scan(&notDone)
	if err != nil {
		return 0, fmt.Errorf("pgstore: subscription %d partition %d: count below %d: %w", id, partition, floor, err)
	}
	b := &pgx.Batch{}
	b.Queue(e.sql(`DELETE FROM spool.deliveries d
		WHERE d.sub_id = $1 AND d.partition = $2 AND d.lo < $3 AND d.offsets[cardinality(d.offsets)] < $3`), id, partition, floor)
	b.Queue(e.sql(`UPDATE spool.deliveries d
		SET offsets = ARRAY(SELECT o FROM unnest(d.offsets) AS o WHERE o >= $3 ORDER BY o),
			lo = (SELECT min(o) FROM unnest(d.offsets) AS o WHERE o >= $3)
		WHERE d.sub_id = $1 AND d.partition = $2 AND d.lo < $3`), id, partition, floor)
	b.Queue(e.sql(`UPDATE spool.sub_partitions sp
		SET cursor = greatest(sp.cursor, $3),
			ack_floor = least(greatest(sp.cursor, $3), coalesce((SELECT min(d.lo) FROM spool.deliveries d
				WHERE d.sub_id = sp.sub_id AND d.partition = sp.partition), greatest(sp.cursor, $3)))
		WHERE sp.sub_id = $1 AND sp.partition = $2 AND (sp.ack_floor < $3 OR sp.cursor < $3)`), id, partition, floor)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("pgstore: subscription %d partition %d: raise floor to %d: %w", id, partition, floor, err)
	}
	return max(notDone, 0), nil
}

func cmpOr(a, b int64) int64 {
	if a != 0 {
		return a
	}
	return b
}

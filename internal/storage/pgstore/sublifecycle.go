package pgstore

import (
	"time"

	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// Subscription lifecycle (seed 000). Heartbeats and dead detection compare times of the
// database's clock (now()), never of an instance's (seed 000 pitfall 4: instances with skewed
// clocks would disagree on who is dead), unless the engine was given a Config.Clock (the
// conformance suite's fake clock), which then decides everything. Several instances run
// SubscriptionsMaintain at once safely: each transition is one UPDATE whose WHERE names the state
// it leaves, so under READ COMMITTED a second instance's UPDATE waits for the first one's row lock,
// re-reads the row, no longer matches and changes nothing.

// beatTime is the time a heartbeat records: nil (the statement uses now()) on the database clock.
func (e *Engine) beatTime() any {
	if e.dbClock {
		return nil
	}
	return e.now()
}

// SubscriptionsHeartbeat records a heartbeat for each subscription of params.IDs that is ACTIVE,
// PAUSED or DEAD, and makes the DEAD ones ACTIVE. It locks the rows in ID order (lock order) to
// tell which ones it resurrects.
func (e *Engine) SubscriptionsHeartbeat(ctx context.Context, params *storage.SubscriptionsHeartbeatParams) (*storage.SubscriptionsHeartbeatResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	ids := slices.Clone(params.IDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var res *storage.SubscriptionsHeartbeatResult
	err := e.txLocksBounded(ctx, "subscriptions heartbeat", func(ctx context.Context, tx pgx.Tx, _ func() error) error {
		res = &storage.SubscriptionsHeartbeatResult{}
		dead := map[int64]bool{}
		leftAt := map[int64]time.Time{} // of the DEAD ones: when they became DEAD
		rows, err := tx.Query(ctx, e.sql(`SELECT id, state, updated_at FROM spool.subscriptions
			WHERE id = ANY($1) AND state IN ('ACTIVE', 'PAUSED', 'DEAD') ORDER BY id FOR NO KEY UPDATE`), ids)
		if err != nil {
			return fmt.Errorf("pgstore: heartbeat: lock subscriptions: %w", err)
		}
		var locked []int64
		for rows.Next() {
			var id int64
			var state string
			var updated time.Time
			if err := rows.Scan(&id, &state, &updated); err != nil {
				rows.Close()
				return fmt.Errorf("pgstore: heartbeat: lock subscriptions: %w", err)
			}
			locked = append(locked, id)
			dead[id] = state == string(storage.Dead)
			if dead[id] {
				leftAt[id] = updated
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("pgstore: heartbeat: lock subscriptions: %w", err)
		}
		if len(locked) == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, e.sql(`UPDATE spool.subscriptions SET last_heartbeat_at = COALESCE($2::timestamptz, now()),
			state = CASE WHEN state = 'DEAD' THEN 'ACTIVE' ELSE state END,
			updated_at = CASE WHEN state = 'DEAD' THEN $3 ELSE updated_at END
			WHERE id = ANY($1) RETURNING `+subColumns), locked, e.beatTime(), e.now())
		if err != nil {
			return fmt.Errorf("pgstore: heartbeat: %w", err)
		}
		for rows.Next() {
			s, err := scanSub(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("pgstore: heartbeat: %w", err)
			}
			res.Beats++
			if dead[s.ID] {
				res.Resurrected = append(res.Resurrected, &s.Subscription)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("pgstore: heartbeat: %w", err)
		}
		for _, s := range res.Resurrected {
			if err := e.rejoinIfRefcount(ctx, tx, s.ID, leftAt[s.ID]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sortSubs(res.Resurrected)
	for _, s := range res.Resurrected {
		// Members connected to other instances may claim again.
		e.announceToOthers(storage.Notification{Kind: storage.NotifyMessages, Topic: s.Topic})
		e.subscriptionChanged(s.Topic, s.ID)
	}
	return res, nil
}

// SubscriptionsMaintain makes ACTIVE subscriptions past their heartbeat timeout DEAD and CANCELLED
// ones past the retention DELETED (an ephemeral one is removed), in one transaction bounded by
// Config.TxTimeout (a stuck one would stop the lifecycle loop that runs it).
func (e *Engine) SubscriptionsMaintain(ctx context.Context, params *storage.SubscriptionsMaintainParams) (*storage.SubscriptionsMaintainResult, error) {
	return withTxTimeout(e, ctx, "subscriptions maintain", func(ctx context.Context) (*storage.SubscriptionsMaintainResult, error) {
		return e.subscriptionsMaintain(ctx, params)
	})
}

func (e *Engine) subscriptionsMaintain(ctx context.Context, params *storage.SubscriptionsMaintainParams) (*storage.SubscriptionsMaintainResult, error) {
	retention, err := params.Check()
	if err != nil {
		return nil, err
	}
	var res *storage.SubscriptionsMaintainResult
	var removed []*storage.Subscription // cancelled ephemeral ones, deleted without a result
	err = e.tx(ctx, func(tx pgx.Tx) error {
		res = &storage.SubscriptionsMaintainResult{}
		removed = nil
		now := e.now()
		dead, err := e.lifecycleUpdate(ctx, tx, `UPDATE spool.subscriptions SET state = 'DEAD', updated_at = $1
			WHERE state = 'ACTIVE' AND last_heartbeat_at < COALESCE($2::timestamptz, now()) - heartbeat_timeout_ms * interval '1 millisecond'
			RETURNING `+subColumns, now, e.beatTime())
		if err != nil {
			return fmt.Errorf("pgstore: dead detection: %w", err)
		}
		res.Dead = dead
		// Cancelled subscriptions have no delivery state left (SubscriptionUpdate dropped it).
		cutoff := now.Add(-retention)
		removed, err = e.lifecycleUpdate(ctx, tx, `DELETE FROM spool.subscriptions WHERE state = 'CANCELLED' AND ephemeral AND updated_at < $1
			RETURNING `+subColumns, cutoff)
		if err != nil {
			return fmt.Errorf("pgstore: delete cancelled ephemeral subscriptions: %w", err)
		}
		deleted, err := e.lifecycleUpdate(ctx, tx, `UPDATE spool.subscriptions SET state = 'DELETED', updated_at = $1
			WHERE state = 'CANCELLED' AND updated_at < $2 RETURNING `+subColumns, now, cutoff)
		if err != nil {
			return fmt.Errorf("pgstore: delete cancelled subscriptions: %w", err)
		}
		res.Deleted = deleted
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, ss := range [][]*storage.Subscription{res.Dead, removed, res.Deleted} {
		for _, s := range ss {
			e.subscriptionChanged(s.Topic, s.ID)
		}
	}
	return res, nil
}

// lifecycleUpdate runs an UPDATE ... RETURNING subColumns and returns the rows by ID.
func (e *Engine) lifecycleUpdate(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]*storage.Subscription, error) {
	rows, err := tx.Query(ctx, e.sql(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*storage.Subscription
	for rows.Next() {
		s, err := scanSub(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, &s.Subscription)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sortSubs(out)
	return out, nil
}

func sortSubs(ss []*storage.Subscription) {
	slices.SortFunc(ss, func(a, b *storage.Subscription) int { return cmp.Compare(a.ID, b.ID) })
}

// SubscriptionConfigure changes a durable subscription's heartbeat timeout and, without progress,
// its start position (resolved again, as SubscriptionCreate does). Lock order: the topic (FOR
// SHARE) and its partitions (resolveStart), then the subscription, then its sub_partitions rows.
// Bounded by Config.TxTimeout (past it: TIMEOUT, retryable; nothing changes).
func (e *Engine) SubscriptionConfigure(ctx context.Context, params *storage.SubscriptionConfigureParams) (*storage.Subscription, error) {
	start, err := params.Check()
	if err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "subscription configure", func(ctx context.Context) (*storage.Subscription, error) {
		var out *storage.Subscription
		err := e.tx(ctx, func(tx pgx.Tx) error {
			s, err := e.loadSub(ctx, tx, params.ID, noLock)
			if err != nil {
				return err
			}
			t, err := e.loadTopic(ctx, tx, s.Topic, forShare)
			if err != nil {
				return err
			}
			var starts []int64
			var bf *storage.Backfill
			if start != nil {
				if starts, bf, err = e.resolveStartBackfill(ctx, tx, t, *start, s.MaxBackfillMessages); err != nil {
					return err
				}
			}
			if s, err = e.loadSub(ctx, tx, params.ID, forNoKeyUpdate); err != nil {
				return err
			}
			if err := checkConfigurable(&s.Subscription); err != nil {
				return err
			}
			if err := e.lockSubState(ctx, tx, s.ID); err != nil {
				return err
			}
			if start != nil {
				var progress bool
				if err := tx.QueryRow(ctx, e.sql(`SELECT EXISTS (SELECT 1 FROM spool.sub_partitions WHERE sub_id = $1
						AND (start_offset IS NULL OR ack_floor <> start_offset OR cursor <> start_offset OR skips IS NOT NULL))
					OR EXISTS (SELECT 1 FROM spool.deliveries WHERE sub_id = $1)
					OR EXISTS (SELECT 1 FROM spool.dlq WHERE sub_id = $1)`), s.ID).Scan(&progress); err != nil {
					return fmt.Errorf("pgstore: subscription %d: progress: %w", s.ID, err)
				}
				if progress {
					return fmt.Errorf("%w: subscription %d of group %q on topic %q", storage.ErrSubscriptionHasProgress, s.ID, s.Group, s.Topic)
				}
				var skips [][][2]int64
				if t.cfg.CompletionTracking == storage.Refcount {
					if starts, skips, err = e.refcountJoin(ctx, tx, t.id, s.ID, starts); err != nil {
						return err
					}
				}
				if _, err := tx.Exec(ctx, e.sql(`UPDATE spool.sub_partitions sp SET ack_floor = u.o, cursor = u.o, start_offset = u.o
					FROM unnest($2::bigint[]) WITH ORDINALITY AS u(o, ord) WHERE sp.sub_id = $1 AND sp.partition = u.ord - 1`), s.ID, starts); err != nil {
					return fmt.Errorf("pgstore: subscription %d: new start: %w", s.ID, err)
				}
				if err := e.markSkipped(ctx, tx, s.ID, t.id, skips); err != nil {
					return err
				}
				var bfJSON []byte
				if bf != nil {
					if bfJSON, err = json.Marshal(bf); err != nil {
						return fmt.Errorf("pgstore: encode backfill: %w", err)
					}
				}
				if _, err := tx.Exec(ctx, e.sql(`UPDATE spool.subscriptions SET backfill = $2 WHERE id = $1`), s.ID, bfJSON); err != nil {
					return fmt.Errorf("pgstore: subscription %d: backfill: %w", s.ID, err)
				}
			}
			startJSON, err := json.Marshal(cmpStart(start, s.Start))
			if err != nil {
				return fmt.Errorf("pgstore: encode start position: %w", err)
			}
			timeout := cmp.Or(params.HeartbeatTimeout, s.HeartbeatTimeout)
			s, err = scanSub(tx.QueryRow(ctx, e.sql(`UPDATE spool.subscriptions SET start = $2, heartbeat_timeout_ms = $3, updated_at = $4
				WHERE id = $1 RETURNING `+subColumns), s.ID, startJSON, timeout.Milliseconds(), e.now()))
			if err != nil {
				return fmt.Errorf("pgstore: configure subscription %d: %w", params.ID, err)
			}
			out = &s.Subscription
			return nil
		})
		return out, err
	})
}

// cmpStart is the new start position if there is one, else the current one.
func cmpStart(next *storage.StartPosition, cur storage.StartPosition) storage.StartPosition {
	if next != nil {
		return *next
	}
	return cur
}

// checkConfigurable refuses SubscriptionConfigure of an ephemeral or CANCELLED subscription.
func checkConfigurable(s *storage.Subscription) error {
	switch {
	case s.Ephemeral:
		return invalid("subscription %d is ephemeral: only a durable subscription can be configured", s.ID)
	case s.State == storage.Cancelled:
		return fmt.Errorf("%w: subscription %d is CANCELLED and cannot be configured", storage.ErrInvalidTransition, s.ID)
	}
	return nil
}

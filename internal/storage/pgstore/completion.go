package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// Completion tracking refcount (docs/storage.md "Completion tracking"): completion records in
// spool.completions (migration 0012), joins that skip completed messages, and the audit read.

// refcountStarts raises want, the per-partition start of subscription self (0: a new one) joining
// refcount topic topicID, past the messages the other subscriptions with state have completed
// (storage.RefcountStart), and returns, per partition, the runs of offsets above it completed out
// of order (storage.RefcountSkips, below hw), which the joiner marks done. It locks the topic's
// delivery state first (lockRefcountJoin), then reads the others' floors, cursors and rows.
func (e *Engine) refcountStarts(ctx context.Context, tx pgx.Tx, topicID, self int64, want, hw []int64) ([]int64, [][][2]int64, error) {
	if err := e.lockRefcountJoin(ctx, tx, topicID); err != nil {
		return nil, nil, err
	}
	byKey := map[[2]int64]*refcountOther{} // (sub, partition)
	var keys [][2]int64
	rows, err := tx.Query(ctx, e.sql(`SELECT s.id, sp.partition, coalesce(sp.start_offset, 0), sp.ack_floor, sp.cursor, s.state IN ('ACTIVE', 'PAUSED'), sp.skips
		FROM spool.subscriptions s JOIN spool.sub_partitions sp ON sp.sub_id = s.id
		WHERE s.topic_id = $1 AND s.id <> $2 AND s.state IN ('ACTIVE', 'PAUSED', 'DEAD') ORDER BY s.id, sp.partition`), topicID, self)
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: refcount join: read ack floors: %w", err)
	}
	for rows.Next() {
		var id int64
		var p int32
		o := &refcountOther{acked: map[int64]bool{}, open: map[int64]bool{}}
		var skips []int64
		if err := rows.Scan(&id, &p, &o.start, &o.floor, &o.cursor, &o.live, &skips); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("pgstore: refcount join: read ack floors: %w", err)
		}
		o.skips = runsFrom(skips, o.cursor)
		k := [2]int64{id, int64(p)}
		byKey[k] = o
		keys = append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("pgstore: refcount join: read ack floors: %w", err)
	}
	rows, err = tx.Query(ctx, e.sql(`SELECT d.sub_id, d.partition, d.offsets, d.state = 'acked' FROM spool.deliveries d
		JOIN spool.subscriptions s ON s.id = d.sub_id
		WHERE s.topic_id = $1 AND s.id <> $2 AND s.state IN ('ACTIVE', 'PAUSED', 'DEAD')`), topicID, self)
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: refcount join: read delivery state: %w", err)
	}
	for rows.Next() {
		var id int64
		var p int32
		var offs []int64
		var acked bool
		if err := rows.Scan(&id, &p, &offs, &acked); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("pgstore: refcount join: read delivery state: %w", err)
		}
		if o := byKey[[2]int64{id, int64(p)}]; o != nil {
			for _, off := range offs {
				if acked {
					o.acked[off] = true
				} else {
					o.open[off] = true
				}
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("pgstore: refcount join: read delivery state: %w", err)
	}
	out := slices.Clone(want)
	skips := make([][][2]int64, len(want))
	for p := range out {
		var starts, floors []int64
		var live []bool
		var views []storage.RefcountOther
		for _, k := range keys {
			o := byKey[k]
			if k[1] != int64(p) {
				continue
			}
			starts, floors, live = append(starts, o.start), append(floors, o.floor), append(live, o.live)
			views = append(views, storage.RefcountOther{Start: o.start, Floor: o.floor, Live: o.live, Above: o.doneRuns()})
		}
		out[p] = storage.RefcountStart(out[p], starts, floors, live)
		if p < len(hw) {
			skips[p] = storage.RefcountSkips(out[p], hw[p], views)
		}
	}
	return out, skips, nil
}

// refcountOther is the delivery state of another subscription in one partition, as a refcount
// join reads it.
type refcountOther struct {
	start, floor, cursor int64
	live                 bool
	acked, open          map[int64]bool // offsets of acked rows, of leased or waiting rows
	skips                [][2]int64     // its skip runs at or above the cursor (done)
}

// doneRuns returns the offsets o has done at or above its ack floor as sorted runs: those below
// the cursor with no leased or waiting row, those of acked rows and its skip runs. Its cost is in
// o's rows and runs, not in the offsets the runs cover.
func (o *refcountOther) doneRuns() [][2]int64 {
	open := make([]int64, 0, len(o.open))
	for off := range o.open {
		if off >= o.floor && off < o.cursor {
			open = append(open, off)
		}
	}
	slices.Sort(open)
	runs := make([][2]int64, 0, len(open)+1+len(o.acked)+len(o.skips))
	lo := o.floor
	for _, off := range open {
		if lo < off {
			runs = append(runs, [2]int64{lo, off})
		}
		lo = off + 1
	}
	if lo < o.cursor {
		runs = append(runs, [2]int64{lo, o.cursor})
	}
	for off := range o.acked {
		if off >= o.floor {
			runs = append(runs, [2]int64{off, off + 1})
		}
	}
	runs = append(runs, o.skips...)
	slices.SortFunc(runs, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	out := runs[:0]
	for _, r := range runs {
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// lockRefcountJoin locks the sub_partitions rows of the topic's subscriptions with state, in
// (subscription, partition) order, the lock order of delivery transactions (combine.go): an ack
// or a claim of any group of the topic waits for the join, and the join sees every ack committed
// before it, so a message completed before the join is never given to the joiner.
func (e *Engine) lockRefcountJoin(ctx context.Context, tx pgx.Tx, topicID int64) error {
	if _, err := tx.Exec(ctx, e.sql(`SELECT 1 FROM spool.sub_partitions sp JOIN spool.subscriptions s ON s.id = sp.sub_id
		WHERE s.topic_id = $1 AND s.state IN ('ACTIVE', 'PAUSED', 'DEAD') ORDER BY sp.sub_id, sp.partition FOR UPDATE OF sp`), topicID); err != nil {
		return fmt.Errorf("pgstore: refcount join: lock delivery state: %w", err)
	}
	return nil
}

// refcountJoin is refcountStarts at the partitions' current high-water marks.
func (e *Engine) refcountJoin(ctx context.Context, tx pgx.Tx, topicID, self int64, want []int64) ([]int64, [][][2]int64, error) {
	hw, err := e.highWaters(ctx, tx, topicID)
	if err != nil {
		return nil, nil, err
	}
	return e.refcountStarts(ctx, tx, topicID, self, want, hw)
}

// markSkipped marks the skipped runs of a new (or restarted) subscription done and records them
// excluded: it is not in their sets, like the messages below its start.
func (e *Engine) markSkipped(ctx context.Context, tx pgx.Tx, id, topicID int64, skips [][][2]int64) error {
	if !anyRuns(skips) {
		return nil
	}
	have, err := e.loadSkips(ctx, tx, id)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	e.queueSkips(b, id, topicID, skips, have, "excluded", e.now())
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgstore: subscription %d: skip completed messages: %w", id, err)
	}
	return nil
}

// highWaters returns the next offset of each partition of topicID.
func (e *Engine) highWaters(ctx context.Context, tx pgx.Tx, topicID int64) ([]int64, error) {
	var hw []int64
	err := tx.QueryRow(ctx, e.sql(`SELECT coalesce(array_agg(next_offset ORDER BY partition), '{}') FROM spool.partitions WHERE topic_id = $1`),
		topicID).Scan(&hw)
	if err != nil {
		return nil, fmt.Errorf("pgstore: refcount join: high-water marks: %w", err)
	}
	return hw, nil
}

// queueSkips queues, for subscription id of topicID, the statements that mark the runs skips done
// (refcountStarts): their offsets leave its delivery rows, those at or above its cursor join its
// skip runs (sub_partitions.skips, merged with have, its runs and cursor per partition as
// loadSkips read them), and each run gets a completion record of state (removed at at for a
// subscription back from DEAD, excluded for a new one). Every statement is in the runs, never in
// the offsets they cover. The caller then recomputes the ack floor.
func (e *Engine) queueSkips(b *pgx.Batch, id, topicID int64, skips [][][2]int64, have map[int32]partSkips, state string, at time.Time) {
	for p, runs := range skips {
		if len(runs) == 0 {
			continue
		}
		var los, his []int64
		for _, r := range runs {
			los, his = append(los, r[0]), append(his, r[1])
		}
		lo, hi := slices.Min(los), slices.Max(his)
		b.Queue(e.sql(`INSERT INTO spool.completions (sub_id, topic_id, partition, lo, hi, state, at)
			SELECT $1, $2, $3, r.lo, r.hi, $6, $7 FROM unnest($4::bigint[], $5::bigint[]) AS r(lo, hi)
			ON CONFLICT DO NOTHING`), id, topicID, p, los, his, state, at)
		// Rows with every offset in the runs go; the others lose the offsets in them.
		const inRuns = `EXISTS (SELECT 1 FROM unnest($3::bigint[], $4::bigint[]) AS r(lo, hi) WHERE o >= r.lo AND o < r.hi)`
		b.Queue(e.sql(`DELETE FROM spool.deliveries d WHERE d.sub_id = $1 AND d.partition = $2 AND d.lo >= $5 AND d.lo < $6
			AND NOT EXISTS (SELECT 1 FROM unnest(d.offsets) AS o WHERE NOT `+inRuns+`)`), id, p, los, his, lo, hi)
		b.Queue(e.sql(`UPDATE spool.deliveries d
			SET offsets = ARRAY(SELECT o FROM unnest(d.offsets) AS o WHERE NOT `+inRuns+` ORDER BY o),
				lo = (SELECT min(o) FROM unnest(d.offsets) AS o WHERE NOT `+inRuns+`)
			WHERE d.sub_id = $1 AND d.partition = $2 AND d.lo < $6 AND d.offsets[cardinality(d.offsets)] >= $5
				AND EXISTS (SELECT 1 FROM unnest(d.offsets) AS o WHERE `+inRuns+`)`), id, p, los, his, lo, hi)
		h := have[int32(p)]
		merged := mergeRuns(runsFrom(h.skips, h.cursor), runs)
		b.Queue(e.sql(`UPDATE spool.sub_partitions SET skips = $3 WHERE sub_id = $1 AND partition = $2`),
			id, p, flatRuns(runsFrom(flatRuns(merged), h.cursor)))
	}
}

// partSkips is a subscription partition's cursor and skip runs (flattened), as loadSkips reads
// them.
type partSkips struct {
	cursor int64
	skips  []int64
}

// loadSkips reads the cursors and skip runs of subscription id's partitions (its rows locked).
func (e *Engine) loadSkips(ctx context.Context, tx pgx.Tx, id int64) (map[int32]partSkips, error) {
	rows, err := tx.Query(ctx, e.sql(`SELECT partition, cursor, skips FROM spool.sub_partitions WHERE sub_id = $1`), id)
	if err != nil {
		return nil, fmt.Errorf("pgstore: subscription %d: read skip runs: %w", id, err)
	}
	defer rows.Close()
	out := map[int32]partSkips{}
	for rows.Next() {
		var p int32
		var ps partSkips
		if err := rows.Scan(&p, &ps.cursor, &ps.skips); err != nil {
			return nil, fmt.Errorf("pgstore: subscription %d: read skip runs: %w", id, err)
		}
		out[p] = ps
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: subscription %d: read skip runs: %w", id, err)
	}
	return out, nil
}

// anyRuns reports whether skips has a run.
func anyRuns(skips [][][2]int64) bool {
	for _, runs := range skips {
		if len(runs) > 0 {
			return true
		}
	}
	return false
}

// rejoin raises the ack floors of subscription id of refcount topic topicID, back from DEAD (it
// left the set at leftAt), past the messages completed while it was away: its delivery state
// below them goes, and one 'removed' record covers each range passed. tx holds the
// subscription's row.
func (e *Engine) rejoin(ctx context.Context, tx pgx.Tx, id, topicID int64, leftAt time.Time) error {
	// Its rows are locked with the others', in the delivery transactions' order.
	if err := e.lockRefcountJoin(ctx, tx, topicID); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, e.sql(`SELECT partition, ack_floor FROM spool.sub_partitions WHERE sub_id = $1 ORDER BY partition`), id)
	if err != nil {
		return fmt.Errorf("pgstore: subscription %d: rejoin: %w", id, err)
	}
	var floors []int64
	for rows.Next() {
		var p int32
		var f int64
		if err := rows.Scan(&p, &f); err != nil {
			rows.Close()
			return fmt.Errorf("pgstore: subscription %d: rejoin: %w", id, err)
		}
		for len(floors) < int(p) {
			floors = append(floors, 0)
		}
		floors = append(floors, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgstore: subscription %d: rejoin: %w", id, err)
	}
	raised, skips, err := e.refcountJoin(ctx, tx, topicID, id, floors)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	for p, f := range raised {
		if f <= floors[p] {
			continue
		}
		b.Queue(e.sql(`INSERT INTO spool.completions (sub_id, topic_id, partition, lo, hi, state, at)
			VALUES ($1, $2, $3, $4, $5, 'removed', $6) ON CONFLICT DO NOTHING`), id, topicID, p, floors[p], f, leftAt)
		b.Queue(e.sql(`DELETE FROM spool.deliveries WHERE sub_id = $1 AND partition = $2 AND offsets[cardinality(offsets)] < $3`), id, p, f)
		b.Queue(e.sql(`UPDATE spool.deliveries
			SET offsets = ARRAY(SELECT o FROM unnest(offsets) AS o WHERE o >= $3 ORDER BY o),
				lo = (SELECT min(o) FROM unnest(offsets) AS o WHERE o >= $3)
			WHERE sub_id = $1 AND partition = $2 AND lo < $3`), id, p, f)
		b.Queue(e.sql(`UPDATE spool.sub_partitions SET cursor = greatest(cursor, $3), ack_floor = greatest(ack_floor, $3)
			WHERE sub_id = $1 AND partition = $2`), id, p, f)
	}
	if anyRuns(skips) {
		have, err := e.loadSkips(ctx, tx, id)
		if err != nil {
			return err
		}
		for p, f := range raised {
			if h, ok := have[int32(p)]; ok && f > h.cursor {
				h.cursor = f // the batch raises it first
				have[int32(p)] = h
			}
		}
		e.queueSkips(b, id, topicID, skips, have, string(storage.CompletionRemoved), leftAt)
	}
	if b.Len() == 0 {
		return nil
	}
	// The floor: the lowest offset still in a row, or the cursor.
	b.Queue(e.sql(`UPDATE spool.sub_partitions sp SET ack_floor = least(sp.cursor, coalesce((SELECT min(d.lo) FROM spool.deliveries d
			WHERE d.sub_id = sp.sub_id AND d.partition = sp.partition AND d.state <> 'acked'), sp.cursor))
		WHERE sp.sub_id = $1`), id)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgstore: subscription %d: rejoin: %w", id, err)
	}
	return nil
}

// rejoinIfRefcount runs rejoin when subscription id's topic tracks completion by refcount.
func (e *Engine) rejoinIfRefcount(ctx context.Context, tx pgx.Tx, id int64, leftAt time.Time) error {
	var topicID int64
	var mode *string
	err := tx.QueryRow(ctx, e.sql(`SELECT t.id, t.config->>'completion_tracking' FROM spool.subscriptions s
		JOIN spool.topics t ON t.id = s.topic_id WHERE s.id = $1`), id).Scan(&topicID, &mode)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgstore: subscription %d: rejoin: %w", id, err)
	}
	if mode == nil || storage.CompletionTracking(*mode) != storage.Refcount {
		return nil
	}
	return e.rejoin(ctx, tx, id, topicID, leftAt)
}

// queueCompletions queues the completion records of st's acks and dead-letterings (refcount
// topics only) at now, in the delivery transaction that made them.
func (e *Engine) queueCompletions(b *pgx.Batch, st *dstate, now time.Time) {
	if st.cfg.CompletionTracking != storage.Refcount {
		return
	}
	var ps []int32
	var os []int64
	var states []string
	for _, r := range st.acked {
		ps, os, states = append(ps, r.p), append(os, r.o), append(states, string(storage.CompletionAcked))
	}
	for _, d := range st.dead {
		ps, os, states = append(ps, d.p), append(os, d.o), append(states, string(storage.CompletionDeadLettered))
	}
	for _, rp := range st.replays {
		if rp.changed && rp.dead != nil {
			ps, os, states = append(ps, rp.partition), append(os, rp.offset), append(states, string(storage.CompletionDeadLettered))
		}
	}
	if len(ps) == 0 {
		return
	}
	b.Queue(e.sql(`INSERT INTO spool.completions (sub_id, topic_id, partition, lo, hi, state, at)
		SELECT $1, $2, r.p, r.o, r.o + 1, r.s, $6 FROM unnest($3::int[], $4::bigint[], $5::text[]) AS r(p, o, s)
		ON CONFLICT DO NOTHING`), st.sub.ID, st.sub.topicID, ps, os, states, now)
}

// completionBoundsHook, when set (tests), runs in MessageCompletion after its bounds check.
var completionBoundsHook func()

// MessageCompletion returns the completion record of a retained message of a refcount topic
// (storage.CompletionAuditor), read in one repeatable-read snapshot: per subscription of the
// topic whose set holds the message, its completion record (acked, dead-lettered; removed with
// the time it became DEAD when it skipped the message coming back), else pending (live) or
// removed at the time it left (DEAD, CANCELLED).
func (e *Engine) MessageCompletion(ctx context.Context, params *storage.MessageCompletionParams) (*storage.MessageCompletion, error) {
	return withTxTimeout(e, ctx, "message completion", func(ctx context.Context) (*storage.MessageCompletion, error) {
		return e.messageCompletion(ctx, params)
	})
}

func (e *Engine) messageCompletion(ctx context.Context, params *storage.MessageCompletionParams) (*storage.MessageCompletion, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	if params == nil {
		return nil, invalid("nil params")
	}
	var out *storage.MessageCompletion
	// One snapshot: a retention that commits between the bounds check and the reads must not make
	// the message vanish half way (an internal "no rows" instead of a record or out of range).
	snapshot := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	err := e.txWith(ctx, snapshot, func(tx pgx.Tx) error {
		t, err := e.loadTopic(ctx, tx, params.Topic, noLock)
		if err != nil {
			return err
		}
		if t.cfg.CompletionTracking != storage.Refcount {
			return invalid("topic %q tracks completion by watermark: its messages have no completion record (completion_tracking refcount keeps one)", params.Topic)
		}
		p, o := params.Partition, params.Offset
		if p < 0 || int(p) >= t.cfg.Partitions {
			return invalid("topic %q has no partition %d", params.Topic, p)
		}
		var low, next int64
		if err := tx.QueryRow(ctx, e.sql(`SELECT low_offset, next_offset FROM spool.partitions WHERE topic_id = $1 AND partition = $2`),
			t.id, p).Scan(&low, &next); err != nil {
			return fmt.Errorf("pgstore: completion: partition bounds: %w", err)
		}
		if o < low || o >= next {
			return fmt.Errorf("%w: topic %q partition %d offset %d is not retained (retained: %d to %d)",
				storage.ErrOffsetOutOfRange, params.Topic, p, o, low, next-1)
		}
		if completionBoundsHook != nil {
			completionBoundsHook()
		}
		out = &storage.MessageCompletion{Topic: t.name, Partition: p, Offset: o, Groups: []storage.GroupCompletion{}}
		if err := tx.QueryRow(ctx, e.sql(`SELECT published_at FROM spool.messages WHERE topic_id = $1 AND partition = $2 AND "offset" = $3`),
			t.id, p, o).Scan(&out.PublishedAt); err != nil {
			return fmt.Errorf("pgstore: completion: read message: %w", err)
		}
		out.PublishedAt = out.PublishedAt.UTC()
		rows, err := tx.Query(ctx, e.sql(`SELECT s.id, s.group_name, s.state, s.created_at, s.updated_at,
				sp.start_offset, sp.ack_floor,
				EXISTS (SELECT 1 FROM spool.deliveries d WHERE d.sub_id = s.id AND d.partition = $2 AND d.lo <= $3
					AND d.state = 'acked' AND $3 = ANY (d.offsets)),
				c.state, c.at
			FROM spool.subscriptions s
			LEFT JOIN spool.sub_partitions sp ON sp.sub_id = s.id AND sp.partition = $2
			LEFT JOIN LATERAL (SELECT c.state, c.at FROM spool.completions c
				WHERE c.sub_id = s.id AND c.partition = $2 AND c.lo <= $3 AND c.hi > $3
				ORDER BY c.state IN ('removed', 'excluded'), c.lo DESC LIMIT 1) c ON true
			WHERE s.topic_id = $1 AND s.state <> 'DELETED' ORDER BY s.id`), t.id, p, o)
		if err != nil {
			return fmt.Errorf("pgstore: completion: read subscriptions: %w", err)
		}
		defer rows.Close()
		pending, done := false, false
		for rows.Next() {
			var g storage.GroupCompletion
			var state string
			var created, updated time.Time
			var start, floor *int64
			var acked bool
			var cState *string
			var cAt *time.Time
			if err := rows.Scan(&g.SubscriptionID, &g.Group, &state, &created, &updated, &start, &floor, &acked, &cState, &cAt); err != nil {
				return fmt.Errorf("pgstore: completion: read subscriptions: %w", err)
			}
			if !auditRow(&g, storage.SubscriptionState(state), created.UTC(), updated.UTC(), start, floor, acked, cState, cAt, o, out.PublishedAt) {
				continue
			}
			pending = pending || g.State == storage.CompletionPending
			done = done || g.State == storage.CompletionAcked || g.State == storage.CompletionDeadLettered
			out.Groups = append(out.Groups, g)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("pgstore: completion: read subscriptions: %w", err)
		}
		out.Complete = done && !pending
		return nil
	})
	if err != nil {
		return nil, e.mapErr(err)
	}
	return out, nil
}

// auditRow fills g, one subscription's entry in the completion record of offset o published at
// published, and reports whether the message is (or was) in its set. start and floor are nil
// for a subscription without delivery state (CANCELLED): its set is then judged by time.
func auditRow(g *storage.GroupCompletion, state storage.SubscriptionState, created, updated time.Time, start, floor *int64,
	acked bool, cState *string, cAt *time.Time, o int64, published time.Time) bool {
	if start != nil && o < *start {
		return false // joined after it, or skipped it as completed when it joined
	}
	if cState != nil {
		if *cState == "excluded" {
			return false // completed out of order before it joined
		}
		g.State, g.At = storage.CompletionState(*cState), cAt.UTC()
		return g.State != storage.CompletionRemoved || !published.After(g.At) // removed: published while it was DEAD?
	}
	if floor != nil && (o < *floor || acked) {
		g.State = storage.CompletionAcked // done without a record: completed without a delivery (expired)
		return true
	}
	if state.HoldsRetention() {
		g.State = storage.CompletionPending
		return true
	}
	if published.After(updated) || (start == nil && published.Before(created)) {
		return false // published after it left (or, without state, before it was created)
	}
	g.State, g.At = storage.CompletionRemoved, updated
	return true
}

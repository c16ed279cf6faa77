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

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
)

// Ordered groups (storage.ModeOrdered): the settings in spool.subscriptions.ordering, the
// assignment in spool.sub_assignments (migrations/0008_ordered.sql). Delivery operations load
// the assignment with the delivery state, under the subscription's sub_partitions locks
// (queueLoad), and SubscriptionAssign takes the same locks: fencing and the release of the
// partitions that change owner are consistent across broker instances.

// orderingJSON is the form of spool.subscriptions.ordering.
type orderingJSON struct {
	MaxInFlightPerPartition int    `json:"max_in_flight_per_partition"`
	Strategy                string `json:"strategy"`
}

// scanOrdering fills the mode settings of s from its ordering column (NULL: shared).
func scanOrdering(s *storage.Subscription, ordering []byte) error {
	if ordering == nil {
		return nil
	}
	var o orderingJSON
	if err := json.Unmarshal(ordering, &o); err != nil {
		return fmt.Errorf("%w: subscription %d: ordering: %v", storage.ErrCorrupt, s.ID, err)
	}
	s.Mode, s.MaxInFlightPerPartition, s.Strategy = storage.ModeOrdered, o.MaxInFlightPerPartition, o.Strategy
	return nil
}

// setOrdering stores the ordered settings of a subscription just inserted (subscriptionCreate).
func (e *Engine) setOrdering(ctx context.Context, tx pgx.Tx, s *subRow, o storage.Ordering) error {
	if o.Mode != storage.ModeOrdered {
		return nil
	}
	js, err := json.Marshal(orderingJSON{MaxInFlightPerPartition: o.MaxInFlightPerPartition, Strategy: o.Strategy})
	if err != nil {
		return fmt.Errorf("pgstore: encode ordering: %w", err)
	}
	if _, err := tx.Exec(ctx, e.sql("UPDATE spool.subscriptions SET ordering = $2 WHERE id = $1"), s.ID, js); err != nil {
		return fmt.Errorf("pgstore: subscription %d: store ordering: %w", s.ID, err)
	}
	s.Mode, s.MaxInFlightPerPartition, s.Strategy = o.Mode, o.MaxInFlightPerPartition, o.Strategy
	return nil
}

// assignmentQuery is the last statement of queueLoad: the assignments of subscriptions $1 (no
// row: none yet, or a shared subscription; primary key lookups). It runs after the
// sub_partitions locks are taken, so it reads the assignments in force (an assignment holds the
// same locks); the ordering settings never change and come with the first statement.
const assignmentQuery = `SELECT sub_id, assignment FROM spool.sub_assignments WHERE sub_id = ANY ($1::bigint[])`

// readAssignment reads a row of assignmentQuery into the state of its subscription (of returns
// it, nil for one not loaded).
func readAssignment(rows pgx.Rows, of func(id int64) *dstate) error {
	var id int64
	var asg []byte
	if err := rows.Scan(&id, &asg); err != nil {
		return err
	}
	st := of(id)
	if st == nil || asg == nil {
		return nil
	}
	st.asg = &storage.Assignment{}
	if err := json.Unmarshal(asg, st.asg); err != nil {
		return fmt.Errorf("%w: subscription %d: assignment: %v", storage.ErrCorrupt, id, err)
	}
	return nil
}

// ordered reports whether st is the state of an ORDERED subscription.
func (st *dstate) ordered() bool { return st.sub.Mode == storage.ModeOrdered }

// fence checks refs of member with generation gen against the assignment of an ORDERED
// subscription (nil for a shared one).
func (st *dstate) fence(member string, gen int64, refs []storage.DeliveryRef) error {
	if !st.ordered() {
		return nil
	}
	for _, r := range refs {
		if err := st.asg.Fence(member, gen, r.Partition); err != nil {
			return fmt.Errorf("subscription %d: %w", st.sub.ID, err)
		}
	}
	return nil
}

// fenceOp checks a nack or extend (fenceAcks checks acks; claims are checked by claimOn).
func (st *dstate) fenceOp(op *dop, now time.Time) error {
	switch {
	case op.nack != nil:
		if err := st.fence(op.nack.Member, op.nack.Generation, op.nack.Refs); err != nil {
			return err
		}
		return st.batchCheck(op.nack.Batch, op.nack.Member, op.nack.Refs, now)
	case op.extend != nil:
		if op.extend.NewMember != "" && st.ordered() {
			return storage.Invalid("subscription %d is ORDERED: leases cannot be handed to another member", st.sub.ID)
		}
		return st.fence(op.extend.Member, op.extend.Generation, op.extend.Refs)
	}
	return nil
}

// fenceAcks returns the acks of run that pass the fence; the others fail with their error.
func (st *dstate) fenceAcks(run []*dop, now time.Time) []*dop {
	if !st.ordered() {
		return run
	}
	var ok []*dop
	for _, op := range run {
		if err := st.fence(op.ackMember, op.ackGeneration, op.refs); err != nil {
			op.err = err
			continue
		}
		if err := st.batchCheck(op.ackBatch, op.ackMember, op.refs, now); err != nil {
			op.err = err
			continue
		}
		ok = append(ok, op)
	}
	return ok
}

// orderedParams returns the parameters of a claim of an ORDERED subscription (the member's
// partitions in the current generation) and its max in flight per partition; p and 0 for a
// shared one.
func (st *dstate) orderedParams(p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimParams, int, error) {
	if !st.ordered() {
		if p.BatchSize > 0 {
			return nil, 0, invalid("subscription %d: batch_size is for ordered subscriptions only", st.sub.ID)
		}
		return p, 0, nil
	}
	ps, err := st.asg.ClaimPartitions(p.Member, p.Generation, p.Partitions)
	if err != nil {
		return nil, 0, fmt.Errorf("subscription %d: %w", st.sub.ID, err)
	}
	cp := *p
	cp.Partitions = ps
	return &cp, st.sub.MaxInFlightPerPartition, nil
}

// orderedRedeliveries presents the waiting messages of each partition of an ordered claim to its
// lane in offset order (policy/ordered.go) and leases those it takes; it returns them and the
// lanes, by partition, for the new messages.
func (st *dstate) orderedRedeliveries(pl *policy.Claim, member string, deadline time.Time) ([]redelivery, map[int32]*policy.Lane) {
	lanes := map[int32]*policy.Lane{}
	var again []redelivery
	for k := 0; ; k++ {
		q, ok := pl.Partition(k)
		if !ok {
			break
		}
		type waiting struct {
			o   int64
			due int64
			r   *drow
			rp  *dreplay
		}
		var ws []waiting
		inFlight := 0
		for _, r := range st.rows {
			if r.partition != q {
				continue
			}
			switch r.state {
			case stLeased:
				inFlight += len(r.live())
			case stWaiting:
				for _, o := range r.live() {
					ws = append(ws, waiting{o: o, due: r.due.UnixNano(), r: r})
				}
			}
		}
		for _, rp := range st.replays {
			if rp.partition != q || rp.dead != nil || rp.acked {
				continue
			}
			switch rp.state {
			case stLeased:
				inFlight++
			case stWaiting:
				ws = append(ws, waiting{o: rp.offset, due: rp.due.UnixNano(), rp: rp})
			}
		}
		slices.SortFunc(ws, func(a, b waiting) int {
			if c := cmpInt(a.o, b.o); c != 0 {
				return c
			}
			if a.rp != nil {
				return -1
			}
			return 1
		})
		l := pl.Lane(q, inFlight)
		for _, w := range ws {
			if !l.Redeliver(w.due) {
				break
			}
			if rp := w.rp; rp != nil {
				rp.state, rp.attempt, rp.member, rp.due, rp.changed = stLeased, rp.attempt+1, member, deadline, true
				again = append(again, redelivery{p: rp.partition, o: rp.offset, attempt: rp.attempt, rp: rp})
				continue
			}
			nr := st.moveOffsets(w.r, []int64{w.o}, stLeased, w.r.attempt+1, member, deadline)
			again = append(again, redelivery{p: nr.partition, o: w.o, attempt: nr.attempt, row: nr})
		}
		lanes[q] = &l
	}
	return again, lanes
}

// releasePartitions gives back the leases of the partitions moved (their owner changed): due at
// now, attempts kept; those on their max_deliveries-th delivery go to the DLQ. It returns how
// many went to the DLQ.
func (st *dstate) releasePartitions(moved []int32, now time.Time) (dead int) {
	for _, r := range slices.Clone(st.rows) {
		if r.state != stLeased || !slices.Contains(moved, r.partition) {
			continue
		}
		live := slices.Clone(r.live())
		if r.attempt >= st.cfg.MaxDeliveries {
			for _, o := range live {
				st.take(r.partition, o)
				st.deadLetterOutcome(r.partition, o, dlqOutcome{reason: storage.DLQMaxDeliveries, lastErr: "partition reassigned", attempt: r.attempt, failures: r.failures})
				dead++
			}
			continue
		}
		st.moveOffsets(r, live, stWaiting, r.attempt, r.member, now)
	}
	for _, rp := range st.replays {
		if rp.state != stLeased || rp.dead != nil || rp.acked || !slices.Contains(moved, rp.partition) {
			continue
		}
		rp.changed = true
		if rp.attempt >= st.cfg.MaxDeliveries {
			rp.dead = &dlqOutcome{reason: storage.DLQMaxDeliveries, lastErr: "partition reassigned", attempt: rp.attempt, failures: rp.failures}
			delete(st.replay, dref{rp.partition, rp.offset})
			dead++
			continue
		}
		rp.state, rp.due = stWaiting, now
	}
	return dead
}

// SubscriptionAssign replaces the assignment of an ORDERED subscription when its generation is
// still params.Generation (a compare-and-set in the database), under the subscription's
// sub_partitions locks, and gives back the leases of the partitions whose owner changed
// (counting those it dead-lettered).
func (e *Engine) SubscriptionAssign(ctx context.Context, params *storage.SubscriptionAssignParams) (*storage.SubscriptionAssignResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "subscription assign", func(ctx context.Context) (*storage.SubscriptionAssignResult, error) {
		var out *storage.SubscriptionAssignResult
		err := e.tx(ctx, func(tx pgx.Tx) error {
			st, err := e.loadState(ctx, tx, params.SubscriptionID, loadDue, "", loadWant{ps: []int32{}, os: []int64{}}, false)
			if err != nil {
				return err
			}
			if !st.ordered() {
				return invalid("subscription %d is not ordered", st.sub.ID)
			}
			next, moved, err := storage.NextAssignment(st.asg, params, st.cfg.Partitions, st.sub.Strategy)
			if err != nil {
				return err
			}
			js, err := json.Marshal(next)
			if err != nil {
				return fmt.Errorf("pgstore: encode assignment: %w", err)
			}
			tag, err := tx.Exec(ctx, e.sql(`INSERT INTO spool.sub_assignments (sub_id, generation, assignment) VALUES ($1, $2, $3)
				ON CONFLICT (sub_id) DO UPDATE SET generation = EXCLUDED.generation, assignment = EXCLUDED.assignment
				WHERE spool.sub_assignments.generation = $4`), st.sub.ID, next.Generation, js, params.Generation)
			if err != nil {
				return fmt.Errorf("pgstore: subscription %d: store assignment: %w", st.sub.ID, err)
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("%w: subscription %d was assigned by another instance meanwhile", storage.ErrStaleGeneration, st.sub.ID)
			}
			now := e.now()
			dead := st.releasePartitions(moved, now)
			if err := e.save(ctx, tx, st, now); err != nil {
				return err
			}
			out = &storage.SubscriptionAssignResult{Assignment: next, DeadLettered: dead}
			return nil
		})
		return out, err
	})
}

// SubscriptionAssignment returns the current assignment of an ORDERED subscription (bounded by
// Config.TxTimeout).
func (e *Engine) SubscriptionAssignment(ctx context.Context, id int64) (*storage.Assignment, error) {
	return withTxTimeout(e, ctx, "subscription assignment", func(ctx context.Context) (*storage.Assignment, error) {
		return e.subscriptionAssignment(ctx, id)
	})
}

func (e *Engine) subscriptionAssignment(ctx context.Context, id int64) (*storage.Assignment, error) {
	s, err := e.SubscriptionGet(ctx, id)
	if err != nil {
		return nil, err
	}
	if s.Mode != storage.ModeOrdered {
		return nil, invalid("subscription %d is not ordered", id)
	}
	var js []byte
	err = e.pool.QueryRow(ctx, e.sql("SELECT assignment FROM spool.sub_assignments WHERE sub_id = $1"), id).Scan(&js)
	if errors.Is(err, pgx.ErrNoRows) {
		t, err := e.TopicGet(ctx, s.Topic)
		if err != nil {
			return nil, err
		}
		return &storage.Assignment{SubscriptionID: id, Strategy: s.Strategy, Members: map[string][]int32{},
			Since: make([]int64, t.Config.Partitions)}, nil
	}
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: subscription %d: assignment: %w", id, err))
	}
	a := &storage.Assignment{}
	if err := json.Unmarshal(js, a); err != nil {
		return nil, fmt.Errorf("%w: subscription %d: assignment: %v", storage.ErrCorrupt, id, err)
	}
	return a, nil
}

// SubscriptionMembersRenew renews the liveness rows of members of subscriptions in
// spool.sub_members (migrations/0011_member_liveness.sql, 0016_member_filters.sql) with their
// instance and filter, keyed by (subscription, instance, member) (member IDs are unique per
// instance only), deletes the rows params.Forget names (those of params.Instance) and the
// expired rows of the subscriptions named, and returns their live members (each ID once) and
// records, in one transaction.
// The subscriptions are locked FOR KEY SHARE (a concurrent deletion waits; a heartbeat does not);
// rows are upserted in key order and expired ones deleted with SKIP LOCKED, so concurrent
// renewals by several instances never deadlock.
func (e *Engine) SubscriptionMembersRenew(ctx context.Context, params *storage.SubscriptionMembersRenewParams) (*storage.SubscriptionMembersRenewResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	byKey := func(a, b storage.MemberRef) int {
		return cmp.Or(cmp.Compare(a.SubscriptionID, b.SubscriptionID), cmp.Compare(a.Member, b.Member))
	}
	refs := slices.Clone(params.Members)
	slices.SortStableFunc(refs, byKey)
	refs = slices.CompactFunc(refs, func(a, b storage.MemberRef) bool { return byKey(a, b) == 0 })
	subIDs, names, filters := make([]int64, len(refs)), make([]string, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		subIDs[i], names[i], filters[i] = r.SubscriptionID, r.Member, r.Filter
	}
	forgetSubs, forgetNames := make([]int64, len(params.Forget)), make([]string, len(params.Forget))
	for i, r := range params.Forget {
		forgetSubs[i], forgetNames[i] = r.SubscriptionID, r.Member
	}
	named := params.SubscriptionIDs()
	return withTxTimeout(e, ctx, "members renew", func(ctx context.Context) (*storage.SubscriptionMembersRenewResult, error) {
		var res *storage.SubscriptionMembersRenewResult
		err := e.tx(ctx, func(tx pgx.Tx) error {
			res = &storage.SubscriptionMembersRenewResult{Live: map[int64][]string{}, Records: map[int64][]storage.MemberRecord{}}
			rows, err := tx.Query(ctx, e.sql(`SELECT id FROM spool.subscriptions WHERE id = ANY($1)
				AND state NOT IN ('CANCELLED', 'DELETED') ORDER BY id FOR KEY SHARE`), named)
			if err != nil {
				return fmt.Errorf("pgstore: members renew: lock subscriptions: %w", err)
			}
			var subs []int64
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return fmt.Errorf("pgstore: members renew: lock subscriptions: %w", err)
				}
				subs = append(subs, id)
				res.Live[id] = []string{}
				res.Records[id] = []storage.MemberRecord{}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("pgstore: members renew: lock subscriptions: %w", err)
			}
			if len(subs) == 0 {
				return nil
			}
			now := e.beatTime()
			if len(forgetSubs) > 0 {
				if _, err := tx.Exec(ctx, e.sql(`DELETE FROM spool.sub_members m USING unnest($1::bigint[], $2::text[]) AS u(s, n)
					WHERE m.sub_id = u.s AND m.member = u.n AND m.instance = $3`), forgetSubs, forgetNames, params.Instance); err != nil {
					return fmt.Errorf("pgstore: members renew: forget members: %w", err)
				}
			}
			if len(refs) > 0 {
				if _, err := tx.Exec(ctx, e.sql(`INSERT INTO spool.sub_members (sub_id, member, expires_at, instance, filter)
					SELECT u.s, u.m, COALESCE($3::timestamptz, now()) + $4 * interval '1 microsecond', $6, u.f
					FROM unnest($1::bigint[], $2::text[], $7::text[]) AS u(s, m, f) WHERE u.s = ANY($5) ORDER BY u.s, u.m
					ON CONFLICT (sub_id, instance, member) DO UPDATE SET expires_at = EXCLUDED.expires_at, filter = EXCLUDED.filter`),
					subIDs, names, now, params.TTL.Microseconds(), subs, params.Instance, filters); err != nil {
					return fmt.Errorf("pgstore: members renew: %w", err)
				}
			}
			if _, err := tx.Exec(ctx, e.sql(`DELETE FROM spool.sub_members WHERE (sub_id, instance, member) IN (
					SELECT sub_id, instance, member FROM spool.sub_members WHERE sub_id = ANY($1) AND expires_at <= COALESCE($2::timestamptz, now())
					FOR UPDATE SKIP LOCKED)`), subs, now); err != nil {
				return fmt.Errorf("pgstore: members renew: forget expired members: %w", err)
			}
			rows, err = tx.Query(ctx, e.sql(`SELECT sub_id, member, instance, filter FROM spool.sub_members
				WHERE sub_id = ANY($1) AND expires_at > COALESCE($2::timestamptz, now()) ORDER BY sub_id, member, instance`), subs, now)
			if err != nil {
				return fmt.Errorf("pgstore: members renew: live members: %w", err)
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				var r storage.MemberRecord
				if err := rows.Scan(&id, &r.Member, &r.Instance, &r.Filter); err != nil {
					return fmt.Errorf("pgstore: members renew: live members: %w", err)
				}
				if l := res.Live[id]; len(l) == 0 || l[len(l)-1] != r.Member { // one per member ID
					res.Live[id] = append(l, r.Member)
				}
				res.Records[id] = append(res.Records[id], r)
			}
			return rows.Err()
		})
		return res, err
	})
}

// batchCheck checks the refs of a batch ack or nack (batch set): they must name every message
// member holds leased at now in their partitions (storage.CheckBatchRefs). A batch claim is for
// ordered subscriptions only, so a shared one has no batch to split.
func (st *dstate) batchCheck(batch bool, member string, refs []storage.DeliveryRef, now time.Time) error {
	if !batch || !st.ordered() {
		return nil
	}
	held := func(p int32) []int64 {
		var out []int64
		for _, r := range st.rows {
			if r.partition == p && r.state == stLeased && r.member == member && r.due.After(now) {
				out = append(out, r.live()...)
			}
		}
		for _, rp := range st.replays {
			if rp.partition == p && rp.state == stLeased && rp.member == member && rp.due.After(now) && rp.dead == nil && !rp.acked {
				out = append(out, rp.offset)
			}
		}
		return out
	}
	if err := storage.CheckBatchRefs(refs, held); err != nil {
		return fmt.Errorf("subscription %d: %w", st.sub.ID, err)
	}
	return nil
}

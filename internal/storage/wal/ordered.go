package wal

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Ordered groups (storage.ModeOrdered): the assignment and its generation are kept in memory
// (sub.asg, guarded by Engine.mu), recorded in the state log (recSubAssign, the whole assignment:
// rare and small) and in snapshots (snapshotMeta.Assignments). The delivery rules are
// policy/ordered.go's, driven by claim.

// recSubAssign is the state record of SubscriptionAssign: JSON storage.Assignment. Its number
// follows the others of staterec.go with room left for records added meanwhile (the lead may
// renumber it before any release: no store holds it yet).
const recSubAssign byte = 25

// SubscriptionAssign replaces the assignment of an ORDERED subscription when its generation is
// still params.Generation, durably, and drops the leases of the partitions whose owner changed
// (counting those it dead-lettered).
func (e *Engine) SubscriptionAssign(ctx context.Context, params *storage.SubscriptionAssignParams) (*storage.SubscriptionAssignResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	s, err := e.lockSub(params.SubscriptionID, e.subLocked)
	if err != nil {
		return nil, err
	}
	if s.meta.Mode != storage.ModeOrdered {
		e.mu.Unlock()
		return nil, invalid("subscription %d is not ordered", s.meta.ID)
	}
	if s.st == nil {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: subscription %d is %s", storage.ErrSubscriptionNotActive, s.meta.ID, s.meta.State)
	}
	next, moved, err := storage.NextAssignment(s.asg, params, len(s.topic.parts), s.meta.Strategy)
	if err != nil {
		e.mu.Unlock()
		return nil, err
	}
	s.asg = next
	ch := e.queueStateWait(encodeJSON(recSubAssign, next))
	res := &storage.SubscriptionAssignResult{}
	if len(moved) > 0 {
		s.mu.Lock()
		now := e.now()
		var recs recordBatch
		for _, p := range moved {
			_, dead := s.st.ReleasePartition(p, now.UnixNano(), s.topic.meta.Config.MaxDeliveries)
			for _, en := range dead {
				if r := e.deadLetterLocked(s, en, storage.DLQMaxDeliveries, "partition reassigned", now); r != nil {
					recs = append(recs, r)
					res.DeadLettered++
				}
			}
		}
		e.queueStates(s, recs, false, nil)
		s.mu.Unlock()
	}
	res.Assignment = next.Clone()
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	return res, nil
}

// SubscriptionAssignment returns the current assignment of an ORDERED subscription.
func (e *Engine) SubscriptionAssignment(ctx context.Context, id int64) (*storage.Assignment, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	s, err := e.subLocked(id)
	if err != nil {
		return nil, err
	}
	if s.meta.Mode != storage.ModeOrdered {
		return nil, invalid("subscription %d is not ordered", id)
	}
	if s.asg == nil {
		return &storage.Assignment{SubscriptionID: id, Strategy: s.meta.Strategy, Members: map[string][]int32{},
			Since: make([]int64, len(s.topic.parts))}, nil
	}
	return s.asg.Clone(), nil
}

// applyAssign replays a recSubAssign record.
func (e *Engine) applyAssign(a *storage.Assignment) {
	if s := e.subs[a.SubscriptionID]; s != nil {
		s.asg = a
	}
}

// fenceLocked checks, for an ORDERED subscription, that member owns the partition of every ref
// since generation gen or earlier (storage.Assignment.Fence). e.mu must be held.
func fenceLocked(s *sub, member string, gen int64, refs []storage.DeliveryRef) error {
	if s.meta.Mode != storage.ModeOrdered {
		return nil
	}
	for _, r := range refs {
		if err := s.asg.Fence(member, gen, r.Partition); err != nil {
			return fmt.Errorf("subscription %d: %w", s.meta.ID, err)
		}
	}
	return nil
}

// orderedClaim returns the parameters of a claim of an ORDERED subscription (the member's
// partitions in the current generation) and its max in flight per partition; params unchanged
// and 0 for a shared one. e.mu must be held.
func orderedClaim(s *sub, params *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimParams, int, error) {
	if s.meta.Mode != storage.ModeOrdered {
		if params.BatchSize > 0 {
			return nil, 0, invalid("subscription %d: batch_size is for ordered subscriptions only", s.meta.ID)
		}
		return params, 0, nil
	}
	ps, err := s.asg.ClaimPartitions(params.Member, params.Generation, params.Partitions)
	if err != nil {
		return nil, 0, fmt.Errorf("subscription %d: %w", s.meta.ID, err)
	}
	cp := *params
	cp.Partitions = ps
	return &cp, s.meta.MaxInFlightPerPartition, nil
}

// SubscriptionMembersRenew renews the liveness records of members of subscriptions (sub.live),
// forgets params.Forget and the expired ones of the subscriptions named and returns their live
// members. The records live in memory only: the embedded engine has one broker instance, whose
// members all leave with a restart, so after Open every member counts as gone.
func (e *Engine) SubscriptionMembersRenew(ctx context.Context, params *storage.SubscriptionMembersRenewParams) (*storage.SubscriptionMembersRenewResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.checkLocked(); err != nil {
		return nil, err
	}
	now := e.now()
	inForce := func(id int64) *sub {
		s, err := e.subLocked(id)
		if err != nil || s.st == nil || s.meta.State == storage.Cancelled || s.meta.State == storage.Deleted {
			return nil
		}
		return s
	}
	for _, m := range params.Forget {
		if s := inForce(m.SubscriptionID); s != nil {
			delete(s.live, liveKey{params.Instance, m.Member})
		}
	}
	for _, m := range params.Members {
		if s := inForce(m.SubscriptionID); s != nil {
			if s.live == nil {
				s.live = map[liveKey]liveRec{}
			}
			s.live[liveKey{params.Instance, m.Member}] = liveRec{expires: now.Add(params.TTL), filter: m.Filter}
		}
	}
	res := &storage.SubscriptionMembersRenewResult{Live: map[int64][]string{}, Records: map[int64][]storage.MemberRecord{}}
	for _, id := range params.SubscriptionIDs() {
		s := inForce(id)
		if s == nil {
			continue
		}
		live, recs := []string{}, []storage.MemberRecord{}
		for k, r := range s.live {
			if r.expires.After(now) {
				live = append(live, k.member)
				recs = append(recs, storage.MemberRecord{Member: k.member, Instance: k.instance, Filter: r.filter})
			} else {
				delete(s.live, k)
			}
		}
		slices.Sort(live)
		slices.SortFunc(recs, func(a, b storage.MemberRecord) int {
			return cmp.Or(strings.Compare(a.Member, b.Member), strings.Compare(a.Instance, b.Instance))
		})
		res.Live[id], res.Records[id] = slices.Compact(live), recs
	}
	return res, nil
}

// liveKey keys a liveness record: member IDs are unique per broker instance only, so two
// instances' members of one ID have a record each (a member counts live while either is).
type liveKey struct{ instance, member string }

// liveRec is a member's liveness record (SubscriptionMembersRenew).
type liveRec struct {
	expires time.Time
	filter  string
}

// batchCheckLocked checks the refs of a batch ack or nack (batch set): they must name every
// message member holds in their partitions (storage.CheckBatchRefs). The subscription's mutex
// must be held.
func (e *Engine) batchCheckLocked(s *sub, batch bool, member string, refs []storage.DeliveryRef) error {
	if !batch || s.meta.Mode != storage.ModeOrdered {
		return nil // a shared subscription has no batches
	}
	now := e.now().UnixNano()
	if err := storage.CheckBatchRefs(refs, func(p int32) []int64 { return s.st.HeldBy(p, member, now) }); err != nil {
		return fmt.Errorf("subscription %d: %w", s.meta.ID, err)
	}
	return nil
}

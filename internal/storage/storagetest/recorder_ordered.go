package storagetest

import (
	"context"
	"slices"

	"github.com/spoolmq/spool/internal/storage"
)

// SubscriptionAssign forwards the call; the leases of the partitions whose owner it changes are
// marked as possibly ended first (the engine drops them).
func (r *recorder) SubscriptionAssign(ctx context.Context, p *storage.SubscriptionAssignParams) (*storage.SubscriptionAssignResult, error) {
	e := r.engine()
	if p != nil {
		if cur, err := e.SubscriptionAssignment(ctx, p.SubscriptionID); err == nil {
			var moved []int32
			for m, ps := range cur.Members {
				for _, q := range ps {
					if !slices.Contains(p.Members[m], q) {
						moved = append(moved, q)
					}
				}
			}
			r.tr.releasePartitions(p.SubscriptionID, moved)
		}
	}
	return e.SubscriptionAssign(ctx, p)
}

func (r *recorder) SubscriptionAssignment(ctx context.Context, id int64) (*storage.Assignment, error) {
	return r.engine().SubscriptionAssignment(ctx, id)
}

// releasePartitions marks every lease of sub in the given partitions as possibly ended.
func (tr *tracker) releasePartitions(sub int64, parts []int32) {
	if len(parts) == 0 {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	for k, mt := range tr.msgs {
		if k.sub != sub || !slices.Contains(parts, k.partition) {
			continue
		}
		for _, r := range mt.recs {
			if r.released == 0 {
				r.released = tr.seq
			}
		}
	}
}

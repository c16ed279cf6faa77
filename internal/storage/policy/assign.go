package policy

import (
	"cmp"
	"slices"

	"github.com/spoolmq/spool/internal/storage"
)

// Assign computes the partition assignment of an ordered group (storage.ModeOrdered) for the
// broker's rebalances: every partition 0..partitions-1 goes to exactly one of members, and the
// numbers of partitions of two members differ by at most one. members must not repeat; with no
// member nothing is assigned. The result lists every member (possibly with no partition), each
// with its partitions sorted, ready for storage.SubscriptionAssignParams.Members.
//
//   - storage.StrategyRoundRobin (or ""): members sorted by name, partition p to member p mod n.
//     It ignores previous: a join or leave may move most partitions.
//   - storage.StrategySticky: fewest moves. Each member still present keeps as many of the
//     partitions it owned in previous as its fair share allows (the members that owned the most
//     get the larger shares); the partitions left (of members that left, over a share, or new)
//     go to the members with room, fewest partitions first, then by name.
//
// It is pure and deterministic. An unknown strategy is an error matching
// storage.ErrInvalidArgument.
func Assign(strategy string, members []string, partitions int, previous map[string][]int32) (map[string][]int32, error) {
	if err := storage.CheckStrategy(strategy); err != nil {
		return nil, err
	}
	out := make(map[string][]int32, len(members))
	if len(members) == 0 {
		return out, nil
	}
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	for _, m := range sorted {
		out[m] = []int32{}
	}
	if strategy != storage.StrategySticky {
		for p := range partitions {
			m := sorted[p%len(sorted)]
			out[m] = append(out[m], int32(p))
		}
		return out, nil
	}

	// What each member still present owned (valid partitions only, each counted once).
	owned := make(map[string][]int32, len(sorted))
	taken := make([]bool, partitions)
	for _, m := range sorted {
		ps := slices.Clone(previous[m])
		slices.Sort(ps)
		for _, p := range ps {
			if p >= 0 && int(p) < partitions && !taken[p] {
				taken[p] = true
				owned[m] = append(owned[m], p)
			}
		}
	}
	// Shares: partitions/n each, one more for the first partitions%n members by previous load.
	byLoad := slices.Clone(sorted)
	slices.SortStableFunc(byLoad, func(a, b string) int { return cmp.Compare(len(owned[b]), len(owned[a])) })
	share := make(map[string]int, len(sorted))
	for i, m := range byLoad {
		share[m] = partitions / len(sorted)
		if i < partitions%len(sorted) {
			share[m]++
		}
	}
	free := make([]bool, partitions)
	for p := range free {
		free[p] = true
	}
	for _, m := range sorted {
		keep := owned[m][:min(len(owned[m]), share[m])]
		out[m] = append(out[m], keep...)
		for _, p := range keep {
			free[p] = false
		}
	}
	for p, f := range free {
		if !f {
			continue
		}
		// The member with room and the fewest partitions, then by name.
		best := ""
		for _, m := range sorted {
			if len(out[m]) < share[m] && (best == "" || len(out[m]) < len(out[best])) {
				best = m
			}
		}
		out[best] = append(out[best], int32(p))
	}
	for _, m := range sorted {
		slices.Sort(out[m])
	}
	return out, nil
}

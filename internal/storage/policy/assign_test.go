package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

func TestAssignRoundRobin(t *testing.T) {
	got, err := Assign(storage.StrategyRoundRobin, []string{"c", "a", "b"}, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int32{"a": {0, 3, 6}, "b": {1, 4}, "c": {2, 5}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round-robin: %v, want %v", got, want)
	}
	if got, _ := Assign("", nil, 3, nil); len(got) != 0 {
		t.Fatalf("no member: %v", got)
	}
	if got, _ := Assign("", []string{"a", "b", "c"}, 1, nil); !reflect.DeepEqual(got, map[string][]int32{"a": {0}, "b": {}, "c": {}}) {
		t.Fatalf("more members than partitions: %v", got)
	}
	if _, err := Assign("random", []string{"a"}, 1, nil); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("unknown strategy: %v", err)
	}
}

func TestAssignStickyFewestMoves(t *testing.T) {
	prev := map[string][]int32{"a": {0, 1, 2}, "b": {3, 4, 5}, "c": {6, 7}}
	// d joins: two partitions move to it (one from each of a and b), nothing else moves.
	got, err := Assign(storage.StrategySticky, []string{"a", "b", "c", "d"}, 8, prev)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int32{"a": {0, 1}, "b": {3, 4}, "c": {6, 7}, "d": {2, 5}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sticky join: %v, want %v", got, want)
	}
	if moved := moves(prev, got); moved != 2 {
		t.Fatalf("sticky join moved %d partitions, want 2", moved)
	}
	// b leaves: only its partitions move.
	got, _ = Assign(storage.StrategySticky, []string{"a", "c", "d"}, 8, want)
	if moves(want, got) != 2 || !slices.Equal(got["a"][:2], []int32{0, 1}) {
		t.Fatalf("sticky leave: %v", got)
	}
}

// moves counts the partitions whose owner differs between two assignments.
func moves(a, b map[string][]int32) int {
	owner := func(x map[string][]int32) map[int32]string {
		o := map[int32]string{}
		for m, ps := range x {
			for _, p := range ps {
				o[p] = m
			}
		}
		return o
	}
	oa, ob := owner(a), owner(b)
	n := 0
	for p, m := range oa {
		if ob[p] != m {
			n++
		}
	}
	return n
}

// TestAssignProperties: for random groups, both strategies assign every partition exactly once,
// balanced within one; sticky never moves a partition whose owner stayed and kept it within its
// share, so it moves no more than round-robin does.
func TestAssignProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		parts := rng.IntN(20)
		var members []string
		for j := range rng.IntN(6) {
			members = append(members, fmt.Sprintf("m%d", j*3+rng.IntN(3)))
		}
		slices.Sort(members)
		members = slices.Compact(members)
		prevMembers := slices.Clone(members)
		if len(prevMembers) > 0 && rng.IntN(2) == 0 {
			prevMembers = prevMembers[1:]
		}
		prevMembers = append(prevMembers, "gone")
		prev, _ := Assign(storage.StrategyRoundRobin, prevMembers, parts, nil)
		for _, s := range []string{storage.StrategyRoundRobin, storage.StrategySticky} {
			got, err := Assign(s, members, parts, prev)
			if err != nil {
				t.Fatal(err)
			}
			seen := make([]int, parts)
			lo, hi := parts, 0
			for _, m := range members {
				ps, ok := got[m]
				if !ok {
					t.Fatalf("case %d %s: member %q missing", i, s, m)
				}
				lo, hi = min(lo, len(ps)), max(hi, len(ps))
				for _, p := range ps {
					seen[p]++
				}
			}
			for p, n := range seen {
				if len(members) > 0 && n != 1 {
					t.Fatalf("case %d %s: partition %d assigned %d times: %v", i, s, p, n, got)
				}
			}
			if len(members) > 0 && hi-lo > 1 {
				t.Fatalf("case %d %s: unbalanced %v", i, s, got)
			}
		}
		rr, _ := Assign(storage.StrategyRoundRobin, members, parts, prev)
		st, _ := Assign(storage.StrategySticky, members, parts, prev)
		if moves(prev, st) > moves(prev, rr) {
			t.Fatalf("case %d: sticky moved %d, round-robin %d: prev %v sticky %v", i, moves(prev, st), moves(prev, rr), prev, st)
		}
	}
}

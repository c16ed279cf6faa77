package storage

import (
	"errors"
	"slices"
	"testing"
)

func TestNextAssignment(t *testing.T) {
	p := &SubscriptionAssignParams{SubscriptionID: 1, Members: map[string][]int32{"a": {1, 0}, "b": {2}}}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	a1, moved, err := NextAssignment(nil, p, 4, StrategyRoundRobin)
	if err != nil || a1.Generation != 1 || len(moved) != 0 || !slices.Equal(a1.Since, []int64{1, 1, 1, 0}) ||
		!slices.Equal(a1.Members["a"], []int32{0, 1}) {
		t.Fatalf("first assignment: %+v moved %v err %v", a1, moved, err)
	}
	// b leaves, c takes 2 and 3, a keeps 0 and 1.
	p = &SubscriptionAssignParams{SubscriptionID: 1, Generation: 1, Members: map[string][]int32{"a": {0, 1}, "c": {2, 3}}}
	a2, moved, err := NextAssignment(a1, p, 4, StrategyRoundRobin)
	if err != nil || !slices.Equal(moved, []int32{2}) || !slices.Equal(a2.Since, []int64{1, 1, 2, 2}) {
		t.Fatalf("second assignment: %+v moved %v err %v", a2, moved, err)
	}
	if _, _, err := NextAssignment(a2, p, 4, ""); !errors.Is(err, ErrStaleGeneration) {
		t.Fatalf("assignment from an old generation: %v", err)
	}
	if _, _, err := NextAssignment(nil, &SubscriptionAssignParams{Members: map[string][]int32{"a": {4}}}, 4, ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("partition out of range: %v", err)
	}
	for _, c := range []struct {
		member string
		gen    int64
		p      int32
		ok     bool
	}{
		{"a", 1, 0, true}, {"a", 2, 1, true}, {"c", 2, 2, true},
		{"c", 1, 2, false}, // older than its ownership
		{"b", 1, 2, false}, // lost it
		{"a", 3, 0, false}, // future generation
		{"a", 2, 9, false}, // no such partition
	} {
		if err := a2.Fence(c.member, c.gen, c.p); (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrStaleGeneration)) {
			t.Errorf("Fence(%q, %d, %d) = %v, want ok %v", c.member, c.gen, c.p, err, c.ok)
		}
	}
	if _, err := a2.ClaimPartitions("a", 1, nil); !errors.Is(err, ErrStaleGeneration) {
		t.Errorf("claim with an old generation: %v", err)
	}
	if ps, err := a2.ClaimPartitions("c", 2, []int32{3}); err != nil || !slices.Equal(ps, []int32{3}) {
		t.Errorf("claim with a filter: %v %v", ps, err)
	}
}

func TestSubscriptionAssignParamsCheck(t *testing.T) {
	for _, p := range []*SubscriptionAssignParams{
		nil,
		{Generation: -1},
		{Members: map[string][]int32{"a": {0}, "b": {0}}},
		{Members: map[string][]int32{"a": {-1}}},
		{Members: map[string][]int32{"": nil}},
		{Strategy: "random"},
	} {
		if err := p.Check(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Check(%+v) = %v, want ErrInvalidArgument", p, err)
		}
	}
}

package storage

import (
	"errors"
	"slices"
	"testing"
)

func TestLinkRuns(t *testing.T) {
	// Partition 0: P Q P R R S; partition 1: A - A; message 3 is a duplicate (not stored).
	keys := []string{"P", "A", "Q", "X", "P", "", "R", "A", "R", "S"}
	parts := []int32{0, 1, 0, -1, 0, 1, 0, 1, 0, 0}
	got := LinkRuns(len(keys), func(i int) int32 { return parts[i] }, func(i int) []byte { return []byte(keys[i]) })
	want := []bool{true, true, true, false, false, true, true, false, false, false}
	if !slices.Equal(got, want) {
		t.Fatalf("LinkRuns = %v, want %v", got, want)
	}
}

func TestCheckBatchRefs(t *testing.T) {
	held := func(p int32) []int64 {
		if p == 0 {
			return []int64{5, 3, 4}
		}
		return nil
	}
	whole := []DeliveryRef{{0, 3}, {0, 4}, {0, 5}, {1, 9}}
	if err := CheckBatchRefs(whole, held); err != nil {
		t.Fatalf("whole batch: %v", err)
	}
	err := CheckBatchRefs(whole[1:], held)
	if !errors.Is(err, ErrBatchSplit) || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("subset: got %v, want ErrBatchSplit", err)
	}
}

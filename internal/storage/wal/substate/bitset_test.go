package substate

import (
	"math/rand/v2"
	"testing"
)

func TestBitsetAgainstMap(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var b bitset
	model := map[int64]bool{}
	low := int64(0)
	for i := 0; i < 20000; i++ {
		switch rng.IntN(10) {
		case 0: // trim
			low += int64(rng.IntN(200))
			want := 0
			for o := range model {
				if o < low {
					delete(model, o)
					want++
				}
			}
			if got := b.trim(low); got != want {
				t.Fatalf("step %d: trim(%d) removed %d, want %d", i, low, got, want)
			}
		case 1: // clear
			o := low + int64(rng.IntN(500))
			if got := b.clear(o); got != model[o] {
				t.Fatalf("clear(%d) = %v, want %v", o, got, model[o])
			}
			delete(model, o)
		default:
			o := low + int64(rng.IntN(500))
			if got := b.set(o); got == model[o] {
				t.Fatalf("set(%d) = %v with member=%v", o, got, model[o])
			}
			model[o] = true
		}
		if b.count() != len(model) {
			t.Fatalf("step %d: count %d, want %d", i, b.count(), len(model))
		}
		o := low + int64(rng.IntN(600)) - 50
		if b.test(o) != model[o] {
			t.Fatalf("test(%d) = %v, want %v", o, b.test(o), model[o])
		}
		want := o
		for model[want] {
			want++
		}
		if got := b.runFrom(o); got != want {
			t.Fatalf("runFrom(%d) = %d, want %d", o, got, want)
		}
		from, to := o, o+int64(rng.IntN(300))
		n := 0
		for x := from; x < to; x++ {
			if model[x] {
				n++
			}
		}
		if got := b.countRange(from, to); got != n {
			t.Fatalf("countRange(%d,%d) = %d, want %d", from, to, got, n)
		}
	}
}

func TestHeapOrderAndRemove(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var h entryHeap
	live := map[*Entry]bool{}
	for i := 0; i < 5000; i++ {
		switch rng.IntN(4) {
		case 0, 1:
			e := &Entry{Offset: int64(i), Time: int64(rng.IntN(1000)), idx: -1}
			h.push(e)
			live[e] = true
		case 2:
			for e := range live {
				h.remove(e)
				delete(live, e)
				if e.idx != -1 {
					t.Fatal("removed entry keeps an index")
				}
				break
			}
		case 3:
			if e := h.pop(); e != nil {
				for o := range live {
					if less(o, e) {
						t.Fatalf("pop returned %+v but %+v is smaller", e, o)
					}
				}
				delete(live, e)
			}
		}
		if len(h) != len(live) {
			t.Fatalf("heap has %d, want %d", len(h), len(live))
		}
		for i, e := range h {
			if e.idx != i {
				t.Fatalf("entry at %d has idx %d", i, e.idx)
			}
		}
	}
}

func TestBitsetSetRange(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		var b bitset
		model := map[int64]bool{}
		for range 3 {
			o := int64(rng.IntN(300))
			b.set(o)
			model[o] = true
		}
		from := int64(rng.IntN(300))
		to := from + int64(rng.IntN(200))
		want := 0
		for o := from; o < to; o++ {
			if !model[o] {
				want++
				model[o] = true
			}
		}
		if got := b.setRange(from, to); got != want {
			t.Fatalf("setRange(%d,%d) added %d, want %d", from, to, got, want)
		}
		if b.count() != len(model) {
			t.Fatalf("count %d want %d", b.count(), len(model))
		}
		for o := range model {
			if !b.test(o) {
				t.Fatalf("%d missing", o)
			}
		}
	}
}

package substate

import "math/bits"

// bitset holds a set of offsets at or above a moving low bound. Bit i of words[i/64] stands for
// offset base+i; base is a multiple of 64 so words can be dropped from the front as the floor moves.
type bitset struct {
	base  int64
	words []uint64
}

func (b *bitset) test(o int64) bool {
	if o < b.base {
		return false
	}
	i := (o - b.base) >> 6
	if i >= int64(len(b.words)) {
		return false
	}
	return b.words[i]&(1<<uint((o-b.base)&63)) != 0
}

// grow makes the words cover offset o. o must be >= the bound passed to trim.
func (b *bitset) grow(o int64) {
	if len(b.words) == 0 {
		b.base = o &^ 63
	}
	if o < b.base {
		// Grow at the front (only happens when the set is empty after a trim to a lower base).
		shift := (b.base - o&^63) >> 6
		nw := make([]uint64, int64(len(b.words))+shift)
		copy(nw[shift:], b.words)
		b.words = nw
		b.base = o &^ 63
	}
	i := (o - b.base) >> 6
	for i >= int64(len(b.words)) {
		b.words = append(b.words, 0)
	}
}

// set sets o and reports whether it was clear. o must be >= the bound passed to trim.
func (b *bitset) set(o int64) bool {
	b.grow(o)
	i := (o - b.base) >> 6
	m := uint64(1) << uint((o-b.base)&63)
	if b.words[i]&m != 0 {
		return false
	}
	b.words[i] |= m
	return true
}

// setRange sets [from, to) and returns how many offsets were not set before.
func (b *bitset) setRange(from, to int64) int {
	if from >= to {
		return 0
	}
	b.grow(from)
	b.grow(to - 1)
	added := 0
	for o := from; o < to; {
		i := (o - b.base) >> 6
		bit := uint((o - b.base) & 63)
		n := min(int64(64-bit), to-o)
		mask := ^uint64(0)
		if n < 64 {
			mask = (uint64(1)<<uint(n) - 1) << bit
		}
		added += bits.OnesCount64(mask &^ b.words[i])
		b.words[i] |= mask
		o += n
	}
	return added
}

// clear clears o and reports whether it was set.
func (b *bitset) clear(o int64) bool {
	if !b.test(o) {
		return false
	}
	i := (o - b.base) >> 6
	b.words[i] &^= 1 << uint((o-b.base)&63)
	return true
}

// runFrom returns the first offset >= o that is not in the set.
func (b *bitset) runFrom(o int64) int64 {
	for {
		if o < b.base {
			return o
		}
		i := (o - b.base) >> 6
		if i >= int64(len(b.words)) {
			return o
		}
		bit := uint((o - b.base) & 63)
		w := ^b.words[i] >> bit // ones where offsets are missing
		if w != 0 {
			return o + int64(bits.TrailingZeros64(w))
		}
		o += int64(64 - bit)
	}
}

// countBelow counts members below o (all of them, when o is past the end).
func (b *bitset) countRange(from, to int64) int {
	n := 0
	for o := from; o < to; {
		if o < b.base {
			o = b.base
			continue
		}
		i := (o - b.base) >> 6
		if i >= int64(len(b.words)) {
			break
		}
		w := b.words[i] >> uint((o-b.base)&63)
		span := 64 - (o-b.base)&63
		if to-o < span {
			w &= (1 << uint(to-o)) - 1
			span = to - o
		}
		n += bits.OnesCount64(w)
		o += span
	}
	return n
}

// trim forgets every member below o. It returns how many members it removed.
func (b *bitset) trim(o int64) int {
	if len(b.words) == 0 || o <= b.base {
		return 0
	}
	removed := b.countRange(b.base, o)
	drop := (o - b.base) >> 6
	if drop >= int64(len(b.words)) {
		b.words = b.words[:0]
		b.base = o &^ 63
		return removed
	}
	// Clear the bits below o inside the first kept word.
	b.words = b.words[drop:]
	b.base += drop << 6
	if r := uint((o - b.base) & 63); r != 0 {
		b.words[0] &^= (1 << r) - 1
	}
	// Release the dropped prefix once it dominates the backing array.
	if cap(b.words) > 64 && len(b.words) < cap(b.words)/4 {
		nw := make([]uint64, len(b.words), len(b.words)*2)
		copy(nw, b.words)
		b.words = nw
	}
	// Drop trailing zero words so an empty set holds no memory.
	for len(b.words) > 0 && b.words[len(b.words)-1] == 0 {
		b.words = b.words[:len(b.words)-1]
	}
	if len(b.words) == 0 {
		b.words = nil
	}
	return removed
}

// count is the number of members.
func (b *bitset) count() int {
	n := 0
	for _, w := range b.words {
		n += bits.OnesCount64(w)
	}
	return n
}

// each calls fn for every member in increasing order.
func (b *bitset) each(fn func(o int64)) {
	for i, w := range b.words {
		for w != 0 {
			t := bits.TrailingZeros64(w)
			fn(b.base + int64(i)<<6 + int64(t))
			w &= w - 1
		}
	}
}

// nextSet returns the first member >= o, or end when there is none below end.
func (b *bitset) nextSet(o, end int64) int64 {
	o = max(o, b.base)
	for o < end {
		i := (o - b.base) >> 6
		if i >= int64(len(b.words)) {
			return end
		}
		bit := uint((o - b.base) & 63)
		if w := b.words[i] >> bit; w != 0 {
			return min(o+int64(bits.TrailingZeros64(w)), end)
		}
		o += int64(64 - bit)
	}
	return end
}

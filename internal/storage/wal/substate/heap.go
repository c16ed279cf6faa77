package substate

// entryHeap is a min-heap of entries ordered by (Time, Partition, Offset). Each entry records its
// index so it can be removed or fixed in O(log n). An entry is in at most one heap at a time (the
// lease heap while leased, the waiting heap while waiting); its idx is -1 when in none.
type entryHeap []*Entry

func less(a, b *Entry) bool {
	if a.Time != b.Time {
		return a.Time < b.Time
	}
	if a.Partition != b.Partition {
		return a.Partition < b.Partition
	}
	if a.Offset != b.Offset {
		return a.Offset < b.Offset
	}
	// A replayed copy and a pending entry of the same offset cannot coexist, but keep the order
	// total anyway.
	return a.DLQ < b.DLQ
}

func (h *entryHeap) push(e *Entry) {
	e.idx = len(*h)
	*h = append(*h, e)
	h.up(e.idx)
}

func (h *entryHeap) top() *Entry {
	if len(*h) == 0 {
		return nil
	}
	return (*h)[0]
}

func (h *entryHeap) pop() *Entry {
	if len(*h) == 0 {
		return nil
	}
	e := (*h)[0]
	h.remove(e)
	return e
}

func (h *entryHeap) remove(e *Entry) {
	i := e.idx
	if i < 0 || i >= len(*h) || (*h)[i] != e {
		return
	}
	last := len(*h) - 1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	e.idx = -1
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	if cap(*h) > 1024 && len(*h) < cap(*h)/4 {
		nh := make(entryHeap, len(*h), len(*h)*2)
		copy(nh, *h)
		*h = nh
	}
}

func (h *entryHeap) fix(e *Entry) {
	if !h.down(e.idx) {
		h.up(e.idx)
	}
}

func (h entryHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}

func (h entryHeap) up(j int) {
	for {
		i := (j - 1) / 2
		if i == j || j <= 0 || !less(h[j], h[i]) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h entryHeap) down(i0 int) bool {
	i := i0
	n := len(h)
	for {
		j1 := 2*i + 1
		if j1 >= n || j1 < 0 {
			break
		}
		j := j1
		if j2 := j1 + 1; j2 < n && less(h[j2], h[j1]) {
			j = j2
		}
		if !less(h[j], h[i]) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}

package wal

import (
	"slices"
	"testing"
)

// TestCompletionRuns: completions of one state within a second share a run, in any order; the
// first record of an offset stays; addRange fills only the gaps; trim cuts below a low offset.
func TestCompletionRuns(t *testing.T) {
	c := completions{}
	sec := runCoalesce
	for _, o := range []int64{3, 1, 2, 0} { // out of order, within a second
		c.add(0, o, 10, runAcked)
	}
	c.add(0, 4, 10+2*sec, runAcked) // a second later: a new run
	c.add(0, 5, 10+2*sec, runDLQ)   // another state: a new run
	c.add(0, 2, 99*sec, runDLQ)     // recorded already: unchanged
	want := []crun{{0, 4, 10, runAcked}, {4, 5, 10 + 2*sec, runAcked}, {5, 6, 10 + 2*sec, runDLQ}}
	if !slices.Equal(c[0], want) {
		t.Fatalf("runs %v, want %v", c[0], want)
	}
	c.addRange(0, 2, 9, 7, runRemoved)
	want = append(want, crun{6, 9, 7, runRemoved})
	if !slices.Equal(c[0], want) {
		t.Fatalf("after addRange: %v, want %v", c[0], want)
	}
	c.add(0, 10, 1, runAcked)
	c.addRange(0, 8, 12, 3, runExcluded) // around a recorded offset
	if r, ok := c.get(0, 9); !ok || r.state != runExcluded || r.lo != 9 || r.hi != 10 {
		t.Errorf("get(9) = %v, %v", r, ok)
	}
	if r, ok := c.get(0, 11); !ok || r.state != runExcluded {
		t.Errorf("get(11) = %v, %v", r, ok)
	}
	if r, ok := c.get(0, 10); !ok || r.state != runAcked {
		t.Errorf("get(10) = %v, %v", r, ok)
	}
	c.trim(0, 3)
	if c[0][0].lo != 3 {
		t.Errorf("after trim: %v", c[0])
	}
	c.trim(0, 100)
	if _, ok := c[0]; ok {
		t.Errorf("after a trim past everything: %v", c[0])
	}
}

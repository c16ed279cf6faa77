package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// exactQuantile is the reference: the smallest recorded value with at least ceil(q*n) values at
// or below it.
func exactQuantile(sorted []int64, q float64) int64 {
	rank := max(int(math.Ceil(q*float64(len(sorted)))), 1)
	return sorted[rank-1]
}

func TestBucketsCoverEveryValue(t *testing.T) {
	t.Parallel()
	// Around every power of two and at the ends, a value falls in a bucket whose range holds it,
	// and buckets follow each other without gap or overlap.
	var vals []int64
	for s := range 63 {
		p := int64(1) << s
		vals = append(vals, p-1, p, p+1)
	}
	vals = append(vals, 0, math.MaxInt64, math.MaxInt64-1)
	for _, v := range vals {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d, out of [0, %d)", v, i, numBuckets)
		}
		low, width := bucketRange(i)
		if v < low || v-low >= width {
			t.Fatalf("value %d in bucket %d = [%d, %d+%d)", v, i, low, low, width)
		}
		if width > 1 && float64(width)/float64(low) > 1.0/(1<<subBits)+1e-12 {
			t.Fatalf("bucket %d = [%d, +%d) is wider than 1/%d of its low", i, low, width, 1<<subBits)
		}
	}
	for i := 1; i < numBuckets; i++ {
		pl, pw := bucketRange(i - 1)
		l, _ := bucketRange(i)
		if pl+pw != l {
			t.Fatalf("bucket %d ends at %d, bucket %d starts at %d", i-1, pl+pw, i, l)
		}
	}
}

func TestHistogramQuantilesWithinRelativeError(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dists := map[string]func() int64{
		"uniform 0-1000":        func() int64 { return rng.Int64N(1000) },
		"exponential 200us":     func() int64 { return int64(rng.ExpFloat64() * 200e3) },
		"lognormal with tail":   func() int64 { return int64(math.Exp(rng.NormFloat64()*1.5 + 13)) },
		"bimodal 1ms and 100ms": func() int64 { return int64(1e6 + rng.Float64()*1e6 + float64(rng.IntN(100)/99)*1e8) },
	}
	qs := []float64{0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999, 1}
	for name, gen := range dists {
		h := NewHistogram()
		vals := make([]int64, 100_000)
		for i := range vals {
			vals[i] = gen()
			h.Record(vals[i])
		}
		slices.Sort(vals)
		if h.Count() != uint64(len(vals)) || h.Min() != vals[0] || h.Max() != vals[len(vals)-1] {
			t.Fatalf("%s: count %d min %d max %d, want %d %d %d", name, h.Count(), h.Min(), h.Max(), len(vals), vals[0], vals[len(vals)-1])
		}
		for _, q := range qs {
			got, want := h.Quantile(q), exactQuantile(vals, q)
			if d := math.Abs(float64(got - want)); d > float64(want)/(2<<subBits)+0.5 {
				t.Fatalf("%s: q%v = %d, exact %d (error %.3f%%)", name, q, got, want, 100*d/float64(want))
			}
		}
		var sum float64
		for _, v := range vals {
			sum += float64(v)
		}
		if m := sum / float64(len(vals)); math.Abs(h.Mean()-m) > 1e-6*m {
			t.Fatalf("%s: mean %v, want %v", name, h.Mean(), m)
		}
	}
}

func TestHistogramSmallValuesExact(t *testing.T) {
	t.Parallel()
	h := NewHistogram()
	for v := range int64(200) {
		h.Record(v)
	}
	// 200 values 0..199: p50 is the 100th value, 99; p99 the 198th, 197.
	if got := h.Quantile(0.5); got != 99 {
		t.Fatalf("p50 = %d, want 99", got)
	}
	if got := h.Quantile(0.99); got != 197 {
		t.Fatalf("p99 = %d, want 197", got)
	}
	h.Record(-5) // counts as 0
	if h.Min() != 0 || h.Count() != 201 {
		t.Fatalf("min %d count %d", h.Min(), h.Count())
	}
}

func TestHistogramEmptyAndSingle(t *testing.T) {
	t.Parallel()
	h := NewHistogram()
	if h.Quantile(0.99) != 0 || h.Min() != 0 || h.Max() != 0 || h.Mean() != 0 || h.Count() != 0 {
		t.Fatal("empty histogram does not report zeros")
	}
	h.Record(123_456_789)
	for _, q := range []float64{0, 0.5, 1} {
		if got := h.Quantile(q); got != 123_456_789 {
			t.Fatalf("q%v of one value = %d (clamped to min and max)", q, got)
		}
	}
}

func TestHistogramMerge(t *testing.T) {
	t.Parallel()
	a, b, all := NewHistogram(), NewHistogram(), NewHistogram()
	for i := range int64(10_000) {
		v := i * i
		all.Record(v)
		if i%3 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	a.Merge(b)
	a.Merge(NewHistogram())
	if a.Count() != all.Count() || a.Min() != all.Min() || a.Max() != all.Max() || a.Mean() != all.Mean() {
		t.Fatalf("merged count %d min %d max %d mean %v, want %d %d %d %v", a.Count(), a.Min(), a.Max(), a.Mean(), all.Count(), all.Min(), all.Max(), all.Mean())
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		if a.Quantile(q) != all.Quantile(q) {
			t.Fatalf("q%v: merged %d, direct %d", q, a.Quantile(q), all.Quantile(q))
		}
	}
}

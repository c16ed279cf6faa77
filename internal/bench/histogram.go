package bench

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the precision of a Histogram: every power-of-two range of values is split into
// 2^subBits equal buckets, so a bucket is at most 1/2^subBits (0.78%) of its lowest value wide.
// Values below 2^(subBits+1) have a bucket each (exact).
const subBits = 7

// numBuckets covers every non-negative int64.
const numBuckets = (64 - subBits) << subBits

// Histogram records non-negative values (latencies in nanoseconds) in log-linear buckets, as
// HdrHistogram does: quantiles are within 0.4% of the recorded values (the middle of a bucket
// at most 0.78% wide), whatever the range, in constant memory (58 KiB). The zero value is not
// usable: call NewHistogram. Not safe for concurrent use: give each goroutine its own and Merge
// them.
type Histogram struct {
	counts   []uint64
	count    uint64
	min, max int64
	sum      float64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{counts: make([]uint64, numBuckets), min: math.MaxInt64}
}

// bucketOf returns the bucket of v >= 0.
func bucketOf(v int64) int {
	u := uint64(v)
	if u < 2<<subBits {
		return int(u)
	}
	shift := bits.Len64(u) - (subBits + 1)
	return (shift+1)<<subBits + int(u>>shift) - 1<<subBits
}

// bucketRange returns the lowest value of bucket i and its width.
func bucketRange(i int) (low, width int64) {
	if i < 2<<subBits {
		return int64(i), 1
	}
	shift := i>>subBits - 1
	mant := int64(i&(1<<subBits-1)) + 1<<subBits
	return mant << shift, 1 << shift
}

// Record adds one value; a negative value counts as 0.
func (h *Histogram) Record(v int64) {
	v = max(v, 0)
	h.counts[bucketOf(v)]++
	h.count++
	h.sum += float64(v)
	h.min = min(h.min, v)
	h.max = max(h.max, v)
}

// RecordDuration adds one duration.
func (h *Histogram) RecordDuration(d time.Duration) { h.Record(int64(d)) }

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.count == 0 {
		return
	}
	for i, n := range o.counts {
		h.counts[i] += n
	}
	h.count += o.count
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Count returns the number of recorded values.
func (h *Histogram) Count() uint64 { return h.count }

// Min returns the smallest recorded value (exact); 0 when empty.
func (h *Histogram) Min() int64 {
	if h.count == 0 {
		return 0
	}
	return h.min
}

// Max returns the largest recorded value (exact); 0 when empty.
func (h *Histogram) Max() int64 { return h.max }

// Mean returns the mean of the recorded values (exact up to float64 rounding); 0 when empty.
func (h *Histogram) Mean() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / float64(h.count)
}

// Quantile returns the value at quantile q (0 to 1; 0.99 is p99): the smallest value such that a
// fraction q of the recorded values are at most it, as the middle of its bucket (clamped to the
// exact min and max). 0 when empty.
func (h *Histogram) Quantile(q float64) int64 {
	if h.count == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(math.Ceil(q * float64(h.count)))
	rank = max(rank, 1)
	var seen uint64
	for i, n := range h.counts {
		seen += n
		if seen >= rank {
			low, width := bucketRange(i)
			return min(max(low+(width-1)/2, h.min), h.max)
		}
	}
	return h.max
}

// QuantileDuration returns Quantile as a duration.
func (h *Histogram) QuantileDuration(q float64) time.Duration { return time.Duration(h.Quantile(q)) }

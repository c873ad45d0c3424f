// Package compare holds the arithmetic of issue 72's comparison of
// converge with local-path-provisioner and with pods without volumes
// (test/e2e/compare.go runs it on the e2e cluster): percentiles of each
// round's samples, the spread of the rounds' medians, ratios between
// ways, and whether one way is faster than another. It needs no cluster,
// so that its tests run with the e2e module's unit tests.
package compare

import (
	"math"
	"slices"
)

// Percentile is the p-th percentile (0 < p <= 100) of xs by the nearest
// rank: the smallest sample that at least p% of the samples are at or
// below, so that it is always one of the samples. NaN for no sample.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Range is the smallest and the largest of some values.
type Range struct {
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// RangeOf is the range of xs; NaN ends for none.
func RangeOf(xs []float64) Range {
	if len(xs) == 0 {
		return Range{math.NaN(), math.NaN()}
	}
	return Range{slices.Min(xs), slices.Max(xs)}
}

// Overlaps says whether r and o share a value (ends included).
func (r Range) Overlaps(o Range) bool {
	return r.Min <= o.Max && o.Min <= r.Max
}

// Verdict is how a way compares with a baseline on one metric.
type Verdict string

const (
	// Below: every round's median below every one of the baseline's
	// (quicker, or less CPU or memory).
	Below Verdict = "below"
	// Above: every round's median above every one of the baseline's.
	Above Verdict = "above"
	// Overlap: the spreads overlap, and neither is faster.
	Overlap Verdict = "overlap"
)

// Judge compares a way's spread of per-round medians with a baseline's:
// lower is better (times, CPU, memory). "" when either has no value.
func Judge(way, baseline Range) Verdict {
	switch {
	case math.IsNaN(way.Min) || math.IsNaN(baseline.Min):
		return ""
	case way.Max < baseline.Min:
		return Below
	case way.Min > baseline.Max:
		return Above
	}
	return Overlap
}

// Ratio is a/b, or NaN when either is not a number or b is 0.
func Ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

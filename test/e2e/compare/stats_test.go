package compare

import (
	"math"
	"testing"
)

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10} // unsorted on purpose
	for _, c := range []struct {
		p    float64
		want float64
	}{{50, 5}, {99, 10}, {100, 10}, {10, 1}, {11, 2}, {90, 9}, {1, 1}} {
		if got := Percentile(xs, c.p); got != c.want {
			t.Errorf("p%v of 1..10 = %v, want %v", c.p, got, c.want)
		}
	}
	if xs[0] != 5 {
		t.Errorf("Percentile sorted its argument in place: %v", xs)
	}
	if got := Percentile([]float64{3}, 99); got != 3 {
		t.Errorf("p99 of one sample = %v, want it", got)
	}
	// Of 3 samples (make test's smoke run), p50 is the middle one and p99
	// the largest.
	if got := Percentile([]float64{0.3, 0.1, 0.2}, 50); got != 0.2 {
		t.Errorf("p50 of three = %v, want 0.2", got)
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("p50 of nothing = %v, want NaN", got)
	}
}

func TestRangeOverlaps(t *testing.T) {
	if r := RangeOf([]float64{3, 1, 2}); r != (Range{1, 3}) {
		t.Errorf("RangeOf = %v, want 1..3", r)
	}
	for _, c := range []struct {
		a, b Range
		want bool
	}{
		{Range{1, 2}, Range{3, 4}, false},
		{Range{3, 4}, Range{1, 2}, false},
		{Range{1, 3}, Range{2, 4}, true},
		{Range{1, 2}, Range{2, 3}, true}, // touching ends overlap
		{Range{1, 4}, Range{2, 3}, true},
		{Range{2, 2}, Range{2, 2}, true},
	} {
		if got := c.a.Overlaps(c.b); got != c.want {
			t.Errorf("%v overlaps %v = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestJudge(t *testing.T) {
	for _, c := range []struct {
		way, base Range
		want      Verdict
	}{
		{Range{1, 2}, Range{3, 4}, Below},
		{Range{3, 4}, Range{1, 2}, Above},
		{Range{1, 3}, Range{2, 4}, Overlap},
		{Range{math.NaN(), math.NaN()}, Range{1, 2}, ""},
	} {
		if got := Judge(c.way, c.base); got != c.want {
			t.Errorf("Judge(%v, %v) = %q, want %q", c.way, c.base, got, c.want)
		}
	}
}

func TestRatio(t *testing.T) {
	if got := Ratio(3, 2); got != 1.5 {
		t.Errorf("3/2 = %v", got)
	}
	for _, c := range [][2]float64{{1, 0}, {math.NaN(), 1}, {1, math.NaN()}} {
		if got := Ratio(c[0], c[1]); !math.IsNaN(got) {
			t.Errorf("Ratio(%v, %v) = %v, want NaN", c[0], c[1], got)
		}
	}
}

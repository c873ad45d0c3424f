package soak

import (
	"cmp"
	"slices"
	"testing"
	"time"
)

var kinds = []Kind{
	{Name: "kill-csi-node", Every: 90 * time.Second, Targets: 2},
	{Name: "stop-kubelet", Every: 5 * time.Minute, Targets: 2, Hold: [2]time.Duration{10 * time.Second, 2 * time.Minute}},
	{Name: "snapshot", Every: 20 * time.Second, Targets: 8},
}

func TestPlanReplays(t *testing.T) {
	a, err := Plan(7, time.Hour, kinds)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Plan(7, time.Hour, kinds)
	if !slices.Equal(a, b) {
		t.Fatalf("the same seed planned twice differs")
	}
	c, _ := Plan(8, time.Hour, kinds)
	if slices.Equal(a, c) {
		t.Errorf("seeds 7 and 8 planned the same")
	}
	// Another kind added, or the kinds reordered, leaves each kind's
	// events as they were.
	reordered := slices.Clone(kinds)
	slices.Reverse(reordered)
	more, _ := Plan(7, time.Hour, append([]Kind{{Name: "fill-pool", Every: 10 * time.Minute, Targets: 2}}, reordered...))
	of := func(es []Event, kind string) []Event {
		return slices.DeleteFunc(slices.Clone(es), func(e Event) bool { return e.Kind != kind })
	}
	for _, k := range kinds {
		if !slices.Equal(of(a, k.Name), of(more, k.Name)) {
			t.Errorf("%s's events moved when a kind was added", k.Name)
		}
	}
	if !slices.IsSortedFunc(a, func(x, y Event) int { return int(x.At - y.At) }) {
		t.Errorf("the plan is not in time order")
	}
}

func TestPlanRates(t *testing.T) {
	const length = 100 * time.Hour
	es, err := Plan(1, length, kinds)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		var n int
		targets := map[int]bool{}
		for _, e := range es {
			if e.Kind != k.Name {
				continue
			}
			n++
			targets[e.Target] = true
			if e.At < 0 || e.At >= length || e.Target < 0 || e.Target >= k.Targets {
				t.Fatalf("%v: outside the plan", e)
			}
			if e.Hold < k.Hold[0] || e.Hold > k.Hold[1] {
				t.Fatalf("%v: held outside %v", e, k.Hold)
			}
		}
		// A Poisson count of mean m is within 4 standard deviations
		// (sqrt m) of it but once in 15000 seeds.
		m := float64(length / k.Every)
		if d := float64(n) - m; d*d > 16*m {
			t.Errorf("%s: %d events over %s, want about %.0f", k.Name, n, length, m)
		}
		if len(targets) != k.Targets {
			t.Errorf("%s: targets %v of %d", k.Name, targets, k.Targets)
		}
	}
}

func TestPlanRefuses(t *testing.T) {
	for _, ks := range [][]Kind{
		{{Name: "", Every: time.Second, Targets: 1}},
		{{Name: "two words", Every: time.Second, Targets: 1}},
		{{Name: "a", Every: 0, Targets: 1}},
		{{Name: "a", Every: time.Second, Targets: 0}},
		{{Name: "a", Every: time.Second, Targets: 1, Hold: [2]time.Duration{2, 1}}},
		{{Name: "a", Every: time.Second, Targets: 1}, {Name: "a", Every: time.Second, Targets: 1}},
	} {
		if _, err := Plan(1, time.Minute, ks); err == nil {
			t.Errorf("%+v: planned", ks)
		}
	}
}

func TestParseSeeds(t *testing.T) {
	random := func() uint64 { return 99 }
	got, err := ParseSeeds("22+0, 7,0,full+0", random)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]uint64{{22, 99}, {7}, {99}, {FullSeed, 99}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("got %v, want %v", got, want)
	}
	if s := SeedsString(got[0]); s != "22+99" {
		t.Errorf("SeedsString: got %q, want 22+99", s)
	}
	for _, bad := range []string{"", "x", "1+", "1,,2", "-1"} {
		if _, err := ParseSeeds(bad, random); err == nil {
			t.Errorf("ParseSeeds(%q): no error", bad)
		}
	}
}

// TestPlanOfSeveralSeeds checks that seeds run at once give each seed's
// events, in time order, and the same plan each time.
func TestPlanOfSeveralSeeds(t *testing.T) {
	kinds := []Kind{{Name: "a", Every: time.Second, Targets: 3}, {Name: "b", Every: 2 * time.Second, Targets: 2}}
	one, _ := Plan(1, time.Minute, kinds)
	two, _ := Plan(2, time.Minute, kinds)
	both, err := PlanOf([]uint64{1, 2}, time.Minute, kinds)
	if err != nil {
		t.Fatal(err)
	}
	if len(both) != len(one)+len(two) {
		t.Fatalf("got %d events, want %d + %d", len(both), len(one), len(two))
	}
	if !slices.IsSortedFunc(both, func(a, b Event) int { return cmp.Compare(a.At, b.At) }) {
		t.Errorf("the events are not in time order")
	}
	for _, e := range append(one, two...) {
		if !slices.Contains(both, e) {
			t.Errorf("event %s of a seed is not in the plan of both", e)
		}
	}
	again, _ := PlanOf([]uint64{1, 2}, time.Minute, kinds)
	if !slices.Equal(both, again) {
		t.Errorf("the plan of seeds 1+2 differs from one time to the next")
	}
}

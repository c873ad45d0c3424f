package compare

import (
	"encoding/json"
	"strings"
	"testing"
)

func round(way string, i int, samples map[string][]float64) Round {
	return Round{Way: way, N: 3, Spread: "one node", Index: i, Samples: samples}
}

func TestSummarize(t *testing.T) {
	rounds := []Round{
		round(EmptyDir, 0, map[string][]float64{Ready: {1, 1, 1}, Returned: {2, 2, 2}, ConvergeCPU: {0.5}}),
		round(LocalPath, 0, map[string][]float64{Bound: {1, 2, 3}, Ready: {2, 3, 4}, Returned: {4, 4, 4}, ConvergeCPU: {0}, PeerCPU: {0.5}}),
		round(ConvergeThin, 0, map[string][]float64{Bound: {1, 1, 1}, Ready: {2, 2, 9}, Returned: {3, 3, 3}, ConvergeCPU: {1}}),
		round(ConvergeThin, 1, map[string][]float64{Bound: {1, 1, 1}, Ready: {4, 4, 4}, Returned: {3, 3, 3}, ConvergeCPU: {2}}),
		round(LocalPath, 1, map[string][]float64{Bound: {1, 2, 3}, Ready: {5, 5, 5}, Returned: {5, 5, 5}, ConvergeCPU: {0}, PeerCPU: {0.5}}),
		round(EmptyDir, 1, map[string][]float64{Ready: {1, 1, 1}, Returned: {2, 2, 2}, ConvergeCPU: {0.5}}),
	}
	cases := Summarize(rounds)
	if len(cases) != 1 || len(cases[0].Ways) != 3 {
		t.Fatalf("cases: %+v, want one of three ways", cases)
	}
	ways := cases[0].Ways
	if ways[0].Way != EmptyDir || ways[1].Way != ConvergeThin || ways[2].Way != LocalPath {
		t.Fatalf("ways in the order %s, %s, %s, want the order of Ways", ways[0].Way, ways[1].Way, ways[2].Way)
	}
	thin := ways[1]
	ready := thin.Metrics[Ready]
	// Samples 2 2 9 4 4 4: p50 4, p99 9; rounds' p50s 2 and 4.
	if ready.P50 != 4 || ready.P99 != 9 || ready.Spread != (Range{2, 4}) || ready.Samples != 6 {
		t.Errorf("thin's ready: %+v", ready)
	}
	// Against local-path's ready (p50s 3 and 5, all samples 2 3 4 5 5 5:
	// p50 4, p99 5): ratios 1 and 1.8, spreads 2..4 and 3..5 overlap.
	if a := thin.Against[LocalPath][Ready]; a.P50 != 1 || a.P99 != 9.0/5 || a.Verdict != Overlap {
		t.Errorf("thin's ready against local-path: %+v", a)
	}
	// Returned: 3 against 4..5: faster; against the emptyDir's 2: slower.
	if a := thin.Against[LocalPath][Returned]; a.P50 != 0.75 || a.Verdict != Below {
		t.Errorf("thin's returned against local-path: %+v", a)
	}
	if a := thin.Against[EmptyDir][Returned]; a.P50 != 1.5 || a.Verdict != Above {
		t.Errorf("thin's returned against emptydir: %+v", a)
	}
	// An emptyDir has no claim: no Bound, so none against it.
	if _, ok := ways[0].Metrics[Bound]; ok {
		t.Errorf("emptydir has a bound metric: %+v", ways[0].Metrics)
	}
	if _, ok := thin.Against[EmptyDir][Bound]; ok {
		t.Errorf("thin's bound compared with an emptyDir's")
	}
	// No ratio against a baseline of 0 (local-path's rounds used no CPU
	// of converge's), and none of a baseline against itself.
	if _, ok := thin.Against[LocalPath][ConvergeCPU]; ok {
		t.Errorf("a ratio against 0: %+v", thin.Against[LocalPath])
	}
	if _, ok := thin.Against[EmptyDir][ConvergeCPU]; ok {
		t.Errorf("CPU compared with an emptyDir's rounds, in which no storage component works: %+v", thin.Against[EmptyDir])
	}
	// The storage component's CPU: converge's in thin's rounds (1 and 2)
	// against local-path's own in its rounds (0.5 and 0.5).
	if a := thin.Against[LocalPath][StorageCPU]; a.P50 != 2 || a.Verdict != Above {
		t.Errorf("thin's storage CPU against local-path's: %+v", a)
	}
	if _, ok := ways[0].Metrics[StorageCPU]; ok {
		t.Errorf("an emptyDir has a storage component's CPU: %+v", ways[0].Metrics)
	}
	if got := sortedKeys(ways[2].Against); len(got) != 1 || got[0] != EmptyDir {
		t.Errorf("local-path is compared with %v, want emptydir alone", got)
	}
	if _, err := json.Marshal(cases); err != nil {
		t.Errorf("the cases do not encode as JSON (a NaN?): %v", err)
	}
	table := Table(cases)
	for _, want := range []string{"N=3, one node, 2 round(s) per way", "converge-thin", "0.75x 0.60x below"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("\n%s", table)
}

func TestSummarizeKeepsCasesApart(t *testing.T) {
	a := round(EmptyDir, 0, map[string][]float64{Ready: {1}})
	b := a
	b.N = 30
	c := a
	c.Spread = "two nodes"
	cases := Summarize([]Round{a, b, c, a})
	if len(cases) != 3 || cases[0].N != 3 || cases[1].N != 30 || cases[2].Spread != "two nodes" {
		t.Fatalf("cases %+v, want N=3, N=30 and two nodes apart, in the order they ran", cases)
	}
	if cases[0].Ways[0].Rounds != 2 {
		t.Errorf("rounds of the first case: %d, want 2", cases[0].Ways[0].Rounds)
	}
}

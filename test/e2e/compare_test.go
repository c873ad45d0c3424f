package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/converge-csi/converge/test/e2e/compare"
)

// The comparison's entry point is a test, not a Go benchmark: TestMain
// brings the cluster up for m.Run, which would run a BenchmarkCompare,
// but a benchmark is called again with a growing b.N unless -benchtime
// says 1x, is left out of the run's invariants' check (a -test.run that
// matches no test), and cannot be the smoke test that make test runs.
// So TestCompare, among TestConcurrent's tests, runs the harness small in
// make test, and at the scale of its flags with -compare (make compare).
// Neither asserts a time: it fails only when a way does not provision,
// start or clean up.

var (
	compareFull       = flag.Bool("compare", false, "TestConcurrent/TestCompare runs issue 72's comparison at the scale of the -compare-* flags (make compare), not its smoke test")
	compareNs         = flag.String("compare-n", "1,30,100", "with -compare, the numbers of pods made at once, comma-separated")
	compareRounds     = flag.Int("compare-rounds", 5, "with -compare, the rounds of each way at each N")
	compareSpreadFlag = flag.String("compare-spread", "one", "with -compare, where the pods go: one (the first node), two (half on a second node, which joins), both")
	compareOut        = flag.String("compare-out", "", "with -compare, a file to write the rounds and their summary to, as JSON")
	compareWays       = flag.String("compare-ways", strings.Join(compare.Ways, ","), "with -compare, the ways to run, comma-separated (a change's before and after needs no peer)")
)

// smokeN is the pods of each way in make test's smoke run: enough for a
// p50 of more than one pod, few enough to go beside the storage suite.
const smokeN = 3

// testCompare runs issue 72's comparison: without -compare, once at
// smokeN pods on the first node, each way once (make test); with it, as
// its flags say. local-path-provisioner is installed for its time, and
// the thin StorageClass made.
func testCompare(t *testing.T) {
	ns, rounds, spreads := []int{smokeN}, 1, []string{"one"}
	out := filepath.Join(t.TempDir(), "compare.json")
	if *compareFull {
		var err error
		if ns, err = parseCompareNs(*compareNs); err != nil {
			t.Fatalf("-compare-n: %v", err)
		}
		rounds, out = *compareRounds, *compareOut
		switch *compareSpreadFlag {
		case "one", "two":
			spreads = []string{*compareSpreadFlag}
		case "both":
			spreads = []string{"one", "two"}
		default:
			t.Fatalf("-compare-spread %q: want one, two or both", *compareSpreadFlag)
		}
	}
	cmp := comparison{ns: ns, rounds: rounds, size: volumeSize, logf: t.Logf}
	for _, s := range spreads {
		if s == "one" {
			cmp.spreads = append(cmp.spreads, compareSpread{name: "one node", nodes: []*kubeNode{c.kubeNode}})
		} else {
			// Before local-path's install, which imports its image
			// into the nodes there are.
			cmp.spreads = append(cmp.spreads, compareSpread{name: "two nodes", nodes: []*kubeNode{c.kubeNode, secondNode(t)}})
		}
	}
	thin := storageClass(t, "converge-compare-thin", map[string]string{"converge.csi.dev/provisioning": "thin"})
	cmp.ways = []compareWay{{compare.EmptyDir, ""}, {compare.ConvergeThin, thin}, {compare.ConvergeThick, "converge"}, {compare.LocalPath, localPathClass}}
	if *compareFull {
		want := strings.Split(*compareWays, ",")
		for _, w := range want {
			if !slices.Contains(compare.Ways, w) {
				t.Fatalf("-compare-ways: %q is none of %v", w, compare.Ways)
			}
		}
		cmp.ways = slices.DeleteFunc(cmp.ways, func(w compareWay) bool { return !slices.Contains(want, w.name) })
	}
	if slices.ContainsFunc(cmp.ways, func(w compareWay) bool { return w.name == compare.LocalPath }) {
		useLocalPath(t)
	}

	if *controllerManagerQPS > 0 {
		t.Logf("kube-controller-manager runs with --kube-api-qps=%d (its default: 20)", *controllerManagerQPS)
	}
	measured, err := cmp.run(context.Background())
	cases := compare.Summarize(measured)
	if len(cases) > 0 {
		t.Logf("issue 72's comparison (times in seconds; CPU seconds over a round, RSS in MiB at its end; ratios of p50 and p99, and the verdict of the spreads of the rounds' p50s):\n%s", compare.Table(cases))
		t.Logf("issue 72's breakdown:\n%s", compare.BreakdownTable(cases))
	}
	if out != "" {
		b, jerr := json.MarshalIndent(struct {
			Rounds []compare.Round `json:"rounds"`
			Cases  []compare.Case  `json:"cases"`
		}{measured, cases}, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(out, b, 0o644)
		}
		if jerr != nil {
			t.Errorf("writing %s: %v", out, jerr)
		} else if *compareFull {
			t.Logf("the rounds and their summary: %s", out)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if !*compareFull {
		// Every way ran, and measured each of its pods.
		if len(measured) != len(cmp.ways) {
			t.Fatalf("%d rounds measured, want one of each of the %d ways", len(measured), len(cmp.ways))
		}
		for _, r := range measured {
			for _, m := range []string{compare.Bound, compare.Ready, compare.Returned} {
				if got := len(r.Samples[m]); got != smokeN && (m != compare.Bound || r.Way != compare.EmptyDir) {
					t.Errorf("%s: %d samples of %s, want %d", r.Way, got, m, smokeN)
				}
			}
			// Each pod's path to Ready, in the stages of its way.
			stages := map[string]string{compare.EmptyDir: compare.StageKubelet, compare.LocalPath: compare.StageProvision,
				compare.ConvergeThin: compare.StageCreateVolume, compare.ConvergeThick: compare.StageStage}
			if got := len(r.Stages[stages[r.Way]]); got != smokeN {
				t.Errorf("%s: %d samples of stage %s, want %d: %v", r.Way, got, stages[r.Way], smokeN, r.Stages)
			}
			if _, ok := r.Samples[compare.ConvergeCPU]; !ok {
				t.Errorf("%s: converge's CPU not measured", r.Way)
			}
			if _, ok := r.Samples[compare.PeerCPU]; !ok {
				t.Errorf("%s: local-path-provisioner's CPU not measured", r.Way)
			}
		}
	}
}

// parseCompareNs parses -compare-n: positive numbers, comma-separated.
func parseCompareNs(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

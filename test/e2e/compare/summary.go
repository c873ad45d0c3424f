package compare

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The ways issue 72 compares, and the two the others are measured
// against.
const (
	EmptyDir      = "emptydir"       // (a) pods with an emptyDir, no claim
	ConvergeThin  = "converge-thin"  // (b)
	ConvergeThick = "converge-thick" // (c)
	LocalPath     = "local-path"     // (d) local-path-provisioner
)

// Ways are the four, in the order of the issue.
var Ways = []string{EmptyDir, ConvergeThin, ConvergeThick, LocalPath}

// The metrics of a round. The times are per pod, in seconds from the
// moment its claim (or, without one, the pod) was created, or, for
// Returned, from the moment its deletion began. The usage figures are one
// per round.
const (
	Bound    = "bound"    // the claim Bound
	Ready    = "ready"    // the pod Ready
	Returned = "returned" // deleted until the volume's space is given back
	// ConvergeCPU and PeerCPU are CPU seconds over the round, of
	// converge's node pods and of local-path-provisioner's pod;
	// ConvergeRSS and PeerRSS their resident memory at its end, in MiB.
	ConvergeCPU = "converge-cpu-s"
	// StorageCPU and StorageRSS are the way's own storage component's:
	// converge's for its ways, local-path-provisioner's for its own (none
	// for the emptyDir), so that the ratio against local-path sets the
	// one beside the other.
	StorageCPU  = "storage-cpu-s"
	StorageRSS  = "storage-rss-mib"
	ConvergeRSS = "converge-rss-mib"
	PeerCPU     = "peer-cpu-s"
	PeerRSS     = "peer-rss-mib"
)

// times are the metrics that are times.
var times = []string{Bound, Ready, Returned}

// Metrics are every metric, in the order the table prints them.
var Metrics = []string{Bound, Ready, Returned, StorageCPU, StorageRSS, ConvergeCPU, ConvergeRSS, PeerCPU, PeerRSS}

// Round is what one round of one way measured: N pods created at once,
// on one node or spread over two.
type Round struct {
	Way    string `json:"way"`
	N      int    `json:"n"`
	Spread string `json:"spread"`
	Index  int    `json:"round"`
	// Samples are each metric's values; a metric a way has not (Bound
	// of an emptyDir) is absent.
	Samples map[string][]float64 `json:"samples"`
	// Stages are the seconds of each stage of each pod's path to Ready
	// (Path.Stages), for the ways whose paths the harness follows.
	Stages map[string][]float64 `json:"stages,omitempty"`
}

// Stat is one metric of one way over its rounds.
type Stat struct {
	// P50 and P99 are of every sample of every round together.
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	// Spread is the range of each round's own p50: two ways differ only
	// when their spreads do not overlap.
	Spread  Range `json:"spread_of_round_p50"`
	Samples int   `json:"samples"`
}

// Against is a way's metric beside a baseline's: the ratios of their p50s
// and p99s (below 1: the way is quicker or smaller), and the verdict of
// their spreads.
type Against struct {
	P50     float64 `json:"p50_ratio"`
	P99     float64 `json:"p99_ratio"`
	Verdict Verdict `json:"verdict"`
}

// WayResult is one way at one N and spread.
type WayResult struct {
	Way     string          `json:"way"`
	Rounds  int             `json:"rounds"`
	Metrics map[string]Stat `json:"metrics"`
	// Against holds, for each baseline (EmptyDir, LocalPath) measured in
	// the same run, each metric both have: against EmptyDir, the times
	// alone.
	Against map[string]map[string]Against `json:"against,omitempty"`
	// Stages are the stages of its pods' paths to Ready.
	Stages map[string]StageStat `json:"stages,omitempty"`
}

// Case is every way at one N and spread.
type Case struct {
	N      int         `json:"n"`
	Spread string      `json:"spread"`
	Ways   []WayResult `json:"ways"`
}

// Summarize gathers the rounds by N and spread (in the order they first
// ran) and by way (in the order of Ways).
func Summarize(rounds []Round) []Case {
	type key struct {
		n      int
		spread string
	}
	var keys []key
	byKey := map[key]map[string][]Round{}
	for _, r := range rounds {
		k := key{r.N, r.Spread}
		if byKey[k] == nil {
			keys = append(keys, k)
			byKey[k] = map[string][]Round{}
		}
		byKey[k][r.Way] = append(byKey[k][r.Way], r)
	}
	var out []Case
	for _, k := range keys {
		cs := Case{N: k.n, Spread: k.spread}
		results := map[string]WayResult{}
		for _, way := range Ways {
			if rs := byKey[k][way]; len(rs) > 0 {
				results[way] = summarizeWay(way, rs)
			}
		}
		for _, way := range Ways {
			res, ok := results[way]
			if !ok {
				continue
			}
			for _, base := range []string{EmptyDir, LocalPath} {
				b, ok := results[base]
				if !ok || base == way {
					continue
				}
				for _, m := range Metrics {
					if base == EmptyDir && !slices.Contains(times, m) {
						// No storage component works for an emptyDir:
						// its rounds' CPU and memory are the idle ones.
						continue
					}
					s, ok1 := res.Metrics[m]
					bs, ok2 := b.Metrics[m]
					if !ok1 || !ok2 {
						continue
					}
					a := Against{P50: Ratio(s.P50, bs.P50), P99: Ratio(s.P99, bs.P99), Verdict: Judge(s.Spread, bs.Spread)}
					if math.IsNaN(a.P50) || math.IsNaN(a.P99) {
						continue // a baseline of 0 (no CPU at all): no ratio
					}
					if res.Against == nil {
						res.Against = map[string]map[string]Against{}
					}
					if res.Against[base] == nil {
						res.Against[base] = map[string]Against{}
					}
					res.Against[base][m] = a
				}
			}
			cs.Ways = append(cs.Ways, res)
		}
		out = append(out, cs)
	}
	return out
}

// summarizeWay is the Stat of each metric of way's rounds.
func summarizeWay(way string, rounds []Round) WayResult {
	res := WayResult{Way: way, Rounds: len(rounds), Metrics: map[string]Stat{}, Stages: summarizeStages(rounds)}
	for _, m := range Metrics {
		var all, medians []float64
		for _, r := range rounds {
			if xs := r.Samples[storageMetric(way, m)]; len(xs) > 0 {
				all = append(all, xs...)
				medians = append(medians, Percentile(xs, 50))
			}
		}
		if len(all) == 0 {
			continue
		}
		res.Metrics[m] = Stat{P50: Percentile(all, 50), P99: Percentile(all, 99), Spread: RangeOf(medians), Samples: len(all)}
	}
	return res
}

// storageMetric is the metric of round samples that m is for way: m
// itself but for StorageCPU and StorageRSS, which are its own storage
// component's figures ("" for the emptyDir, which has none).
func storageMetric(way, m string) string {
	own := map[string][2]string{ConvergeThin: {ConvergeCPU, ConvergeRSS}, ConvergeThick: {ConvergeCPU, ConvergeRSS}, LocalPath: {PeerCPU, PeerRSS}}
	switch m {
	case StorageCPU:
		return own[way][0]
	case StorageRSS:
		return own[way][1]
	}
	return m
}

// Table prints the cases for a reader: per way and metric the p50, the
// p99, the spread of the rounds' p50s, and the ratios of p50 and p99
// against each baseline with the verdict (= where the spreads overlap).
func Table(cases []Case) string {
	var b strings.Builder
	for _, cs := range cases {
		rounds := 0
		for _, w := range cs.Ways {
			rounds = max(rounds, w.Rounds)
		}
		fmt.Fprintf(&b, "N=%d, %s, %d round(s) per way\n", cs.N, cs.Spread, rounds)
		fmt.Fprintf(&b, "  %-15s %-17s %9s %9s %19s   %-24s %-24s\n", "way", "metric", "p50", "p99", "spread of p50s", "vs "+EmptyDir, "vs "+LocalPath)
		for _, w := range cs.Ways {
			for _, m := range Metrics {
				s, ok := w.Metrics[m]
				if !ok {
					continue
				}
				fmt.Fprintf(&b, "  %-15s %-17s %9.3f %9.3f %8.3f..%-9.3f   %-24s %-24s\n", w.Way, m, s.P50, s.P99, s.Spread.Min, s.Spread.Max,
					against(w.Against[EmptyDir], m), against(w.Against[LocalPath], m))
			}
		}
	}
	return b.String()
}

// against is one cell of the table's ratios: "0.52x 0.61x below".
func against(a map[string]Against, m string) string {
	x, ok := a[m]
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.2fx %.2fx %s", x.P50, x.P99, x.Verdict)
}

// sortedKeys is for tests.
func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

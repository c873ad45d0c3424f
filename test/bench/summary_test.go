package bench

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
)

// row is one figure of the summary table that make bench prints at the
// end, beside its baseline, ratio and goal.
type row struct {
	figure, converge, baseline, ratio, goal, verdict string
}

var (
	// rowsMu guards rows.
	rowsMu sync.Mutex
	rows   []row
)

// compare records a figure measured against its baseline in the same run;
// goal is the highest acceptable ratio converge/baseline, 0 for none.
func compare(figure, unit string, converge, baseline, goal float64) {
	ratio := converge / baseline
	r := row{figure: figure, converge: num(converge, unit), baseline: num(baseline, unit), ratio: fmt.Sprintf("%.2f", ratio)}
	if goal > 0 {
		r.goal, r.verdict = fmt.Sprintf("<= %.2fx", goal), verdict(ratio <= goal)
	}
	add(r)
}

// compareMax records a figure measured against its baseline whose goal is
// an absolute bound: it must stay under max.
func compareMax(figure, unit string, converge, baseline, max float64) {
	r := row{figure: figure, converge: num(converge, unit), baseline: num(baseline, unit), ratio: fmt.Sprintf("%.2f", converge/baseline)}
	r.goal, r.verdict = "< "+num(max, unit), verdict(converge < max)
	add(r)
}

// absolute records a figure with no baseline; goal is its highest
// acceptable value, 0 for none.
func absolute(figure, unit string, v, goal float64) {
	r := row{figure: figure, converge: num(v, unit), baseline: "-", ratio: "-"}
	if goal > 0 {
		r.goal, r.verdict = "< "+num(goal, unit), verdict(v < goal)
	}
	add(r)
}

func add(r row) {
	rowsMu.Lock()
	defer rowsMu.Unlock()
	rows = append(rows, r)
}

// num prints v with three significant digits, never in exponent form.
func num(v float64, unit string) string {
	prec := 2
	switch {
	case v >= 100:
		prec = 0
	case v >= 10:
		prec = 1
	}
	return strings.TrimSpace(fmt.Sprintf("%.*f %s", prec, v, unit))
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

// TestMain runs the benchmarks and then prints every figure they recorded
// as one table.
func TestMain(m *testing.M) {
	code := m.Run()
	rowsMu.Lock()
	defer rowsMu.Unlock()
	if len(rows) > 0 {
		host, _ := os.Hostname()
		fmt.Printf("\nconverge against the raw work, measured in this run on %s:\n\n", host)
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "FIGURE\tCONVERGE\tBASELINE\tRATIO\tGOAL\t")
		for _, r := range rows {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s %s\t\n", r.figure, r.converge, r.baseline, r.ratio, r.goal, r.verdict)
		}
		w.Flush()
	}
	os.Exit(code)
}

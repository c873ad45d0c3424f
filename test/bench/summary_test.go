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
	figure, converge, baseline, ratio, second, goal, verdict string
}

var (
	// rowsMu guards rows and notes.
	rowsMu sync.Mutex
	rows   []row
	// notes are printed under the table.
	notes []string
)

// compare records a figure measured against the raw floor (baseline) and
// the mount-utils baseline (second; 0 for none) in the same run; goal is
// the highest acceptable ratio converge/baseline, 0 for none.
func compare(figure, unit string, converge, baseline, second, goal float64) {
	compareRatio(figure, unit, converge, baseline, second, converge/baseline, goal)
}

// compareRatio is compare with the ratio given: a figure measured in
// several rounds reports the median of the rounds' own ratios, which need
// not be the ratio of the medians.
func compareRatio(figure, unit string, converge, baseline, second, ratio, goal float64) {
	r := row{figure: figure, converge: num(converge, unit), baseline: num(baseline, unit), ratio: fmt.Sprintf("%.2f", ratio), second: secondCol(second, unit)}
	if goal > 0 {
		r.goal, r.verdict = fmt.Sprintf("<= %.2fx", goal), verdict(ratio <= goal)
	}
	add(r)
}

func secondCol(v float64, unit string) string {
	if v == 0 {
		return "-"
	}
	return num(v, unit)
}

// absolute records a figure with no baseline; goal is its highest
// acceptable value, 0 for none.
func absolute(figure, unit string, v, goal float64) {
	r := row{figure: figure, converge: num(v, unit), baseline: "-", ratio: "-", second: "-"}
	if goal > 0 {
		r.goal, r.verdict = "< "+num(goal, unit), verdict(v < goal)
	}
	add(r)
}

// note records a line printed under the table.
func note(line string) {
	rowsMu.Lock()
	defer rowsMu.Unlock()
	notes = append(notes, line)
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
		fmt.Printf("\nconverge against the raw floor (RAW, RATIO) and the mount-utils calls (MOUNT-UTILS), measured in this run on %s:\n\n", host)
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "FIGURE\tCONVERGE\tRAW\tRATIO\tMOUNT-UTILS\tGOAL\t")
		for _, r := range rows {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s %s\t\n", r.figure, r.converge, r.baseline, r.ratio, r.second, r.goal, r.verdict)
		}
		w.Flush()
		for _, n := range notes {
			fmt.Println("- " + n)
		}
	}
	os.Exit(code)
}

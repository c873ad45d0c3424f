package monitoring

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/contract"
)

// TestNamedReasonsAreEmitted fails when an alert rule (deploy/'s, the Helm
// chart's), the alerts' unit tests or the runbook (docs/operations.md)
// names a reason converge never gives: an alert on it could never fire,
// and an operator would look for it in vain. The reasons converge gives
// are those it defines (emittedReasons), and the runbook's table of health
// conditions must list each condition reason.
func TestNamedReasonsAreEmitted(t *testing.T) {
	conditions, events := emittedReasons(t)
	if len(conditions) == 0 || len(events) == 0 {
		t.Fatalf("read %d condition and %d event reasons: emittedReasons no longer finds where they are defined", len(conditions), len(events))
	}
	t.Logf("condition reasons: %s; converge-controller's and its node agent's event reasons: %s", strings.Join(sorted(conditions), ", "), strings.Join(sorted(events), ", "))

	// The alerts match the condition reason of converge_volume_conditions.
	matcher := regexp.MustCompile(`reason\s*(?:=~|!~|=|!=)\s*"([^"]*)"|reason: (\w+)`)
	rules := strings.Join(componentDocs(t, "PrometheusRule"), "\n---\n")
	for _, path := range []string{filepath.Join(component, componentFile), "../../charts/converge/files/alerts.yaml", "rules_test.yaml"} {
		b := []byte(rules)
		if path != filepath.Join(component, componentFile) {
			var err error
			if b, err = os.ReadFile(path); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		for _, m := range matcher.FindAllStringSubmatch(string(b), -1) {
			for _, r := range strings.Split(m[1]+m[2], "|") {
				n++
				if !conditions[r] {
					t.Errorf("%s names reason %q, which no volume's condition has (contract.Reasons)", path, r)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s names no reason: the matcher no longer reads it", path)
		}
	}

	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	table := section(t, string(doc), "## Health conditions")
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| ([^|]+) \\|").FindAllStringSubmatch(table, -1) {
		for _, r := range regexp.MustCompile("`(\\w+)`").FindAllStringSubmatch(m[1], -1) {
			listed[r[1]] = true
			if !conditions[r[1]] {
				t.Errorf("docs/operations.md's Health conditions list reason %s, which no volume's condition has", r[1])
			}
		}
	}
	for r := range conditions {
		if !listed[r] {
			t.Errorf("docs/operations.md's Health conditions do not list reason %s, which a volume's condition may have", r)
		}
	}

	// The runbooks name condition reasons, converge-controller's event
	// reasons, the alerts themselves, and the kubelet's event.
	alerts := map[string]bool{}
	for _, m := range regexp.MustCompile(`alert: (\w+)`).FindAllStringSubmatch(rules, -1) {
		alerts[m[1]] = true
	}
	others := map[string]string{"VolumeConditionAbnormal": "the kubelet's event on a pod whose volume is abnormal"}
	for _, m := range regexp.MustCompile("`([A-Z][a-z]+(?:[A-Z][a-z]*)+)`").FindAllStringSubmatch(section(t, string(doc), "## Alerts"), -1) {
		if r := m[1]; !conditions[r] && !events[r] && !alerts[r] && others[r] == "" {
			t.Errorf("docs/operations.md's runbooks name %s, which is no reason converge gives, nor an alert", r)
		}
	}
}

// section returns the part of doc from heading to the next heading of its
// level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/operations.md has no %q", heading)
	}
	level := heading[:strings.Index(heading, " ")+1]
	if end := strings.Index(rest, "\n"+level); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// emittedReasons returns the reasons converge gives: a volume's condition
// reasons (contract.Reasons, where they are defined) and converge-controller's
// event reasons, the constants named Reason* of pkg/nodeloss.
func emittedReasons(t *testing.T) (conditions, events map[string]bool) {
	conditions, events = map[string]bool{}, map[string]bool{}
	for _, r := range contract.Reasons() {
		conditions[string(r)] = true
	}
	// converge-controller's events, and its node agent's.
	var files []string
	for _, pkg := range []string{"nodeloss", "classagent"} {
		f, err := filepath.Glob("../../pkg/" + pkg + "/*.go")
		if err != nil || len(f) == 0 {
			t.Fatalf("pkg/%s: %v, %d files", pkg, err, len(f))
		}
		files = append(files, f...)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if spec, ok := n.(*ast.ValueSpec); ok {
				for i, name := range spec.Names {
					if b, ok := valueAt(spec, i).(*ast.BasicLit); ok && b.Kind == token.STRING && strings.HasPrefix(name.Name, "Reason") {
						v, _ := strconv.Unquote(b.Value)
						events[v] = true
					}
				}
			}
			return true
		})
	}
	return conditions, events
}

func valueAt(spec *ast.ValueSpec, i int) ast.Expr {
	if i < len(spec.Values) {
		return spec.Values[i]
	}
	return nil
}

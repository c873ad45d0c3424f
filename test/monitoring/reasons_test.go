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
)

// TestNamedReasonsAreEmitted fails when an alert rule (deploy/'s, the Helm
// chart's), the alerts' unit tests or the runbook (docs/operations.md)
// names a reason converge never gives: an alert on it could never fire,
// and an operator would look for it in vain. The reasons converge gives
// are read from the source that gives them (emittedReasons), and the
// runbook's table of health conditions must list each condition reason.
func TestNamedReasonsAreEmitted(t *testing.T) {
	conditions, events := emittedReasons(t)
	if len(conditions) == 0 || len(events) == 0 {
		t.Fatalf("read %d condition and %d event reasons from the source: the scanner no longer finds where they are given", len(conditions), len(events))
	}
	t.Logf("condition reasons: %s; converge-controller's event reasons: %s", strings.Join(sorted(conditions), ", "), strings.Join(sorted(events), ", "))

	// The alerts match the condition reason of converge_volume_conditions.
	matcher := regexp.MustCompile(`reason\s*(?:=~|!~|=|!=)\s*"([^"]*)"|reason: (\w+)`)
	for _, path := range []string{filepath.Join(component, "prometheusrule.yaml"), "../../charts/converge/files/alerts.yaml", "rules_test.yaml"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range matcher.FindAllStringSubmatch(string(b), -1) {
			for _, r := range strings.Split(m[1]+m[2], "|") {
				n++
				if !conditions[r] {
					t.Errorf("%s names reason %q, which no volume's condition has", path, r)
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
	rules, err := os.ReadFile(filepath.Join(component, "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`alert: (\w+)`).FindAllStringSubmatch(string(rules), -1) {
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

// emittedReasons reads, from the plugin's source, the reasons converge
// gives: a volume's condition reasons (csi-node: the reconciler, the node
// server, the state package) and converge-controller's event reasons
// (pkg/nodeloss). A reason is a string literal given as one: a constant
// named Reason* or of type Reason, a value set to a field Reason, the
// first argument of a function whose first parameter is named reason (or
// of a variable bound to one), or the first result a function with a
// first result named reason returns.
func emittedReasons(t *testing.T) (conditions, events map[string]bool) {
	conditions, events = map[string]bool{}, map[string]bool{}
	for dir, into := range map[string]map[string]bool{
		"../../pkg/reconciler": conditions, "../../pkg/nodeserver": conditions, "../../pkg/state": conditions,
		"../../pkg/nodeloss": events,
	} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			reasonsIn(f, into)
		}
	}
	return conditions, events
}

// reasonsIn adds to into the reasons file f gives (see emittedReasons).
func reasonsIn(f *ast.File, into map[string]bool) {
	lit := func(e ast.Expr) {
		if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
			if s, err := strconv.Unquote(b.Value); err == nil && s != "" {
				into[s] = true
			}
		}
	}
	firstNamed := func(fl *ast.FieldList) bool {
		return fl != nil && len(fl.List) > 0 && len(fl.List[0].Names) > 0 && fl.List[0].Names[0].Name == "reason"
	}
	// The functions taking a reason first, and the variables bound to
	// them (staging := abnormal), to a fixed point.
	givers := map[string]bool{}
	for changed := true; changed; {
		changed = false
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if firstNamed(n.Type.Params) && !givers[n.Name.Name] {
					givers[n.Name.Name], changed = true, true
				}
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					id, ok := n.Lhs[min(i, len(n.Lhs)-1)].(*ast.Ident)
					if !ok || givers[id.Name] {
						continue
					}
					fl, isLit := rhs.(*ast.FuncLit)
					src, isIdent := rhs.(*ast.Ident)
					if isLit && firstNamed(fl.Type.Params) || isIdent && givers[src.Name] {
						givers[id.Name], changed = true, true
					}
				}
			}
			return true
		})
	}
	var results []*ast.FieldList // the result lists of the enclosing functions
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			results = append(results, n.Type.Results)
			if n.Body != nil {
				ast.Inspect(n.Body, visit)
			}
			results = results[:len(results)-1]
			return false
		case *ast.FuncLit:
			results = append(results, n.Type.Results)
			ast.Inspect(n.Body, visit)
			results = results[:len(results)-1]
			return false
		case *ast.ValueSpec:
			typed := false
			if id, ok := n.Type.(*ast.Ident); ok && id.Name == "Reason" {
				typed = true
			}
			for i, name := range n.Names {
				if (typed || strings.HasPrefix(name.Name, "Reason")) && i < len(n.Values) {
					lit(n.Values[i])
				}
			}
		case *ast.AssignStmt:
			for i, lhs := range n.Lhs {
				if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "Reason" && len(n.Rhs) == len(n.Lhs) {
					lit(n.Rhs[i])
				}
			}
		case *ast.KeyValueExpr:
			if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Reason" {
				lit(n.Value)
			}
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && givers[id.Name] && len(n.Args) > 0 {
				lit(n.Args[0])
			}
		case *ast.ReturnStmt:
			if len(results) > 0 && firstNamed(results[len(results)-1]) && len(n.Results) > 0 {
				lit(n.Results[0])
			}
		}
		return true
	}
	ast.Inspect(f, visit)
}

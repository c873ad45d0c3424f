package reconciler

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryKindRunsBetweenFailpoints checks that every action kind runs
// through the one call of its run function, and that this call sits
// between the failpoints reconcilerBeforeAction and reconcilerAfterAction:
// so a crash before and after each kind's action is walked by the failpoint
// walk (test/fault), whatever kinds are added. The steps inside an action
// have failpoints of their own (test/fault's TestEveryStepHasAFailpoint).
func TestEveryKindRunsBetweenFailpoints(t *testing.T) {
	for k := range kindCount {
		if s := k.spec(); s.name == "" || s.run == nil {
			t.Errorf("action kind %d has no entry in kinds (name %q, run set %v)", k, s.name, s.run != nil)
		}
	}

	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	type site struct {
		pos    token.Pos
		before bool
		after  bool
	}
	var sites []site
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		failpoint := func(name string, from, to token.Pos) bool {
			for _, cg := range f.Comments {
				for _, c := range cg.List {
					if c.Text == "// gofail: var "+name+" struct{}" && c.Pos() > from && c.Pos() < to {
						return true
					}
				}
			}
			return false
		}
		// Each call of a function named run, with the function literal
		// or declaration around it.
		var stack []ast.Node
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			stack = append(stack, n)
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := c.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "run" {
				return true
			}
			var body *ast.BlockStmt
			for i := len(stack) - 1; i >= 0 && body == nil; i-- {
				switch fn := stack[i].(type) {
				case *ast.FuncLit:
					body = fn.Body
				case *ast.FuncDecl:
					body = fn.Body
				}
			}
			sites = append(sites, site{
				pos:    c.Pos(),
				before: failpoint("reconcilerBeforeAction", body.Pos(), c.Pos()),
				after:  failpoint("reconcilerAfterAction", c.End(), body.End()),
			})
			return true
		})
	}
	if len(sites) != 1 {
		var at []string
		for _, s := range sites {
			at = append(at, fset.Position(s.pos).String())
		}
		t.Fatalf("an action kind's run is called at %v, want at one place only (startOp), between the failpoints", at)
	}
	if s := sites[0]; !s.before || !s.after {
		t.Errorf("%s: run is called with the failpoint reconcilerBeforeAction before it %v, reconcilerAfterAction after it %v; want both", fset.Position(s.pos), s.before, s.after)
	}
}

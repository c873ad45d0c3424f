package contract

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"testing"
)

// TestReasonsListsEveryReason fails when a Reason constant is missing from Reasons,
// or listed twice or out of order: the alert and runbook checks
// (test/monitoring) read Reasons, so a reason left out of it could be named
// by no alert and missing from the runbook without any test noticing.
func TestReasonsListsEveryReason(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "reasons.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []Reason
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			spec := s.(*ast.ValueSpec)
			if typ, ok := spec.Type.(*ast.Ident); !ok || typ.Name != "Reason" {
				continue
			}
			for i, name := range spec.Names {
				lit, ok := spec.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("reason %s is not a string literal", name.Name)
				}
				v, _ := strconv.Unquote(lit.Value)
				if v != name.Name {
					t.Errorf("reason %s is spelled %q: a reason's value is its name", name.Name, v)
				}
				declared = append(declared, Reason(v))
			}
		}
	}
	if len(declared) == 0 {
		t.Fatal("found no Reason constant in reasons.go: the test no longer reads it")
	}
	if !slices.Equal(Reasons(), declared) {
		t.Errorf("got Reasons %v, want every Reason constant once, in the order declared: %v", Reasons(), declared)
	}
}

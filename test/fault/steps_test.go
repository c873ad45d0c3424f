package fault

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/converge-csi/converge/test/testenv"
)

// steps are, per package, the calls that change what survives a crash of
// the plugin: a write to the disk that is synced, or kernel state (a loop
// device, a mount, a frozen filesystem), or a record of the store. A call
// is named by its selector (the method or function name), or by its
// receiver and selector where the name alone is ambiguous.
var steps = map[string][]string{
	"pkg/state": {
		"unix.Pwrite", "unix.Fdatasync", "l.checkpoint", "s.log.append", "s.log.sync",
	},
	"pkg/reconciler": {
		"Loops.Attach", "Loops.Detach", "Loops.Grow", "Loops.SetDiscards", "Loops.KeepDevice",
		"Filesystems.FormatAndMount", "Filesystems.BindMount", "Filesystems.BindDevice", "Filesystems.Unmount", "Filesystems.UnmountOwned",
		"Filesystems.Resize", "Filesystems.GrowUnmounted",
		"Store.Update", "Store.UpdateUnsynced", "home.GrowImage", "home.Take",
		"Paths.Freeze", "Paths.Thaw", "Paths.Remove", "Paths.Mkdir",
		"r.recordKernelState", "r.recordMount", "r.recordFormatted", "r.clearFrozen", "r.stageDevice", "r.stage",
		"Throttler.SetThrottle",
	},
	"pkg/devices": {
		"unix.Renameat2", "syncDir", "os.Remove", "tmp.Sync", "f.Sync",
	},
	"pkg/controller": {
		"pr.Record", "pr.MakeImage", "pr.StartRestore", "pr.Remove", "c.deleteWithin", "c.store.Update",
	},
	"pkg/pool": {
		"pr.unrecord", "p.images.Delete", "p.store.Update",
	},
}

// sources parses, with their comments, the non-test Go files of dir
// (relative to the repository's root).
func sources(t *testing.T, dir string) (*token.FileSet, []*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(testenv.Root(), dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return fset, files
}

// gap is two steps of one function with no failpoint between them.
type gap struct{ at, first, second string }

// gaps returns, for the non-test files of dir (relative to the
// repository's root), each pair of consecutive steps in a function's
// source with no failpoint between them.
func gaps(t *testing.T, dir string, names []string) []gap {
	t.Helper()
	fset, files := sources(t, dir)
	var out []gap
	for _, f := range files {
		var failpoints []token.Pos
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if strings.HasPrefix(c.Text, "// gofail: var ") {
					failpoints = append(failpoints, c.Pos())
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				body = fn.Body
			case *ast.FuncLit:
				body = fn.Body
			}
			if body == nil {
				return true
			}
			type call struct {
				name string
				pos  token.Pos
				// blocks are the blocks around the call, innermost first.
				blocks []ast.Node
			}
			var calls []call
			var stack []ast.Node
			ast.Inspect(body, func(m ast.Node) bool {
				if m == nil {
					stack = stack[:len(stack)-1]
					return true
				}
				switch m.(type) {
				case *ast.FuncLit:
					return false // its own function
				case *ast.DeferStmt:
					return false // a clean-up, not a step
				}
				stack = append(stack, m)
				c, ok := m.(*ast.CallExpr)
				if !ok {
					return true
				}
				if name := callName(c.Fun); name != "" && slices.ContainsFunc(names, func(s string) bool { return name == s || strings.HasSuffix(name, "."+s) }) {
					var blocks []ast.Node
					for i := len(stack) - 1; i >= 0; i-- {
						switch stack[i].(type) {
						case *ast.BlockStmt, *ast.CaseClause:
							blocks = append(blocks, stack[i])
						}
					}
					calls = append(calls, call{name, c.Pos(), blocks})
				}
				return true
			})
			// follows reports whether b can run after a: not when a block
			// around a that b is outside of always returns.
			follows := func(a, b call) bool {
				for _, blk := range a.blocks {
					if blk.Pos() <= b.pos && b.pos < blk.End() {
						return true
					}
					var list []ast.Stmt
					switch x := blk.(type) {
					case *ast.BlockStmt:
						list = x.List
					case *ast.CaseClause:
						list = x.Body
					}
					if len(list) > 0 {
						if _, ok := list[len(list)-1].(*ast.ReturnStmt); ok {
							return false
						}
					}
				}
				return true
			}
			for i := 1; i < len(calls); i++ {
				a, b := calls[i-1], calls[i]
				if follows(a, b) && !slices.ContainsFunc(failpoints, func(p token.Pos) bool { return p > a.pos && p < b.pos }) {
					out = append(out, gap{fset.Position(b.pos).String(), a.name, b.name})
				}
			}
			return true
		})
	}
	return out
}

// callName is the dotted name of a called function: "unix.Pwrite",
// "r.cfg.Loops.Attach", "syncDir".
func callName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		if p := callName(x.X); p != "" {
			return p + "." + x.Sel.Name
		}
	}
	return ""
}

// TestEveryStepHasAFailpoint fails when two steps of an operation (see
// steps) follow each other in a function with no failpoint between them:
// a crash there would be walked by no trial.
func TestEveryStepHasAFailpoint(t *testing.T) {
	for dir, names := range steps {
		for _, g := range gaps(t, dir, names) {
			t.Errorf("%s: %s follows %s with no failpoint between them; add one (docs/testing.md says how)", g.at, g.second, g.first)
		}
	}
}

// durableWrites are the functions of pkg/state that write the store's
// records to the disk, with the failpoints each must hold; notDurable are
// those that write to the disk and hold no record, or whose failpoints sit
// around their calls, and why.
var (
	durableWrites = map[string][]string{
		"append":           {"stateLogBeforeWrite"},
		"UpdateUnsynced":   {"stateLogAfterWrite"},
		"sync":             {"stateLogAfterSync"},
		"checkpointLocked": {"stateCheckpointBeforeCommit", "stateCheckpointAfterCommit"},
	}
	notDurable = map[string]string{
		"commit":  "bbolt's transaction of a checkpoint: the failpoints of checkpointLocked are around its call",
		"load":    "marks the schema at Open, before a record is read or written",
		"Close":   "marks the schema clean after Close's checkpoint, which stateCheckpoint* cover",
		"prepare": "zero-fills the log's unused space at Open: it holds no record",
		"syncDir": "makes a new log file's name durable at Open, before any record",
	}
	// diskWrites are the calls that make something durable.
	diskWrites = []string{"unix.Pwrite", "unix.Fdatasync", "unix.Fsync", "db.Update", "Sync", "l.checkpoint", "s.log.append"}
)

// TestEveryDurableWriteHasAFailpoint fails when a function of the store
// writes to the disk and is neither in durableWrites (holding its
// failpoints) nor in notDurable.
func TestEveryDurableWriteHasAFailpoint(t *testing.T) {
	fset, files := sources(t, filepath.Join("pkg", "state"))
	seen := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			writes := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					name := callName(c.Fun)
					writes = writes || slices.ContainsFunc(diskWrites, func(s string) bool { return name == s || strings.HasSuffix(name, "."+s) })
				}
				return true
			})
			if !writes {
				continue
			}
			name := fn.Name.Name
			seen[name] = true
			want, ok := durableWrites[name]
			if !ok {
				if _, ok := notDurable[name]; !ok {
					t.Errorf("%s: %s writes to the disk and is in neither durableWrites (with the failpoints it holds) nor notDurable (with why it needs none)", fset.Position(fn.Pos()), name)
				}
				continue
			}
			for _, fp := range want {
				found := false
				for _, cg := range f.Comments {
					for _, c := range cg.List {
						found = found || c.Text == "// gofail: var "+fp+" struct{}" && c.Pos() > fn.Pos() && c.Pos() < fn.End()
					}
				}
				if !found {
					t.Errorf("%s: %s has no failpoint %s", fset.Position(fn.Pos()), name, fp)
				}
			}
		}
	}
	for name := range durableWrites {
		if !seen[name] {
			t.Errorf("durableWrites names %s, which writes nothing to the disk (or is gone)", name)
		}
	}
	for name := range notDurable {
		if !seen[name] {
			t.Errorf("notDurable names %s, which writes nothing to the disk (or is gone)", name)
		}
	}
}

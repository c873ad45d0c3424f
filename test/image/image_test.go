// Package image checks the container image against the code: every OS tool
// that csi-node or mount-utils executes must be installed by the final stage
// of the Dockerfile (as test/dockerfile reads it, the e2e harness's reader).
package image

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/test/dockerfile"
)

// parameters are command names that arrive as a function parameter, mapped
// to the package-level constant every caller passes: mount-utils' doMount
// gets mountCmd = defaultMountCommand, since converge builds its mounter with
// an empty mounterPath (mount.NewWithoutSystemd("")).
var parameters = map[string]string{"mountCmd": "defaultMountCommand"}

// optional are tools run only when present: mount-utils runs systemd-run
// only when exec.LookPath finds it, and the image has no systemd.
var optional = map[string]bool{"systemd-run": true}

func TestImageInstallsEveryExecutedTool(t *testing.T) {
	tools := executedTools(t)
	for _, want := range []string{"mount", "umount", "blkid", "mkfs.ext4", "fsck", "resize2fs", "xfs_growfs", "e2fsck"} {
		if !tools[want] {
			t.Fatalf("the scan missed %s; it found %v", want, sorted(tools))
		}
	}
	d, err := dockerfile.Read("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	installed := d.Packages
	owners := toolPackages(t, tools)
	if miss := missing(owners, installed); len(miss) > 0 {
		t.Fatalf("Dockerfile's final stage installs %v but not:\n%s", installed, strings.Join(miss, "\n"))
	}
	t.Logf("%d tools, from packages %v", len(owners), installed)

	// The check can fail: drop any one package and a tool goes missing.
	for _, p := range installed {
		fewer := slices.DeleteFunc(slices.Clone(installed), func(q string) bool { return q == p })
		if len(missing(owners, fewer)) == 0 {
			t.Errorf("package %s is installed but no executed tool needs it", p)
		}
	}
}

// missing lists the tools whose package is not among installed.
func missing(owners map[string]string, installed []string) []string {
	var out []string
	for tool, pkg := range owners {
		if !slices.Contains(installed, pkg) {
			out = append(out, fmt.Sprintf("  %s (package %s)", tool, pkg))
		}
	}
	sort.Strings(out)
	return out
}

// executedTools finds the commands run by converge's own packages and by
// mount-utils: the first argument of every Command call, resolved to a
// name. A command it cannot name fails the test, so a new tool cannot slip in
// unseen.
func executedTools(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/mount-utils").Output()
	if err != nil {
		t.Fatalf("go list mount-utils: %v", err)
	}
	dirs := []string{strings.TrimSpace(string(out))}
	for _, root := range []string{"../../pkg", "../../cmd"} {
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return err
		})
	}
	tools := map[string]bool{}
	for _, dir := range dirs {
		scanDir(t, dir, tools)
	}
	// fsck runs fsck.<type> of the filesystem it checks.
	if tools["fsck"] {
		for _, fs := range host.FsTypes() {
			tools["fsck."+fs] = true
		}
	}
	for tool := range optional {
		delete(tools, tool)
	}
	return tools
}

// imageArchs are the architectures the image is built for (the
// Dockerfile's multi-arch build): a file built for any of them may run a
// tool.
var imageArchs = []string{"amd64", "arm64"}

// scanDir adds the commands of the non-test Go files of one package that
// the image's builds compile: Linux, each of imageArchs, CGO_ENABLED=0.
func scanDir(t *testing.T, dir string, tools map[string]bool) {
	t.Helper()
	built := func(name string) bool {
		for _, arch := range imageArchs {
			ctx := build.Default
			ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = "linux", arch, false
			if ok, err := ctx.MatchFile(dir, name); err == nil && ok {
				return true
			}
		}
		return false
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	consts := map[string]string{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		if !built(name) {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		// Package-level names bound to a string literal (mountCmd, blockDev).
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok {
				for _, s := range g.Specs {
					if v, ok := s.(*ast.ValueSpec); ok {
						for i, n := range v.Names {
							if i < len(v.Values) {
								if s, ok := literal(v.Values[i]); ok {
									consts[n.Name] = s
								}
							}
						}
					}
				}
			}
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			// An exec wrapper's own Command forwards what its callers
			// name (devices' ctxExec, under mount-utils' calls, which
			// are scanned in their own package).
			if fd, ok := n.(*ast.FuncDecl); ok && fd.Recv != nil && fd.Name.Name == "Command" {
				return false
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Command" && sel.Sel.Name != "CommandContext") || len(call.Args) == 0 {
				return true
			}
			arg := call.Args[0]
			if sel.Sel.Name == "CommandContext" && len(call.Args) > 1 {
				arg = call.Args[1]
			}
			names, ok := commandNames(arg, consts)
			if !ok {
				t.Errorf("%s: cannot tell which tool this runs", fset.Position(call.Pos()))
			}
			for _, name := range names {
				tools[name] = true
			}
			return true
		})
	}
}

// commandNames resolves a command argument: a literal, a package-level
// constant, or "mkfs."+fstype for every supported filesystem.
func commandNames(e ast.Expr, consts map[string]string) ([]string, bool) {
	if s, ok := literal(e); ok {
		return []string{s}, true
	}
	switch e := e.(type) {
	case *ast.Ident:
		if s, ok := consts[e.Name]; ok {
			return []string{s}, true
		}
		if s, ok := consts[parameters[e.Name]]; ok {
			return []string{s}, true
		}
	case *ast.BinaryExpr:
		if prefix, ok := literal(e.X); ok && e.Op == token.ADD && prefix == "mkfs." {
			var names []string
			for _, fs := range host.FsTypes() {
				names = append(names, prefix+fs)
			}
			return names, true
		}
	}
	return nil, false
}

func literal(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// toolPackages maps each tool to the Debian package that ships it on this
// machine (make deps installs them all).
func toolPackages(t *testing.T, tools map[string]bool) map[string]string {
	t.Helper()
	owners := map[string]string{}
	for tool := range tools {
		path, err := exec.LookPath(tool)
		if err != nil {
			t.Errorf("%s is executed but not installed here (make deps): %v", tool, err)
			continue
		}
		pkg, err := dpkgOwner(path)
		if err != nil {
			t.Errorf("%s: %v", tool, err)
			continue
		}
		owners[tool] = pkg
	}
	return owners
}

// dpkgOwner asks dpkg which package ships path, trying the /usr and the
// root spelling (Debian's merged /usr records either).
func dpkgOwner(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	var tries []string
	for _, p := range []string{path, real} {
		tries = append(tries, p)
		if rest, ok := strings.CutPrefix(p, "/usr"); ok {
			tries = append(tries, rest)
		} else {
			tries = append(tries, "/usr"+p)
		}
	}
	for _, p := range tries {
		out, err := exec.Command("dpkg", "-S", p).Output()
		if err != nil {
			continue
		}
		line, _, _ := strings.Cut(string(out), "\n")
		pkg, _, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		pkg, _, _ = strings.Cut(pkg, ":") // drop an architecture
		return pkg, nil
	}
	return "", fmt.Errorf("no package ships %s (tried %v)", path, tries)
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

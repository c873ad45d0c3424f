package failpoints

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.etcd.io/gofail/code"
)

// Failpoint is a named failpoint of the source: a `// gofail: var <Name>
// struct{}` comment, which is code only in the binary Build builds.
type Failpoint struct {
	// Name is the failpoint's name, as GOFAIL_FAILPOINTS and gofail's HTTP
	// endpoint take it.
	Name string
	// File is its file, relative to the repository's root.
	File string
}

// List lists the failpoints of the source tree at root that csi-node is
// built from (its non-test Go files under cmd/ and pkg/), sorted by name.
// It writes gofail's rewrite of their files under dir, which it makes if
// it is missing.
func List(root, dir string) ([]Failpoint, error) {
	_, fps, err := rewrite(root, dir)
	return fps, err
}

// overlay is what rewrite gathers: go build's -overlay replacements and
// the failpoints, each name with the file that holds it.
type overlay struct {
	dir     string
	replace map[string]string
	all     []Failpoint
	seen    map[string]string
}

// rewrite writes, under dir, gofail's rewrite of every non-test Go file of
// cmd/ and pkg/ under root that holds a failpoint and the bindings of its
// package, and the overlay file (returned) that puts them in place of the
// checkout's files for go build.
func rewrite(root, dir string) (string, []Failpoint, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return "", nil, err
	}
	o := &overlay{dir: dir, replace: map[string]string{}, seen: map[string]string{}}
	for _, d := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			return o.add(path, rel)
		})
		if err != nil {
			return "", nil, err
		}
	}
	slices.SortFunc(o.all, func(a, b Failpoint) int { return strings.Compare(a.Name, b.Name) })
	b, err := json.Marshal(map[string]any{"Replace": o.replace})
	if err != nil {
		return "", nil, err
	}
	file := filepath.Join(dir, "overlay.json")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	return file, o.all, os.WriteFile(file, b, 0o600)
}

// add rewrites the Go file at path (rel from the root), if it holds a
// failpoint: it writes the rewrite and its package's bindings to o.dir and
// puts them in o.replace. A failpoint name found in two files is an error:
// gofail's endpoint names failpoints alone.
func (o *overlay) add(path, rel string) error {
	src, err := os.ReadFile(path)
	if err != nil || !bytes.Contains(src, []byte("// gofail:")) {
		return err
	}
	var out bytes.Buffer
	fps, err := code.ToFailpoints(&out, bytes.NewReader(src))
	if err != nil {
		return fmt.Errorf("gofail rewriting %s: %w", path, err)
	}
	if len(fps) == 0 {
		return nil
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.PackageClauseOnly)
	if err != nil {
		return err
	}
	var bind bytes.Buffer
	if err := code.NewBinding(f.Name.Name, fps).Write(&bind); err != nil {
		return err
	}
	for _, fp := range fps {
		if other, dup := o.seen[fp.Name()]; dup {
			return fmt.Errorf("failpoint %s is in both %s and %s: names must be unique", fp.Name(), other, rel)
		}
		o.seen[fp.Name()] = rel
		o.all = append(o.all, Failpoint{Name: fp.Name(), File: rel})
	}
	flat := strings.ReplaceAll(rel, "/", "_")
	bindings := strings.TrimSuffix(flat, ".go") + ".fail.go"
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return err
	}
	for name, content := range map[string][]byte{flat: out.Bytes(), bindings: bind.Bytes()} {
		if err := os.WriteFile(filepath.Join(o.dir, name), content, 0o600); err != nil {
			return err
		}
	}
	o.replace[path] = filepath.Join(o.dir, flat)
	o.replace[strings.TrimSuffix(path, ".go")+".fail.go"] = filepath.Join(o.dir, bindings)
	return nil
}

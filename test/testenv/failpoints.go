package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/gofail/code"
)

// Failpoint is a named failpoint of the source: a `// gofail: var <Name>
// struct{}` comment, which is code only in the binary FailpointBinary
// builds.
type Failpoint struct {
	// Name is the failpoint's name, as GOFAIL_FAILPOINTS and gofail's HTTP
	// endpoint take it.
	Name string
	// File is its file, relative to the repository's root.
	File string
}

var (
	failpointOnce   sync.Once
	failpointBinary string
	failpoints      []Failpoint
	failpointErr    error
)

// Root returns the repository's root directory.
func Root() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..")
}

// Failpoints lists the failpoints of the source that csi-node is built
// from (its non-test Go files under cmd/ and pkg/), sorted by name.
func Failpoints(t testing.TB) []Failpoint {
	t.Helper()
	_, fps, err := rewriteFailpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return fps
}

// FailpointBinary returns a csi-node built from this tree with its
// failpoints enabled, and the failpoints. The checkout is not touched:
// gofail's rewrite of each file that holds failpoints, and the runtime
// bindings it adds, reach the compiler through go build -overlay. The
// binary is cached in the user's cache directory under a hash of the
// source it was built from (every file of the module's cmd/ and pkg/, and
// go.mod and go.sum), so only a change of the source builds it again.
func FailpointBinary(t testing.TB) (string, []Failpoint) {
	t.Helper()
	failpointOnce.Do(func() {
		failpointBinary, failpoints, failpointErr = buildFailpointBinary()
	})
	if failpointErr != nil {
		t.Fatal(failpointErr)
	}
	return failpointBinary, failpoints
}

func buildFailpointBinary() (string, []Failpoint, error) {
	root := Root()
	key, err := sourceHash(root)
	if err != nil {
		return "", nil, err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", nil, err
	}
	dir := filepath.Join(cache, "converge", "failpoints", key+"-"+BuildTags)
	bin := filepath.Join(dir, "csi-node")
	overlay, fps, err := rewriteFailpoints(filepath.Join(dir, "overlay"))
	if err != nil {
		return "", nil, err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, fps, nil
	}
	// Earlier source states' binaries are of no more use.
	old, _ := filepath.Glob(filepath.Join(cache, "converge", "failpoints", "*"))
	for _, o := range old {
		if o != dir {
			os.RemoveAll(o)
		}
	}
	tmp := bin + fmt.Sprintf(".%d", os.Getpid())
	cmd := exec.Command("go", "build", "-tags", BuildTags, "-overlay", overlay, "-o", tmp, "./cmd/csi-node")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("building csi-node with failpoints: %v\n%s", err, out)
	}
	return bin, fps, os.Rename(tmp, bin)
}

// sourceHash hashes what the csi-node binary is built from.
func sourceHash(root string) (string, error) {
	h := sha256.New()
	files := []string{"go.mod", "go.sum"}
	for _, d := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// rewriteFailpoints writes, under dir, gofail's rewrite of every non-test
// Go file of cmd/ and pkg/ that holds a failpoint and the bindings of its
// package, and the overlay file (returned) that puts them in place of the
// checkout's files for go build.
func rewriteFailpoints(dir string) (string, []Failpoint, error) {
	root, err := filepath.Abs(Root())
	if err != nil {
		return "", nil, err
	}
	replace := map[string]string{}
	var all []Failpoint
	seen := map[string]string{}
	for _, d := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
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
			rel, _ := filepath.Rel(root, path)
			f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			var bind bytes.Buffer
			if err := code.NewBinding(f.Name.Name, fps).Write(&bind); err != nil {
				return err
			}
			for _, fp := range fps {
				if other, dup := seen[fp.Name()]; dup {
					return fmt.Errorf("failpoint %s is in both %s and %s: names must be unique", fp.Name(), other, rel)
				}
				seen[fp.Name()] = rel
				all = append(all, Failpoint{Name: fp.Name(), File: rel})
			}
			flat := strings.ReplaceAll(rel, "/", "_")
			for name, content := range map[string][]byte{flat: out.Bytes(), strings.TrimSuffix(flat, ".go") + ".fail.go": bind.Bytes()} {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
					return err
				}
			}
			replace[path] = filepath.Join(dir, flat)
			replace[strings.TrimSuffix(path, ".go")+".fail.go"] = filepath.Join(dir, strings.TrimSuffix(flat, ".go")+".fail.go")
			return nil
		})
		if err != nil {
			return "", nil, err
		}
	}
	slices.SortFunc(all, func(a, b Failpoint) int { return strings.Compare(a.Name, b.Name) })
	b, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", nil, err
	}
	overlay := filepath.Join(dir, "overlay.json")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	return overlay, all, os.WriteFile(overlay, b, 0o600)
}

// Package arch holds the design's dependency rules as a test: which of the
// plugin's packages may import which, so that no arrow runs back up.
package arch

import (
	"bytes"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/converge-csi/converge/"

// allowed lists, for every package of the plugin, the packages of the
// plugin it may import (its tests aside). The direction is the design's:
// nodeserver -> state <- reconciler -> devices; host and status are leaves
// every layer may read, and capacity (pure accounting) a leaf the
// controller, the reconciler and the driver use; driver wires everything;
// the command sees only the driver and the status it prints; rpcerr, the
// table from a failure's kind to its gRPC code, only the driver applies.
// contract, the published names and the request rules, is the leaf the
// node server, the controller, the store and the cluster side all read: it
// builds on the host and classified leaves alone (TestContractIsALeaf),
// and the controller reads the request rules there, not in the node
// server. classified, the classified errors every layer answers with and
// rpcerr maps to codes, imports nothing of converge, so that the contract
// answers with them without the store. Its condition reasons are read by
// the store (it carries a reason in a volume's condition) and the
// reconciler (which decides them).
// pool, the node's storage pools (their images, snapshots, restores and
// capacity promise), sits below both the controller and the reconciler,
// which reach it each on its own: it builds on devices, capacity and the
// store's types, and reaches neither of them back, so that a snapshot's
// round trip (controller -> nodeserver -> state <- reconciler -> pool ->
// devices) runs one way down.
// httpserve, the bounds of an HTTP address on the pod network, is a leaf
// the driver and the cluster-side command share. locks, where every mutex
// of the node plugin comes from (go-deadlock's in a lockorder build), is
// a leaf of the packages that hold one. claim, the one way the
// reconciler takes a volume for an operation, is the reconciler's own
// leaf on locks.
// The cluster-side controller (nodeloss, snaplabel, classagent and their
// command) stands apart: no part of the node plugin reaches it, and it
// reaches none but the published contract; snaplabel and classagent read a
// volume's node by nodeloss's rule.
var allowed = map[string][]string{
	"cmd/csi-node":            {"pkg/buildinfo", "pkg/driver", "pkg/volstatus"},
	"cmd/converge-controller": {"pkg/buildinfo", "pkg/classagent", "pkg/contract", "pkg/httpserve", "pkg/nodeloss", "pkg/snaplabel"},
	"pkg/classagent":          {"pkg/contract", "pkg/nodeloss"},
	"pkg/buildinfo":           nil,
	"pkg/nodeloss":            {"pkg/contract"},
	"pkg/snaplabel":           {"pkg/contract", "pkg/nodeloss"},
	"pkg/driver":              {"pkg/capacity", "pkg/classified", "pkg/contract", "pkg/controller", "pkg/devices", "pkg/httpserve", "pkg/metrics", "pkg/nodeserver", "pkg/pool", "pkg/reconciler", "pkg/rpcerr", "pkg/state", "pkg/volstatus", "pkg/locks"},
	"pkg/controller":          {"pkg/classified", "pkg/contract", "pkg/contract/capability", "pkg/devices", "pkg/host", "pkg/pool", "pkg/state", "pkg/volstatus", "pkg/locks"},
	"pkg/pool":                {"pkg/capacity", "pkg/classified", "pkg/contract", "pkg/devices", "pkg/host", "pkg/state", "pkg/volstatus", "pkg/locks"},
	"pkg/nodeserver":          {"pkg/classified", "pkg/contract", "pkg/contract/capability", "pkg/host", "pkg/state"},
	"pkg/contract":            {"pkg/classified", "pkg/host"},
	"pkg/contract/capability": {"pkg/contract", "pkg/host"},
	"pkg/rpcerr":              {"pkg/classified"},
	"pkg/reconciler":          {"pkg/capacity", "pkg/classified", "pkg/contract", "pkg/devices", "pkg/host", "pkg/pool", "pkg/state", "pkg/volstatus", "pkg/locks", "pkg/reconciler/claim"},
	"pkg/reconciler/claim":    {"pkg/locks"},
	"pkg/devices":             {"pkg/host", "pkg/locks"},
	"pkg/metrics":             {"pkg/volstatus"},
	"pkg/state":               {"pkg/classified", "pkg/contract", "pkg/host", "pkg/locks"},
	"pkg/classified":          nil,
	"pkg/host":                nil,
	"pkg/volstatus":           nil,
	"pkg/capacity":            nil,
	"pkg/httpserve":           nil,
	"pkg/locks":               nil,
}

// only lists outside modules that some packages alone may import: the
// store is the only place that knows bbolt, and csi-node never calls the
// Kubernetes API: only the cluster-side controller knows its client and
// types.
var only = map[string][]string{
	"go.etcd.io/bbolt": {"pkg/state"},
	// go-deadlock only in the lockorder build of pkg/locks.
	"github.com/sasha-s/go-deadlock": {"pkg/locks"},
	"k8s.io/client-go":               {"cmd/converge-controller", "pkg/classagent", "pkg/nodeloss", "pkg/snaplabel"},
	"k8s.io/api":                     {"cmd/converge-controller", "pkg/classagent", "pkg/nodeloss", "pkg/snaplabel"},
	"k8s.io/apimachinery":            {"cmd/converge-controller", "pkg/classagent", "pkg/nodeloss", "pkg/snaplabel"},
}

// never lists, after the design card, what a package must not import: the
// store neither gRPC nor exec, the reconciler answers no RPC, the device
// layer knows nothing of CSI.
var never = map[string][]string{
	"pkg/state":      {"google.golang.org/grpc", "github.com/container-storage-interface/spec", "os/exec", "k8s.io/utils/exec"},
	"pkg/reconciler": {"google.golang.org/grpc", "github.com/container-storage-interface/spec"},
	"pkg/pool":       {"google.golang.org/grpc", "github.com/container-storage-interface/spec"},
	"pkg/devices":    {"google.golang.org/grpc", "github.com/container-storage-interface/spec"},
	"pkg/host":       {"google.golang.org/grpc", "github.com/container-storage-interface/spec", "os/exec"},
	"pkg/volstatus":  {"google.golang.org/grpc", "github.com/container-storage-interface/spec"},
	"pkg/capacity":   {"google.golang.org/grpc", "github.com/container-storage-interface/spec", "os", "golang.org/x/sys/unix"},
	"pkg/contract":   {"google.golang.org/grpc", "github.com/container-storage-interface/spec", "os", "os/exec", "k8s.io/utils/exec", "golang.org/x/sys/unix"},
	"pkg/classified": {"google.golang.org/grpc", "github.com/container-storage-interface/spec", "os", "os/exec", "golang.org/x/sys/unix"},
}

func TestImportArrows(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	imports := map[string]map[string]bool{}
	for _, top := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			pkg, _ := filepath.Rel(root, filepath.Dir(path))
			if imports[pkg] == nil {
				imports[pkg] = map[string]bool{}
			}
			for _, spec := range f.Imports {
				p, _ := strconv.Unquote(spec.Path.Value)
				imports[pkg][p] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for pkg, deps := range imports {
		may, known := allowed[pkg]
		if !known {
			t.Errorf("%s is a package the design does not place: add it to allowed with the imports it may have", pkg)
			continue
		}
		for dep := range deps {
			if inner, ok := strings.CutPrefix(dep, module); ok && !slices.Contains(may, inner) {
				t.Errorf("%s imports %s: an arrow the design does not allow", pkg, inner)
			}
			for _, mod := range never[pkg] {
				if dep == mod || strings.HasPrefix(dep, mod+"/") {
					t.Errorf("%s imports %s, which the design forbids it", pkg, dep)
				}
			}
			for mod, owners := range only {
				if (dep == mod || strings.HasPrefix(dep, mod+"/")) && !slices.Contains(owners, pkg) {
					t.Errorf("%s imports %s, which only %s may", pkg, dep, strings.Join(owners, " and "))
				}
			}
		}
	}
	for pkg := range allowed {
		if imports[pkg] == nil {
			t.Errorf("%s is in allowed but has no source: remove it", pkg)
		}
	}
}

// TestContractIsALeaf checks the whole of the published contract's build,
// not only its own imports: of converge it links the host and classified
// leaves alone, so that every package, and
// converge-controller, may read the names without taking on the node
// plugin.
func TestContractIsALeaf(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../pkg/contract").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if inner, ok := strings.CutPrefix(p, module); ok && !slices.Contains([]string{"pkg/classified", "pkg/contract", "pkg/host"}, inner) {
			t.Errorf("pkg/contract links %s", inner)
		}
	}
}

// TestModelLinksNoRPC checks the whole of the builds of the store, the
// reconciler and the contract they read, not only their own imports (which
// never checks): none links gRPC or the CSI spec, so that the desired
// state, its transitions and the reasons stay free of the wire; the rule
// for a CSI capability is contract/capability's, which only the node
// server and the controller read.
func TestModelLinksNoRPC(t *testing.T) {
	for _, pkg := range []string{"pkg/state", "pkg/reconciler", "pkg/contract"} {
		out, err := exec.Command("go", "list", "-deps", "../../"+pkg).Output()
		if err != nil {
			t.Fatal(err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, module+pkg) {
			t.Fatalf("go list -deps %s does not list %s itself: %q", pkg, pkg, out)
		}
		for _, p := range deps {
			for _, mod := range []string{"google.golang.org/grpc", "github.com/container-storage-interface/spec"} {
				if p == mod || strings.HasPrefix(p, mod+"/") {
					t.Errorf("%s links %s", pkg, p)
				}
			}
		}
	}
}

// TestConvergeControllerLinksNoStore checks the whole of
// converge-controller's build: it reads the published names, and must not
// take the node plugin's store (pkg/state and bbolt) with them; a cluster
// command has no records to keep.
func TestConvergeControllerLinksNoStore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../cmd/converge-controller").Output()
	if err != nil {
		t.Fatal(err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"pkg/contract") {
		t.Fatalf("go list -deps cmd/converge-controller does not list pkg/contract: %q", out)
	}
	for _, p := range deps {
		if p == module+"pkg/state" || strings.HasPrefix(p, module+"pkg/state/") || p == "go.etcd.io/bbolt" || strings.HasPrefix(p, "go.etcd.io/bbolt/") {
			t.Errorf("converge-controller links %s", p)
		}
	}
}

// TestCSINodeLinksNoKubernetesClient checks the whole of csi-node's
// build, not only its own imports: nothing it links may talk to the API
// server.
func TestCSINodeLinksNoKubernetesClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../cmd/csi-node").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "k8s.io/client-go" || strings.HasPrefix(p, "k8s.io/client-go/") {
			t.Errorf("csi-node links %s", p)
		}
	}
}

// TestShippedCommandsLinkNoFailpoints checks that no command links
// gofail's runtime and that no source holds gofail's generated code: the
// failpoints are comments, turned into code only in the walk's own build
// (package test/testenv/failpoints, through -overlay). A stray in-place
// "gofail enable" would leave *.fail.go files and __fp_ code that the
// image's build would ship.
func TestShippedCommandsLinkNoFailpoints(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../cmd/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "go.etcd.io/gofail") {
			t.Errorf("a command links %s", p)
		}
	}
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.Contains(path, "/test/") {
			return nil
		}
		if strings.HasSuffix(path, ".fail.go") || strings.HasSuffix(path, "__failpoint_stash__") {
			t.Errorf("%s is gofail's generated code", path)
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("__fp_")) || bytes.Contains(b, []byte("gofail/runtime")) {
			t.Errorf("%s holds gofail's generated code", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

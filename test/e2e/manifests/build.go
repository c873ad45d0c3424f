package manifests

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/google/go-cmp/cmp"
	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Kustomize builds the kustomization in dir of fsys as kubectl apply -k
// would, into one multi-document manifest.
func Kustomize(fsys filesys.FileSystem, dir string) (string, error) {
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		return "", err
	}
	out, err := res.AsYaml()
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// ClusterScopedUnknownToKustomize are the cluster-scoped kinds that
// kustomize's built-in schema (Kubernetes 1.21's) does not know, so its
// namespace transformer gives them deploy/'s namespace; the API server
// clears the namespace of a cluster-scoped object at create and update.
var ClusterScopedUnknownToKustomize = map[string]bool{
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
}

// Objects parses a multi-document manifest into its objects by
// "kind namespace/name"; fromChart drops Helm's bookkeeping first
// (DropHelmObject), as make manifests does. The kinds of
// ClusterScopedUnknownToKustomize lose their namespace, and the lists of
// named items are sorted by name (SortNamed), so that a chart's rendering
// and a kustomize build of the same objects are equal.
func Objects(manifest string, fromChart bool) (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	for _, doc := range strings.Split(manifest, "\n---") {
		// Strictly: a key given twice, which this decoder would take the
		// last of, is refused by yaml.v3 and so by kustomize as a Helm
		// post-renderer.
		var o map[string]any
		if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
			return nil, fmt.Errorf("%v in:\n%s", err, doc)
		}
		if o == nil {
			continue
		}
		if fromChart {
			DropHelmObject(o)
		}
		meta, _ := o["metadata"].(map[string]any)
		if ClusterScopedUnknownToKustomize[fmt.Sprint(o["kind"])] {
			delete(meta, "namespace")
		}
		SortNamed(o)
		ns, _ := meta["namespace"].(string)
		k := fmt.Sprintf("%s %s/%s", o["kind"], ns, meta["name"])
		if out[k] != nil {
			return nil, fmt.Errorf("%s twice", k)
		}
		out[k] = o
	}
	return out, nil
}

// SortNamed sorts, everywhere in v, the lists whose items are all objects
// with a name (containers, volumes, mounts, ports, env): Kubernetes merges
// them by name, and a kustomize patch puts what it adds at the start.
func SortNamed(v any) {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			SortNamed(e)
		}
	case []any:
		named := len(v) > 0
		for _, e := range v {
			SortNamed(e)
			if m, ok := e.(map[string]any); !ok || m["name"] == nil {
				named = false
			}
		}
		if named {
			sort.SliceStable(v, func(i, j int) bool {
				return fmt.Sprint(v[i].(map[string]any)["name"]) < fmt.Sprint(v[j].(map[string]any)["name"])
			})
		}
	}
}

// combinations are every set of Components, the empty one first.
func combinations() [][]Component {
	var out [][]Component
	for bits := 0; bits < 1<<len(Components); bits++ {
		var set []Component
		for i, c := range Components {
			if bits&(1<<i) != 0 {
				set = append(set, c)
			}
		}
		out = append(out, set)
	}
	return out
}

// comboName names a set of components as the errors do.
func comboName(set []Component) string {
	if len(set) == 0 {
		return "no component"
	}
	var names []string
	for _, c := range set {
		names = append(names, c.Name)
	}
	return strings.Join(names, "+")
}

// The in-memory tree checkBuilds builds: deploy/ and a user's overlay
// beside it.
const (
	memDeploy  = "/deploy"
	memOverlay = "/overlay"
)

// checkBuilds builds deploy/ with kustomize, its hand-written
// kustomizations over files (what Generate makes, not what deploy/ holds),
// with every combination of its components, as a user's overlay that
// names deploy/ and the components does (deploy/README.md); a component
// the base lists (defaults) but the combination leaves out is taken out
// of the base's components:, as its comment tells. Each build must give
// exactly the objects of the chart rendered with those components' values
// on and the others off, Helm's bookkeeping aside: a kustomization that
// changes what the chart installs (an inline patch, labels:,
// replacements:), two components' patches that replace the same list, or
// an object the chart renders only when two values are on, fails it.
func checkBuilds(chartDir, deployDir string, files Files, defaults []string) error {
	fsys := filesys.MakeFsInMemory()
	for p, b := range files {
		if err := fsys.WriteFile(path.Join(memDeploy, p), b); err != nil {
			return err
		}
	}
	for _, dir := range dirs() {
		b, err := os.ReadFile(filepath.Join(deployDir, filepath.FromSlash(dir), "kustomization.yaml"))
		if err != nil {
			return err
		}
		if err := fsys.WriteFile(path.Join(memDeploy, dir, "kustomization.yaml"), b); err != nil {
			return err
		}
	}
	base, err := fsys.ReadFile(path.Join(memDeploy, "kustomization.yaml"))
	if err != nil {
		return err
	}
	// The failures, each with the combinations it happens in: one
	// kustomization's fault shows in many.
	failures := map[string][]string{}
	var order []string
	fail := func(combo, msg string) {
		if failures[msg] == nil {
			order = append(order, msg)
		}
		failures[msg] = append(failures[msg], combo)
	}
	for _, set := range combinations() {
		combo := comboName(set)
		on := map[string]bool{}
		vals := baseVals()
		for _, c := range set {
			on[c.Name] = true
			maps.Copy(vals, c.Vals)
		}
		var drop, add []string
		for _, c := range Components {
			switch {
			case slices.Contains(defaults, c.Name) && !on[c.Name]:
				drop = append(drop, c.Name)
			case !slices.Contains(defaults, c.Name) && on[c.Name]:
				add = append(add, c.Name)
			}
		}
		k, err := withoutComponents(base, drop)
		if err != nil {
			return fmt.Errorf("deploy/kustomization.yaml: %w", err)
		}
		if err := fsys.WriteFile(path.Join(memDeploy, "kustomization.yaml"), k); err != nil {
			return err
		}
		if err := fsys.WriteFile(path.Join(memOverlay, "kustomization.yaml"), overlay(add)); err != nil {
			return err
		}
		built, err := Kustomize(fsys, memOverlay)
		if err != nil {
			fail(combo, fmt.Sprintf("kustomize build: %v", err))
			continue
		}
		fromDeploy, err := Objects(built, false)
		if err != nil {
			fail(combo, fmt.Sprintf("kustomize build: %v", err))
			continue
		}
		manifest, err := Render(chartDir, vals)
		if err != nil {
			return fmt.Errorf("the chart with %s: %w", combo, err)
		}
		fromChart, err := Objects(manifest, true)
		if err != nil {
			return fmt.Errorf("the chart with %s: %w", combo, err)
		}
		keys := slices.Sorted(maps.Keys(fromChart))
		for k := range fromDeploy {
			if fromChart[k] == nil {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			c, d := fromChart[k], fromDeploy[k]
			switch {
			case c == nil:
				fail(combo, fmt.Sprintf("%s: in deploy/, not in the chart", k))
			case d == nil:
				fail(combo, fmt.Sprintf("%s: in the chart, not in deploy/", k))
			default:
				if diff := cmp.Diff(d, c); diff != "" {
					fail(combo, fmt.Sprintf("%s differs (-deploy/ +chart):\n%s", k, diff))
				}
			}
		}
	}
	var errs []error
	for _, msg := range order {
		combos := failures[msg]
		what, rest, _ := strings.Cut(msg, "\n")
		if rest != "" {
			rest = "\n" + rest
		}
		errs = append(errs, fmt.Errorf("kustomize build of deploy/ with %s (%d of %d combinations) is not the chart with their values: %s%s",
			strings.Join(combos, ", "), len(combos), len(combinations()), what, rest))
	}
	return errors.Join(errs...)
}

// overlay is a user's kustomization beside deploy/ that names it and the
// components add.
func overlay(add []string) []byte {
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy\n")
	if len(add) > 0 {
		b.WriteString("components:\n")
		for _, c := range add {
			fmt.Fprintf(&b, "  - ../deploy/components/%s\n", c)
		}
	}
	return []byte(b.String())
}

// withoutComponents returns the kustomization k without the entries of
// its components: that name drop's components, as a user who removes the
// line has it.
func withoutComponents(k []byte, drop []string) ([]byte, error) {
	if len(drop) == 0 {
		return k, nil
	}
	var doc yaml3.Node
	if err := yaml3.Unmarshal(k, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, errors.New("empty")
	}
	root := doc.Content[0]
	list := lookup(root, "components")
	if list == nil || list.Kind != yaml3.SequenceNode {
		return nil, errors.New("no components: list")
	}
	var kept []*yaml3.Node
	for _, it := range list.Content {
		if !slices.Contains(drop, strings.TrimPrefix(it.Value, "components/")) {
			kept = append(kept, it)
		}
	}
	list.Content = kept
	return yaml3.Marshal(&doc)
}

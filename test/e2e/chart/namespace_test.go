package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// otherNamespace is where the tests below install converge instead of
// kube-system.
const otherNamespace = "storage-converge"

// clusterScoped are the kinds, among what deploy/ and the chart make,
// that live in no namespace.
var clusterScoped = map[string]bool{
	"CSIDriver": true, "StorageClass": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"VolumeSnapshotClass": true, "VolumeGroupSnapshotClass": true, "ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
}

// kustomizeInto builds deploy/ with components as a user's overlay that
// installs it into ns does: namespace: ns (none when ns is ""),
// resources: [deploy/].
func kustomizeInto(t *testing.T, ns string, components []string) string {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(deploy)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n")
	if ns != "" {
		fmt.Fprintf(&b, "namespace: %s\n", ns)
	}
	fmt.Fprintf(&b, "resources:\n  - %s\n", rel)
	if len(components) > 0 {
		b.WriteString("components:\n")
		for _, c := range components {
			fmt.Fprintf(&b, "  - %s/components/%s\n", rel, c)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return buildKustomization(t, dir)
}

// misplaced lists what in objs is not in ns: a namespaced object
// elsewhere, a binding's service account subject in another namespace, or
// any mention of kube-system.
func misplaced(objs map[string]map[string]any, manifest, ns string) []string {
	var bad []string
	for k, o := range objs {
		kind, _ := o["kind"].(string)
		got, _ := o["metadata"].(map[string]any)["namespace"].(string)
		// A cluster-scoped kind kustomize does not know (a CRD's, the
		// VolumeSnapshotClass and VolumeGroupSnapshotClass) takes the
		// namespace too, which the API server drops.
		if !clusterScoped[kind] && got != ns {
			bad = append(bad, fmt.Sprintf("%s: in namespace %q, want %q", k, got, ns))
		}
		subjects, _ := o["subjects"].([]any)
		for _, s := range subjects {
			s := s.(map[string]any)
			if s["kind"] == "ServiceAccount" && s["namespace"] != ns {
				bad = append(bad, fmt.Sprintf("%s: subject ServiceAccount %v in namespace %v, want %q", k, s["name"], s["namespace"], ns))
			}
		}
	}
	if strings.Contains(manifest, "kube-system") {
		for _, line := range strings.Split(manifest, "\n") {
			if strings.Contains(line, "kube-system") {
				bad = append(bad, fmt.Sprintf("names kube-system: %s", strings.TrimSpace(line)))
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// TestDeployIntoAnotherNamespace installs deploy/, and deploy/ with each
// component, into a namespace of the user's (kubectl apply -k of an
// overlay that says namespace: and lists deploy/): every namespaced
// object lands there, every RoleBinding's and ClusterRoleBinding's
// ServiceAccount subject names it (kustomize rewrites a subject that
// names a ServiceAccount of the build by that account's namespace in its
// file), and nothing names kube-system.
func TestDeployIntoAnotherNamespace(t *testing.T) {
	for _, v := range append(variants, struct {
		name       string
		components []string
		vals       map[string]any
	}{name: "every component", components: []string{"snapshots", "selinux", "monitoring"}}) {
		t.Run(v.name, func(t *testing.T) {
			manifest := kustomizeInto(t, otherNamespace, v.components)
			objs := objects(t, manifest, false)
			for _, b := range misplaced(objs, manifest, otherNamespace) {
				t.Error(b)
			}
			if subjects := strings.Count(manifest, "- kind: ServiceAccount"); subjects == 0 {
				t.Error("no ServiceAccount subject rendered")
			}
		})
	}
}

// TestChartIntoAnotherNamespace is TestDeployIntoAnotherNamespace for the
// chart: installed with -n into a namespace of the user's, in each
// variant, every object and every subject takes the release's namespace.
func TestChartIntoAnotherNamespace(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			manifest, err := renderIn(t, otherNamespace, v.vals)
			if err != nil {
				t.Fatal(err)
			}
			objs := objects(t, manifest, true)
			for _, b := range misplaced(objs, manifest, otherNamespace) {
				t.Error(b)
			}
		})
	}
}

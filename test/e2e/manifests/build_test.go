package manifests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var (
	repoChart  = filepath.Join("..", "..", "..", "charts", "converge")
	repoDeploy = filepath.Join("..", "..", "..", "deploy")
)

// kustomizations copies deploy/'s kustomization.yaml files, all Generate
// reads of deploy/, into a new directory.
func kustomizations(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range dirs() {
		b, err := os.ReadFile(filepath.Join(repoDeploy, d, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, d, "kustomization.yaml"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// copyChart copies the chart into a new directory, with edit applied to
// the text of each template edit names.
func copyChart(t *testing.T, edit map[string]func(string) string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "converge")
	if err := os.CopyFS(dir, os.DirFS(repoChart)); err != nil {
		t.Fatal(err)
	}
	for name, f := range edit {
		p := filepath.Join(dir, "templates", name)
		b, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f(string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// wantErr fails unless err holds every one of want.
func wantErr(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one naming %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not name %q:\n%v", w, err)
		}
	}
}

// TestBuildsAreTheChart checks that Generate refuses a deploy/ whose
// kustomize build, in some combination of its components, is not the
// chart with those values: a kustomization's inline patch that puts a
// binding of the admission policy in Audit, two components' patches of
// one list (kustomize keeps the last component's), and an object the
// chart renders only with two components on.
func TestBuildsAreTheChart(t *testing.T) {
	deployDir := kustomizations(t)
	files, err := Generate(repoChart, deployDir)
	if err != nil {
		t.Fatalf("deploy/'s kustomizations: %v", err)
	}
	t.Run("an inline patch", func(t *testing.T) {
		p := filepath.Join(deployDir, "components", "node-volumes", "kustomization.yaml")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, "patches:\n  - patch: |-\n      apiVersion: admissionregistration.k8s.io/v1\n      kind: ValidatingAdmissionPolicyBinding\n      metadata:\n        name: converge-node-own-volumes\n      spec:\n        validationActions: [Audit]\n"...)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		defaults, err := chartDefaults(repoChart)
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, checkBuilds(repoChart, deployDir, files, defaults),
			"with node-volumes, node-volumes+snapshots,", "(8 of 16 combinations)",
			"ValidatingAdmissionPolicyBinding /converge-node-own-volumes differs", `string("Audit")`)
	})
	t.Run("components together", func(t *testing.T) {
		chartDir := copyChart(t, map[string]func(string) string{
			"daemonset.yaml": func(s string) string {
				arg := "            - -v={{ .Values.csiNode.logLevel }}\n"
				if !strings.Contains(s, arg) {
					t.Fatalf("daemonset.yaml has no %q", arg)
				}
				return strings.Replace(s, arg, arg+"            {{- if .Values.snapshots.enabled }}\n            - --a-snapshots-arg\n            {{- end }}\n"+
					"            {{- if .Values.selinux.enabled }}\n            - --a-selinux-arg\n            {{- end }}\n", 1)
			},
			"both.yaml": func(string) string {
				return "{{- if and .Values.nodeVolumesPolicy.enabled .Values.snapshots.enabled }}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: both\n  namespace: {{ .Release.Namespace }}\n{{- end }}\n"
			},
		})
		_, err := Generate(chartDir, kustomizations(t))
		wantErr(t, err,
			"with snapshots+selinux, node-volumes+snapshots+selinux, snapshots+selinux+monitoring, node-volumes+snapshots+selinux+monitoring (4 of 16 combinations)",
			"DaemonSet kube-system/converge-node differs", `string("--a-snapshots-arg")`,
			"with node-volumes+snapshots, node-volumes+snapshots+selinux, node-volumes+snapshots+monitoring, node-volumes+snapshots+selinux+monitoring (4 of 16 combinations)",
			"ConfigMap kube-system/both: in the chart, not in deploy/")
	})
}

// TestKustomizationHoldsOnlyTheGlue checks that checkKustomization
// refuses, naming the file and the key, what a kustomization could change
// the chart's objects with, and a base without the components the chart
// turns on by default.
func TestKustomizationHoldsOnlyTheGlue(t *testing.T) {
	const (
		base      = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: kube-system\nresources:\n  - a.yaml\ncomponents:\n  - components/node-volumes\nimages:\n  - name: x\n    newTag: v1\n"
		component = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources:\n  - b.yaml\npatches:\n  - path: daemonset-patch.yaml\n"
	)
	files := Files{"a.yaml": {}, "components/c/b.yaml": {}, "components/c/daemonset-patch.yaml": {}}
	for _, tc := range []struct {
		name, dir, text, want string
	}{
		{name: "the base", dir: ".", text: base},
		{name: "a component", dir: "components/c", text: component},
		{name: "labels", dir: ".", text: base + "labels:\n  - pairs: {a: b}\n", want: `unknown field "labels"`},
		{name: "commonLabels", dir: ".", text: base + "commonLabels: {a: b}\n", want: `unknown field "commonLabels"`},
		{name: "replacements", dir: ".", text: base + "replacements: []\n", want: `unknown field "replacements"`},
		{name: "patchesJson6902", dir: ".", text: base + "patchesJson6902: []\n", want: `unknown field "patchesJson6902"`},
		{name: "patches in the base", dir: ".", text: base + "patches:\n  - path: a.yaml\n", want: `unknown field "patches"`},
		{name: "an image's new name", dir: ".", text: strings.Replace(base, "newTag: v1", "newName: evil.example/x", 1), want: `unknown field "newName"`},
		{name: "another namespace", dir: ".", text: strings.Replace(base, "namespace: kube-system", "namespace: default", 1), want: `namespace "default"`},
		{name: "no node-volumes", dir: ".", text: strings.Replace(base, "components:\n  - components/node-volumes\n", "", 1), want: "lists components []"},
		{name: "an inline patch", dir: "components/c", text: component + "  - patch: '{}'\n", want: `unknown field "patch"`},
		{name: "a patch's target", dir: "components/c", text: component + "    target: {kind: DaemonSet}\n", want: `unknown field "target"`},
		{name: "a component's namespace", dir: "components/c", text: component + "namespace: x\n", want: `unknown field "namespace"`},
		{name: "a key twice", dir: "components/c", text: component + "resources: []\n", want: `"resources" already set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deployDir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(deployDir, tc.dir), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(deployDir, tc.dir, "kustomization.yaml"), []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			err := checkKustomization(deployDir, tc.dir, files, []string{"node-volumes"})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, "deploy/"+filepath.ToSlash(filepath.Join(tc.dir, "kustomization.yaml")), tc.want)
		})
	}
}

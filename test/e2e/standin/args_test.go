package standin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

func TestParseArgs(t *testing.T) {
	provisioner, _ := releaseNamed("csi-provisioner")
	for _, tc := range []struct {
		name string
		argv []string
		// release: refused as the release refuses it (exit 2); refused:
		// refused by the stand-in alone (exit 1).
		release, refused string
		want             map[string]any
	}{
		{name: "defaults", argv: nil,
			want: map[string]any{"node-deployment": false, "node-deployment-immediate-binding": true, "capacity-ownerref-level": 1, "timeout": 10 * time.Second, "csi-address": "/run/csi/socket"}},
		{name: "values", argv: []string{"--node-deployment", "-strict-topology=1", "--capacity-ownerref-level=0", "--timeout=5m", "--csi-address=/csi/csi.sock", "--enable-capacity=false"},
			want: map[string]any{"node-deployment": true, "strict-topology": true, "capacity-ownerref-level": 0, "timeout": 5 * time.Minute, "csi-address": "/csi/csi.sock", "enable-capacity": false}},
		{name: "the last of a repeated flag", argv: []string{"--timeout=1m", "--timeout=2m"}, want: map[string]any{"timeout": 2 * time.Minute}},
		{name: "a flag the release lacks", argv: []string{"--no-such-flag=1"}, release: "no-such-flag"},
		{name: "not a flag", argv: []string{"stray"}, release: "stray"},
		{name: "a bad boolean", argv: []string{"--node-deployment=yes"}, release: `invalid value "yes" for flag --node-deployment`},
		{name: "a bad duration", argv: []string{"--timeout=5"}, release: `invalid value "5" for flag --timeout`},
		{name: "a flag of the release the stand-in lacks", argv: []string{"--worker-threads=5"}, refused: "--worker-threads=5: the stand-in does not implement"},
		{name: "a value as the next argument", argv: []string{"--timeout", "5m"}, refused: "reads --timeout=value only"},
		{name: "a value-taking flag without its value", argv: []string{"--timeout"}, release: "flag needs an argument: --timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseArgs(provisioner, provisionerFlags, tc.argv)
			switch {
			case tc.release != "":
				if !errors.Is(err, errRelease) || !strings.Contains(err.Error(), tc.release) {
					t.Fatalf("got %v, want the release's refusal naming %q", err, tc.release)
				}
			case tc.refused != "":
				if err == nil || errors.Is(err, errRelease) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("got %v, want the stand-in's refusal naming %q", err, tc.refused)
				}
			case err != nil:
				t.Fatal(err)
			}
			for name, want := range tc.want {
				if got[name] != want {
					t.Errorf("--%s: got %v, want %v", name, got[name], want)
				}
			}
		})
	}
}

// TestStandInsReadTheirReleasesFlags checks that each flag a stand-in
// reads is one its release defines, with a default the release's flag
// package would read.
func TestStandInsReadTheirReleasesFlags(t *testing.T) {
	for name, s := range standIns {
		release, ok := releaseNamed(name)
		if !ok {
			t.Errorf("stand-in %s: no release of that name", name)
			continue
		}
		for flag, spec := range s.reads {
			if !slices.Contains(release.Flags, flag) {
				t.Errorf("stand-in %s reads --%s, which %s %s does not define", name, flag, release.Image, release.Version)
			}
			if _, err := parseValue(spec.kind, spec.def); err != nil {
				t.Errorf("stand-in %s: the default of --%s: %v", name, flag, err)
			}
		}
	}
}

// TestDeployArgsTakenByStandIns renders deploy/ with every component and
// starts each stand-in's configuration from the arguments and environment
// deploy/ gives its sidecar: each must take them, and do with them what
// deploy/ means. The chart passes the same arguments (../chart checks
// that its objects are deploy/'s, and its values set none of them).
func TestDeployArgsTakenByStandIns(t *testing.T) {
	ds := deployDaemonSet(t)
	seen := 0
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		release, ok := ReleaseOf(ctr.Image)
		if !ok {
			continue
		}
		seen++
		name := filepath.Base(release.Image)
		a, err := parseArgs(release, standIns[name].reads, ctr.Args)
		if err != nil {
			t.Errorf("%s: %v", ctr.Name, err)
			continue
		}
		env := envOf(ctr)
		switch name {
		case "csi-provisioner":
			cfg, err := newProvisionerConfig(a, env)
			want := provisionerConfig{csiAddress: "/csi/csi.sock", node: "$NODE_NAME", capacity: true, namespace: "$NAMESPACE",
				ownerPod: "$POD_NAME", extraCreateMetadata: true, timeout: 5 * time.Minute}
			if err != nil || cfg != want {
				t.Errorf("%s: got %+v, %v; want %+v", ctr.Name, cfg, err, want)
			}
		case "csi-resizer":
			cfg, err := newResizerConfig(a)
			want := resizerConfig{csiAddress: "/csi/csi.sock", elect: true, namespace: "$(NAMESPACE)", timeout: 10 * time.Second}
			if err != nil || cfg != want {
				t.Errorf("%s: got %+v, %v; want %+v", ctr.Name, cfg, err, want)
			}
			if env("NAMESPACE") == "" {
				t.Errorf("%s: --leader-election-namespace=$(NAMESPACE) without NAMESPACE in its environment", ctr.Name)
			}
		case "csi-node-driver-registrar":
			if got, want := a.string("kubelet-registration-path"), "/var/lib/kubelet/plugins/converge.csi.dev/csi.sock"; got != want {
				t.Errorf("%s: --kubelet-registration-path %q, want %q", ctr.Name, got, want)
			}
		}
	}
	if seen != len(standIns) {
		t.Errorf("deploy/ runs %d of the %d stand-ins' releases", seen, len(standIns))
	}
}

// deployDaemonSet is deploy/'s DaemonSet with every component, as
// kubectl apply -k of an overlay naming them would make it.
func deployDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs("../../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	// kustomize takes a base only by a relative path.
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %[1]s/components/snapshots\n  - %[1]s/components/selinux\n", rel)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Resources() {
		if r.GetKind() != "DaemonSet" {
			continue
		}
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		ds := &appsv1.DaemonSet{}
		if err := yaml.Unmarshal(b, ds); err != nil {
			t.Fatal(err)
		}
		return ds
	}
	t.Fatal("deploy/ has no DaemonSet")
	return nil
}

// envOf is a getenv of ctr's environment: "$NAME" for each variable it
// sets (from a field of the pod, say), "" for the others.
func envOf(ctr corev1.Container) func(string) string {
	return func(name string) string {
		for _, e := range ctr.Env {
			if e.Name == name {
				return "$" + name
			}
		}
		return ""
	}
}

// TestRunExitCodes: a stand-in started with a flag its release lacks
// exits 2, as the release's flag package does; with a flag of its release
// it does not implement, 1, before doing anything, saying why.
func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want int
		says string
	}{
		{[]string{"--no-such-flag=1"}, 2, "flag provided but not defined by registry.k8s.io/sig-storage/csi-provisioner v6.3.0: --no-such-flag=1"},
		{[]string{"--worker-threads=5"}, 1, "--worker-threads=5: the stand-in does not implement this flag"},
	} {
		var stderr bytes.Buffer
		if got := run("csi-provisioner", append(deployArgs(t, "csi-provisioner"), tc.argv...), &stderr); got != tc.want || !strings.Contains(stderr.String(), tc.says) {
			t.Errorf("csi-provisioner %v: exit %d, %q; want %d, %q", tc.argv, got, stderr.String(), tc.want, tc.says)
		}
	}
}

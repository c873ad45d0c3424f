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

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

func TestParseArgs(t *testing.T) {
	registrar, _ := releaseNamed("csi-node-driver-registrar")
	for _, tc := range []struct {
		name string
		argv []string
		// release: refused as the release refuses it (exit 2); refused:
		// refused by the stand-in alone (exit 1).
		release, refused string
		want             map[string]string
	}{
		{name: "defaults", argv: nil,
			want: map[string]string{"csi-address": "/run/csi/socket", "kubelet-registration-path": "", "http-endpoint": ""}},
		{name: "values", argv: []string{"--csi-address=/csi/csi.sock", "-http-endpoint=:9809"},
			want: map[string]string{"csi-address": "/csi/csi.sock", "http-endpoint": ":9809"}},
		{name: "the last of a repeated flag", argv: []string{"--http-endpoint=:1", "--http-endpoint=:2"}, want: map[string]string{"http-endpoint": ":2"}},
		{name: "a flag the release lacks", argv: []string{"--no-such-flag=1"}, release: "no-such-flag"},
		{name: "not a flag", argv: []string{"stray"}, release: "stray"},
		{name: "a flag of the release the stand-in lacks", argv: []string{"--mode=kubelet-registration-probe"}, refused: "--mode=kubelet-registration-probe: the stand-in does not implement"},
		{name: "a value as the next argument", argv: []string{"--csi-address", "/csi/csi.sock"}, refused: "reads --csi-address=value only"},
		{name: "a value-taking flag without its value", argv: []string{"--csi-address"}, release: "flag needs an argument: --csi-address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseArgs(registrar, registrarFlags, tc.argv)
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
					t.Errorf("--%s: got %q, want %q", name, got[name], want)
				}
			}
		})
	}
}

// TestStandInsReadTheirReleasesFlags checks that each flag a stand-in
// reads is one its release defines.
func TestStandInsReadTheirReleasesFlags(t *testing.T) {
	for name, s := range standIns {
		release, ok := releaseNamed(name)
		if !ok {
			t.Errorf("stand-in %s: no release of that name", name)
			continue
		}
		for flag := range s.reads {
			if !slices.Contains(release.Flags, flag) {
				t.Errorf("stand-in %s reads --%s, which %s %s does not define", name, flag, release.Image, release.Version)
			}
		}
	}
}

// TestDeployArgsTakenByStandIns renders deploy/ with every component and
// reads each stand-in's arguments from what deploy/ gives its sidecar:
// each must take them, with the values deploy/ means. The chart passes
// the same arguments (../chart checks that its objects are deploy/'s, and
// its values set none of them).
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
		switch name {
		case "csi-node-driver-registrar":
			if got, want := a.string("kubelet-registration-path"), "/var/lib/kubelet/plugins/converge.csi.dev/csi.sock"; got != want {
				t.Errorf("%s: --kubelet-registration-path %q, want %q", ctr.Name, got, want)
			}
		default:
			t.Errorf("%s: no check of stand-in %s's arguments", ctr.Name, name)
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

// TestRunExitCodes: a stand-in started with a flag its release lacks
// exits 2, as the release's flag package does; with a flag of its release
// it does not implement, 1, before doing anything, saying why.
func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want int
		says string
	}{
		{[]string{"--no-such-flag=1"}, 2, "flag provided but not defined by registry.k8s.io/sig-storage/csi-node-driver-registrar v2.17.0: --no-such-flag=1"},
		{[]string{"--mode=kubelet-registration-probe"}, 1, "--mode=kubelet-registration-probe: the stand-in does not implement this flag"},
	} {
		var stderr bytes.Buffer
		if got := run("csi-node-driver-registrar", append(deployArgs(t, "node-driver-registrar"), tc.argv...), &stderr); got != tc.want || !strings.Contains(stderr.String(), tc.says) {
			t.Errorf("csi-node-driver-registrar %v: exit %d, %q; want %d, %q", tc.argv, got, stderr.String(), tc.want, tc.says)
		}
	}
}

// deployArgs are the arguments deploy/ gives its container name.
func deployArgs(t *testing.T, name string) []string {
	t.Helper()
	for _, ctr := range deployDaemonSet(t).Spec.Template.Spec.Containers {
		if ctr.Name == name {
			return slices.Clone(ctr.Args)
		}
	}
	t.Fatalf("deploy/ has no container %s", name)
	return nil
}

// without is argv less the flag named.
func without(argv []string, flag string) []string {
	return slices.DeleteFunc(slices.Clone(argv), func(a string) bool { f, _, _ := strings.Cut(a, "="); return f == flag })
}

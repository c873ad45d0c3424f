package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/converge-csi/converge/test/e2e/standin"
)

// TestDeploySidecarsTakeTheirArgs renders deploy/ with every component and
// checks each sidecar of its DaemonSet against the release it names: each
// release the suite builds (sidecars) by running it with the DaemonSet's
// arguments and --version (it parses them all, then exits), and the
// registrar's, whose module is refused here, against the flags its release
// defines (package standin).
func TestDeploySidecarsTakeTheirArgs(t *testing.T) {
	built, err := c.kubectl(context.Background(), "kustomize", deployWith(t, "components/snapshots", "components/selinux"))
	if err != nil {
		t.Fatal(err)
	}
	// The node DaemonSet, whose sidecars these are: the node agent's
	// DaemonSet beside it runs converge's own image alone.
	var ds *appsv1.DaemonSet
	for _, doc := range strings.Split(built, "\n---\n") {
		if strings.Contains(doc, "kind: DaemonSet") {
			d := &appsv1.DaemonSet{}
			if err := yaml.Unmarshal([]byte(doc), d); err != nil {
				t.Fatal(err)
			}
			if d.Name == daemonSetName {
				ds = d
			}
		}
	}
	if ds == nil {
		t.Fatalf("no DaemonSet %s in deploy/:\n%s", daemonSetName, built)
	}
	checked := 0
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		// converge's own: csi-node, which the cluster runs (a flag it
		// lacks would crash it, and the run's invariants count every
		// restart).
		if ctr.Name == "csi-node" {
			continue
		}
		checked++
		if sc, ok := sidecarNamed(ctr.Image); ok {
			if ctr.Image != sc.image() {
				t.Errorf("%s: image %s, want %s, the release the suite builds", ctr.Name, ctr.Image, sc.image())
			}
			// It prints its path and its version; csi-provisioner reads
			// NODE_NAME before, as it runs in deploy/'s environment.
			cmd := exec.Command(c.sidecarBin(sc.name), append(ctr.Args, "--version")...)
			for _, e := range ctr.Env {
				value := e.Value
				if e.ValueFrom != nil {
					value = "from-" + e.Name
				}
				cmd.Env = append(cmd.Env, e.Name+"="+value)
			}
			out, err := cmd.CombinedOutput()
			if f := strings.Fields(string(out)); err != nil || len(f) != 2 || f[1] != sc.version {
				t.Errorf("%s: %s %v --version: %v\n%s", ctr.Name, sc.image(), ctr.Args, err, out)
			}
			continue
		}
		s, ok := standin.ReleaseOf(ctr.Image)
		if !ok {
			t.Errorf("%s: image %s is none of the sidecar releases the suite knows", ctr.Name, ctr.Image)
			continue
		}
		if ctr.Image != s.Image+":"+s.Version {
			t.Errorf("%s: image %s, want %s:%s", ctr.Name, ctr.Image, s.Image, s.Version)
		}
		if bad := s.UnknownArgs(ctr.Args); len(bad) > 0 {
			t.Errorf("%s: %s %s does not define %v", ctr.Name, s.Image, s.Version, bad)
		}
	}
	if want := len(sidecars) + len(standin.Releases); checked != want {
		t.Errorf("checked %d sidecars, want %d", checked, want)
	}

	// Each check can fail.
	for _, s := range standin.Releases {
		if bad := s.UnknownArgs([]string{"--csi-address=/csi/csi.sock", "--feature-gates=Topology=true", "-v=2", "stray"}); len(bad) == 0 {
			t.Errorf("%s accepts every argument", s.Image)
		}
	}
	for _, sc := range sidecars {
		if out, err := exec.Command(c.sidecarBin(sc.name), "--no-such-flag", "--version").CombinedOutput(); err == nil {
			t.Errorf("%s took an unknown flag: %s", sc.name, out)
		}
	}
}

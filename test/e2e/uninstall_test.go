package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/converge-csi/converge/pkg/contract"
)

// The uninstall of docs/operations.md (Uninstall), run on the kustomize
// path: a claim's volume is made, then taken away as the docs say. Its
// claim deleted first, so that its volume is released while converge
// still runs (its image goes with it); then kubectl delete -k of the
// run's kustomization, which deletes every object it applied, the
// CSIDriver among them; the topology label on every Node, which the
// kubelet's deregistration of the driver leaves, taken off as the docs
// say; what the docs say stays does: each node's state
// directory, with csi-node's store in it, and csi-node's image in the
// node's container runtime (the test keeps the images, which cannot be
// pulled again here); the node directories removed as the docs say are
// gone. deploy/ installed again on the emptied nodes labels every Node
// again (the scheduler places converge's volumes by the label) and makes
// and mounts a new claim.
func TestKustomizeUninstall(t *testing.T) {
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join(c.repo, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, docs, _ := strings.Cut(string(b), "\n## Uninstall\n")
	docs, _, _ = strings.Cut(docs, "\n## ")
	docs = strings.Join(strings.Fields(docs), " ")
	for _, step := range []string{"wait until no PersistentVolume of `converge.csi.dev` is left", "`kubectl delete -k deploy/`",
		"`kubectl delete csidriver converge.csi.dev`", "`kubectl label node --all " + contract.TopologyKey + "-`", "`rm -rf /var/lib/converge`", "(`<poolsRoot>/<name>`",
		"`rm -rf /var/lib/kubelet/plugins/converge.csi.dev`", "`crictl rmi"} {
		if !strings.Contains(docs, step) {
			t.Errorf("docs/operations.md's Uninstall does not say %q, which this test runs", step)
		}
	}
	t.Cleanup(func() {
		if _, err := c.client.AppsV1().DaemonSets(daemonSetNamespace).Get(ctx, daemonSetName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			reinstallDeploy(t)
		}
	})
	pod, v := writerPod(t, "uninstall")
	mustExec(t, pod.Name, "sync")

	// 1. The claims first: their volumes are deleted by the converge that
	// made them, images included.
	release(t, v, "uninstall", pod.Name)
	// Every other test's claims are gone too, their volumes deleted by
	// their converge, if not yet: wait for them.
	poll(t, 3*time.Minute, "no "+contract.DefaultDriverName+" PV left", func() (bool, string) {
		pvs, err := c.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, pv := range pvs.Items {
			if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == contract.DefaultDriverName {
				left = append(left, fmt.Sprintf("%s (%s, claim %v)", pv.Name, pv.Status.Phase, pv.Spec.ClaimRef))
			}
		}
		return len(left) == 0, "left, where the uninstall deletes every claim first: " + strings.Join(left, ", ")
	})

	// 2. The install, with the kustomization it was applied with.
	install := filepath.Join(c.dir, "install")
	applied, err := c.kubectl(ctx, "kustomize", install)
	if err != nil {
		t.Fatal(err)
	}
	snapshotsSettled(t)
	if out, err := c.kubectl(ctx, "delete", "-k", install, "--wait=true"); err != nil {
		t.Fatalf("kubectl delete -k: %v\n%s", err, out)
	} else {
		t.Logf("kubectl delete -k:\n%s", out)
	}
	withoutDriver(t)
	left, err := c.kubectl(ctx, "get", "-k", install, "-o", "name", "--ignore-not-found")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(left) != "" {
		t.Errorf("after kubectl delete -k, these objects it applied are left:\n%s", left)
	}
	if !strings.Contains(applied, "kind: CSIDriver") {
		t.Errorf("the kustomization applies no CSIDriver:\n%s", applied)
	}
	if _, err := c.client.StorageV1().CSIDrivers().Get(ctx, contract.DefaultDriverName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the CSIDriver after kubectl delete -k: got %v, want it deleted", err)
	}

	// 3. The Nodes' label: the kubelet's deregistration of the driver
	// (its registration socket gone with the pod) takes the driver out of
	// each CSINode and its node-id annotation off the Node, and leaves the
	// topology label its registration put on.
	for _, n := range c.nodes {
		poll(t, 2*time.Minute, n.node+"'s CSINode without "+contract.DefaultDriverName, func() (bool, string) {
			return !n.driverRegistered(), "the kubelet has not deregistered the driver yet"
		})
	}
	if labelled := topologyLabels(t); len(labelled) != len(c.nodes) {
		t.Errorf("after the driver's deregistration, the label %s on %v, want it still on all %d nodes (what the docs' step takes off)", contract.TopologyKey, labelled, len(c.nodes))
	}
	if out, err := c.kubectl(ctx, "label", "node", "--all", contract.TopologyKey+"-"); err != nil {
		t.Fatalf("kubectl label node --all %s-: %v\n%s", contract.TopologyKey, err, out)
	}
	if labelled := topologyLabels(t); len(labelled) != 0 {
		t.Errorf("after the uninstall, the label %s is left on %v", contract.TopologyKey, labelled)
	}

	// What stays: on each node, the state directory with csi-node's store,
	// and the images.
	for _, n := range c.nodes {
		entries, err := os.ReadDir(n.stateDir)
		if err != nil || len(entries) == 0 {
			t.Errorf("%s: the state directory after the uninstall: %v, %d entries; the docs say it stays", n.node, err, len(entries))
		}
		t.Logf("%s: the state directory holds %v", n.node, names(entries))
		images, err := n.ctr("images", "ls", "-q")
		if err != nil {
			t.Fatalf("%s: ctr images ls: %v\n%s", n.node, err, images)
		}
		if !strings.Contains(images, csiNodeImageName+":"+csiNodeImageTag) {
			t.Errorf("%s: csi-node's image %s:%s is gone; the docs say it stays:\n%s", n.node, csiNodeImageName, csiNodeImageTag, images)
		}
	}

	// 4. On each node: the state directory, the pools' contents and the
	// plugin's socket directory (as rm -rf on the node does; the state and
	// pools directories are the node's mounts here, so their contents).
	for _, n := range c.nodes {
		pools, err := os.ReadDir(n.poolsDir)
		if err != nil {
			t.Fatal(err)
		}
		dirs := []string{n.stateDir}
		for _, p := range pools {
			dirs = append(dirs, filepath.Join(n.poolsDir, p.Name()))
		}
		for _, d := range dirs {
			emptyDir(t, d)
		}
		plugin := filepath.Join(n.kubeletDir, "plugins", contract.DefaultDriverName)
		if err := os.RemoveAll(plugin); err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if left := filesIn(t, d); len(left) != 0 {
				t.Errorf("%s: %s after removing converge's files: %v", n.node, d, left)
			}
		}
	}

	// deploy/ again, on nodes without converge's state: a new claim works.
	reinstallDeploy(t)
	labelled := topologyLabels(t)
	for _, n := range c.nodes {
		if got := labelled[n.node]; got != n.node {
			t.Errorf("%s: the label %s is %q after deploy/ again, want its node id %q", n.node, contract.TopologyKey, got, n.node)
		}
	}
	next, nv := podWithVolume(t, "after-uninstall")
	mustExec(t, next.Name, "echo new > "+dataDir+"/f && sync")
	release(t, nv, "after-uninstall", next.Name)
}

// topologyLabels are the values of converge's topology label, by the name
// of each Node that carries it.
func topologyLabels(t *testing.T) map[string]string {
	t.Helper()
	nodes, err := c.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		if v, ok := n.Labels[contract.TopologyKey]; ok {
			out[n.Name] = v
		}
	}
	return out
}

// emptyDir removes everything in dir, keeping dir.
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var parent unix.Stat_t
	if err := unix.Stat(dir, &parent); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		// A filesystem of its own mounted there (the second node's data
		// directory) cannot be removed, as rm -rf finds too: its
		// contents are.
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			t.Fatal(err)
		}
		if e.IsDir() && st.Dev != parent.Dev {
			emptyDir(t, path)
			continue
		}
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
	}
}

// filesIn lists everything under dir but directories: what is left of
// converge's files once emptyDir emptied it, which keeps only the mount
// points it found, empty.
func filesIn(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// names are the entries' names.
func names(entries []os.DirEntry) []string {
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

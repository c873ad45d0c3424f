package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	helmrelease "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/dist"
	"github.com/converge-csi/converge/test/e2e/standin"
)

// helmRelease is the chart's release, named as the README's helm install
// names it, so that its objects are named as deploy/'s.
const helmRelease = "converge"

// helmValues are the run's values of the chart: the same choices as its
// kustomization of deploy/ (installKustomizations), csi-node's arguments
// (installArgs) and the registrar's stand-in among them, at csi-node's log
// level logLevel. csi-node's image is the chart's own, the release's
// (TestHelmChart imports it); the other sidecars keep the chart's images,
// which the run's images are named as: a chart that named another release
// would not start.
func helmValues(logLevel int) map[string]any {
	image := map[string]any{}
	for _, s := range standin.Releases {
		image[filepath.Base(s.Image)] = map[string]any{"image": standInImage(s)}
	}
	return map[string]any{
		"csiNode": map[string]any{
			"logLevel":     logLevel,
			"featureGates": map[string]any{"VolumeCondition": true, "VolumeHealth": true},
			"poolGuard":    testPoolGuard,
			"maxVolumes":   maxVolumesPerNode,
		},
		"sidecars": map[string]any{
			"registrar": image["csi-node-driver-registrar"],
		},
		"snapshots": map[string]any{"enabled": true},
		"pools":     []any{map[string]any{"name": fastPool, "ratio": fastPoolRatio}},
	}
}

// helmConfig is the Helm SDK's view of the cluster, as helm
// --kubeconfig <admin> -n kube-system has it, releases kept in Secrets.
func helmConfig(t *testing.T) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	ns := daemonSetNamespace
	flags.KubeConfig, flags.Namespace = &c.admin, &ns
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, daemonSetNamespace, "secret"); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The Helm SDK's actions as the helm command runs them without --wait:
// they wait for hooks only (the chart has none); the test waits for the
// pods itself.
func helmInstall(cfg *action.Configuration) *action.Install {
	a := action.NewInstall(cfg)
	a.ReleaseName, a.Namespace, a.WaitStrategy = helmRelease, daemonSetNamespace, kube.HookOnlyStrategy
	return a
}

func helmUpgrade(cfg *action.Configuration) *action.Upgrade {
	a := action.NewUpgrade(cfg)
	a.Namespace, a.WaitStrategy = daemonSetNamespace, kube.HookOnlyStrategy
	return a
}

func helmUninstall(cfg *action.Configuration) *action.Uninstall {
	a := action.NewUninstall(cfg)
	a.WaitStrategy = kube.HookOnlyStrategy
	return a
}

// driverPods returns the UID of every node's converge pod.
func driverPods(t *testing.T) map[string]types.UID {
	t.Helper()
	out := map[string]types.UID{}
	for _, n := range c.nodes {
		p, err := n.driverPod(context.Background())
		if err != nil || p == nil {
			t.Fatalf("the converge pod of %s: %v", n.node, err)
		}
		out[n.node] = p.UID
	}
	return out
}

// withoutDriver waits until no converge pod is left on any node: neither
// the node pods nor the node agent's.
func withoutDriver(t *testing.T) {
	t.Helper()
	poll(t, 2*time.Minute, "converge's pods gone", func() (bool, string) {
		left := 0
		for _, sel := range []string{daemonSetLabel, nodeAgentLabel} {
			pods, err := c.client.CoreV1().Pods(daemonSetNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return false, err.Error()
			}
			left += len(pods.Items)
		}
		return left == 0, strconv.Itoa(left) + " pods"
	})
}

// reinstallDeploy puts the run's kustomization of deploy/ back, as the
// tests after this one use it, and waits for every node's pods.
func reinstallDeploy(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := c.installDriver(ctx); err != nil {
		t.Fatalf("installing deploy/ again: %v", err)
	}
	for _, n := range c.nodes {
		if err := n.waitDriver(ctx); err != nil {
			t.Fatalf("deploy/'s pod on %s: %v", n.node, err)
		}
		if err := n.waitAgent(ctx); err != nil {
			t.Fatalf("deploy/'s node agent on %s: %v", n.node, err)
		}
	}
}

// The release installed for real, from its files as make release makes
// them (checked against their SHA256SUMS, its image archive imported into
// every node's containerd), its packaged chart through the Helm SDK as
// helm install does, with the chart's own image, in place of the run's
// kustomization of deploy/ (taken out, put back at the end): every node's
// pod Ready, running the release's image, and the driver registered; a
// pod writes to a claim; an upgrade that changes csi-node's log level
// replaces every node's pod under the published volume, which the writer
// goes on writing to; the uninstall says the CSIDriver is kept, which the
// volumes' PVs need, and leaves the data: the image stays on its node and
// the writer writes on through its mounts. deploy/ installed again takes
// the volume over, and it is released through it.
func TestHelmChart(t *testing.T) {
	ctx := context.Background()
	cfg := helmConfig(t)
	release := awaitRelease(t)
	ch, err := loader.Load(release.Chart)
	if err != nil {
		t.Fatal(err)
	}
	snapshotsSettled(t)
	if _, err := c.kubectl(ctx, "delete", "-k", filepath.Join(c.dir, "install"), "--wait=true"); err != nil {
		t.Fatal(err)
	}
	installed := false
	t.Cleanup(func() {
		if installed {
			if _, err := helmUninstall(cfg).Run(helmRelease); err != nil {
				t.Errorf("uninstalling the release: %v", err)
			}
			withoutDriver(t)
		}
		if _, err := c.client.AppsV1().DaemonSets(daemonSetNamespace).Get(ctx, daemonSetName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			reinstallDeploy(t)
		}
	})
	withoutDriver(t)

	rel, err := helmInstall(cfg).RunWithContext(ctx, ch, helmValues(4))
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	installed = true
	notes := rel.(*helmrelease.Release).Info.Notes
	if !strings.Contains(notes, "leaves every volume's data on its node's disk") {
		t.Errorf("the install's notes do not say what an uninstall leaves:\n%s", notes)
	}
	t.Logf("helm install: release %s, notes:\n%s", helmRelease, notes)
	for _, n := range c.nodes {
		if err := n.waitDriver(ctx); err != nil {
			t.Fatalf("the chart's pod on %s: %v", n.node, err)
		}
	}
	pods, err := c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ours := 0
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			if ctr.Name == "csi-node" || ctr.Name == nodeAgentContainer || ctr.Name == "converge-controller" {
				ours++
				if ctr.Image != release.ImageRef {
					t.Errorf("%s/%s runs %s, not the release's image %s", p.Name, ctr.Name, ctr.Image, release.ImageRef)
				}
			}
		}
	}
	if ours < len(c.nodes) {
		t.Errorf("%d containers of csi-node, node-agent or converge-controller in %s, want one per node at least", ours, daemonSetNamespace)
	}

	pod, v := writerPod(t, "helm-writer")
	mounts := v.mounts(t, pod)
	before := counted(t, pod.Name)

	olds := driverPods(t)
	if _, err := helmUpgrade(cfg).RunWithContext(ctx, helmRelease, ch, helmValues(5)); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	for _, n := range c.nodes {
		p := waitReplacedPod(t, n, olds[n.node])
		if args := containerArgs(p, "csi-node"); !strings.Contains(args, "-v=5") || strings.Contains(args, "-v=4") {
			t.Errorf("after the upgrade, csi-node on %s runs with %s, want -v=5", n.node, args)
		}
	}
	upgraded := counted(t, pod.Name)
	if upgraded <= before {
		t.Errorf("the writer wrote nothing across the upgrade: %d values before, %d after", before, upgraded)
	}

	res, err := helmUninstall(cfg).Run(helmRelease)
	if err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	installed = false
	t.Logf("helm uninstall: %s", res.Info)
	if !strings.Contains(res.Info, "kept due to the resource policy") || !strings.Contains(res.Info, contract.DefaultDriverName) {
		t.Errorf("the uninstall does not say the CSIDriver is kept: %q", res.Info)
	}
	if _, err := c.client.StorageV1().CSIDrivers().Get(ctx, contract.DefaultDriverName, metav1.GetOptions{}); err != nil {
		t.Errorf("the CSIDriver after the uninstall: %v", err)
	}
	withoutDriver(t)
	if _, err := os.Stat(v.image()); err != nil {
		t.Errorf("the volume's image after the uninstall: %v", err)
	}
	poll(t, 30*time.Second, "the writer writing on without converge", func() (bool, string) {
		n := counted(t, pod.Name)
		return n > upgraded, strconv.Itoa(n) + " values"
	})

	reinstallDeploy(t)
	afterReplacement(t, pod, v, upgraded, mounts, "after-helm")
}

// containerArgs are the arguments of the pod's container called name.
func containerArgs(pod *corev1.Pod, name string) string {
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name == name {
			return strings.Join(ctr.Args, " ")
		}
	}
	return ""
}

// awaitRelease waits for the release's files, checks them against their
// SHA256SUMS as a user would (sha256sum -c), and imports its image into
// every node's containerd, as a user without a registry loads it
// (ctr images import).
func awaitRelease(t *testing.T) *dist.Release {
	t.Helper()
	select {
	case <-c.release.done:
	case <-time.After(15 * time.Minute):
		t.Fatal("the release's files: not made in 15 minutes")
	}
	if c.release.err != nil {
		t.Fatalf("make release: %v", c.release.err)
	}
	r := c.release.rel
	if err := dist.Verify(filepath.Dir(r.Chart)); err != nil {
		t.Fatalf("the release's checksums: %v", err)
	}
	archive := r.Images[dockerfile.Host().String()]
	for _, n := range c.nodes {
		if out, err := n.ctr("images", "import", archive); err != nil {
			t.Fatalf("importing the release's image into %s's containerd: %v: %s", n.node, err, out)
		}
	}
	t.Logf("release %s: image %s, files %v", r.Version, r.ImageRef, r.Files)
	return r
}

// snapshotsSettled waits until no snapshot or group snapshot content of
// converge is still being made or deleted, before a test takes deploy/
// away: the csi-snapshotter that comes back before its classes (a chart
// installs the classes, kinds Helm does not know, after the DaemonSet)
// would fail such a content with "volumegroupsnapshotclass ... not found"
// and a warning the run's invariants refuse. It fails naming the contents
// still under way after two minutes.
func snapshotsSettled(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	poll(t, 2*time.Minute, "converge's snapshot contents made or gone", func() (bool, string) {
		var busy []string
		for _, gvr := range []schema.GroupVersionResource{snapshotContents, volumeGroupSnapshotContents} {
			list, err := c.dynamic.Resource(gvr).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, o := range list.Items {
				if driver, _, _ := unstructured.NestedString(o.Object, "spec", "driver"); driver != contract.DefaultDriverName {
					continue
				}
				ready, _, _ := unstructured.NestedBool(o.Object, "status", "readyToUse")
				if o.GetDeletionTimestamp() != nil || !ready {
					busy = append(busy, gvr.Resource+"/"+o.GetName())
				}
			}
		}
		return len(busy) == 0, strings.Join(busy, ", ")
	})
}

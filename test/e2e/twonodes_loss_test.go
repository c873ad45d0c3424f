package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/test/e2e/runs"
)

// statefulSet makes a StatefulSet called name of one pod that prefers node
// prefer, with a claim template "data" of class, mounted at /data; it goes,
// with its claim, when t ends.
func statefulSet(t *testing.T, name, class, prefer string) {
	t.Helper()
	spec := podSpecOf(podSpec{prefer: prefer})
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: dataDir}}
	labels := map[string]string{"app": name}
	set := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To[int32](1),
			ServiceName: name,
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template:    corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{rwo},
					StorageClassName: &class,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
				},
			}},
		},
	}
	ctx := context.Background()
	if _, err := c.client.AppsV1().StatefulSets(ns).Create(ctx, set, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StatefulSet %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := c.client.AppsV1().StatefulSets(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete StatefulSet %s: %v", name, err)
		}
		deletePod(t, name+"-0")
		claim := "data-" + name + "-0"
		if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{}); err == nil {
			release(t, boundVolume(t, claim), claim)
		}
	})
}

// outOfService is the taint with which an operator says a node is shut
// down, as Kubernetes' non-graceful node shutdown procedure writes it.
const outOfService = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"

// shutDownNode takes node n out of the cluster as a dead machine leaves it,
// its containers frozen and its kubelet stopped, and taints its Node out
// of service as the non-graceful node shutdown procedure has an operator
// do; the Node is kept, and turns NotReady once the node lifecycle
// controller misses the kubelet. It comes back (back) when t ends, if the
// test has not brought it back: its kubelet started, then, Ready again,
// the taint taken off, as the procedure has it.
func shutDownNode(t *testing.T, n *kubeNode) (back func()) {
	t.Helper()
	ctx := context.Background()
	out, err := n.ctr("tasks", "ls", "-q")
	if err != nil {
		t.Fatalf("listing %s's containers: %v: %s", n.node, err, out)
	}
	tasks := strings.Fields(out)
	for _, id := range tasks {
		if out, err := n.ctr("tasks", "pause", id); err != nil {
			t.Fatalf("freezing container %s of %s: %v: %s", id, n.node, err, out)
		}
	}
	if err := n.kubelet.stop(30 * time.Second); err != nil {
		t.Fatalf("stopping %s's kubelet: %v", n.node, err)
	}
	if out, err := c.kubectl(ctx, "taint", "node", n.node, outOfService); err != nil {
		t.Fatalf("tainting node %s out of service: %v: %s", n.node, err, out)
	}
	t.Logf("node %s is shut down: %d containers frozen, its kubelet stopped, its Node tainted %s", n.node, len(tasks), outOfService)
	returned := false
	back = func() {
		if returned {
			return
		}
		returned = true
		for _, id := range tasks {
			n.ctr("tasks", "resume", id)
		}
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		if err := n.runKubelet(); err != nil {
			t.Fatalf("starting %s's kubelet again: %v", n.node, err)
		}
		poll(t, 2*time.Minute, "node "+n.node+" Ready", func() (bool, string) {
			node, err := c.client.CoreV1().Nodes().Get(ctx, n.node, metav1.GetOptions{})
			return err == nil && nodeReady(node), fmt.Sprint(err)
		})
		if out, err := c.kubectl(ctx, "taint", "node", n.node, outOfService+"-"); err != nil {
			t.Fatalf("taking the out-of-service taint off node %s: %v: %s", n.node, err, out)
		}
		if err := n.waitDriver(ctx); err != nil {
			t.Fatalf("node %s back: %v", n.node, err)
		}
		t.Logf("node %s is back: its kubelet runs, its taint is off and it runs its converge pod", n.node)
	}
	t.Cleanup(back)
	return back
}

// nodeReady reports whether the node's Ready condition is true.
func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// eventsOf lists the events of reason on the object called name.
func eventsOf(name, reason string) []string {
	evs, err := c.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Message)
	}
	return out
}

// TestTwoNodesNodeLoss shuts the second node down, with a StatefulSet's pod
// on it in each of two classes, one that retains (the default) and one
// that releases (converge.csi.dev/on-node-loss: release, which each PV
// records), and says so with the out-of-service taint, as Kubernetes'
// non-graceful node shutdown has an operator do; then brings it back.
// Once the node is NotReady, converge-controller acts. Retained, the pod
// stays Pending (it can only run there) and the claim says why; released,
// converge-controller deletes the claim and the pod and the StatefulSet
// runs a new pod on the first node with a new, empty volume, the old
// volume's PersistentVolume gone. Back, the node runs the retained pod with
// its data, and csi-node gc there (docs/operations.md's pipeline) finds
// exactly the released volume's image left over.
func TestTwoNodesNodeLoss(t *testing.T) {
	b := secondNode(t)
	keep := storageClass(t, "converge-retain", nil)
	drop := storageClass(t, "converge-release", map[string]string{"converge.csi.dev/on-node-loss": "release"})
	// Both nodes' capacity for both classes first: without it the
	// scheduler passes over a node, whatever the pod prefers.
	for _, class := range []string{keep, drop} {
		waitCapacities(t, class, b, func(a, bb *resource.Quantity) bool { return !a.IsZero() && !bb.IsZero() })
	}
	statefulSet(t, "kept", keep, b.node)
	statefulSet(t, "released", drop, b.node)
	for _, name := range []string{"kept", "released"} {
		pod := waitRunning(t, name+"-0")
		if pod.Spec.NodeName != b.node {
			t.Fatalf("pod %s-0 runs on %s, want %s", name, pod.Spec.NodeName, b.node)
		}
		mustExec(t, pod.Name, "echo "+name+" > "+dataDir+"/f && sync")
	}
	keptVol, droppedVol := boundVolume(t, "data-kept-0"), boundVolume(t, "data-released-0")
	pv, err := c.client.CoreV1().PersistentVolumes().Get(context.Background(), droppedVol.pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pv.Finalizers, provisionerFinalizer) {
		t.Fatalf("the volume to release has finalizers %v; want the provisioner's", pv.Finalizers)
	}
	// Each volume's choice is its own, recorded in its PV when it was
	// provisioned (retain when its class names none).
	for _, want := range []struct{ pv, choice string }{{droppedVol.pv, "release"}, {keptVol.pv, "retain"}} {
		v, err := c.client.CoreV1().PersistentVolumes().Get(context.Background(), want.pv, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := v.Spec.CSI.VolumeAttributes["converge.csi.dev/on-node-loss"]; got != want.choice {
			t.Errorf("PV %s records on-node-loss %q, want %q", want.pv, got, want.choice)
		}
	}

	// What the loss causes on purpose: converge-controller's warnings (the
	// pending one while the tainted node still reports Ready) and
	// releases, and the node lifecycle controller's NodeNotReady on the
	// node's converge pod and its node agent's.
	for _, v := range []volume{keptVol, droppedVol} {
		expectWarning(t, "NodeLossPending", "PersistentVolume//"+v.pv)
	}
	for _, claim := range []string{"data-kept-0", "data-released-0"} {
		expectWarning(t, "NodeLossPending", "PersistentVolumeClaim/"+ns+"/"+claim)
	}
	expectWarning(t, "NodeLost", "PersistentVolume//"+keptVol.pv)
	expectWarning(t, "NodeLost", "PersistentVolumeClaim/"+ns+"/data-kept-0")
	expectWarning(t, "ClaimReleased", "PersistentVolume//"+droppedVol.pv)
	expectWarning(t, "ClaimReleased", "PersistentVolumeClaim/"+ns+"/data-released-0")
	expectWarning(t, "PodDeleted", "Pod/"+ns+"/released-0")
	expectWarning(t, "VolumeReleased", "PersistentVolume//"+droppedVol.pv)
	driver, err := b.driverPod(context.Background())
	if err != nil || driver == nil {
		t.Fatalf("the converge pod of %s: %v", b.node, err)
	}
	expectWarning(t, "NodeNotReady", "Pod/"+daemonSetNamespace+"/"+driver.Name)
	// And on the node's agent pod, a DaemonSet's of its own.
	agents, err := c.client.CoreV1().Pods(daemonSetNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: nodeAgentLabel, FieldSelector: "spec.nodeName=" + b.node})
	if err != nil || len(agents.Items) == 0 {
		t.Fatalf("the node agent pod of %s: %v", b.node, err)
	}
	for _, a := range agents.Items {
		expectWarning(t, "NodeNotReady", "Pod/"+daemonSetNamespace+"/"+a.Name)
	}
	// Frozen, its containers' connections and leases lapse; once thawed,
	// a sidecar may exit and be restarted, held back by the kubelet's
	// crash-loop back-off when it had restarted in the last minutes (the
	// resizer does whenever its Lease moved off the node).
	intendDriverRestart(driver)
	expectWarning(t, "BackOff", "Pod/"+daemonSetNamespace+"/"+driver.Name)

	back := shutDownNode(t, b)
	// Released: the StatefulSet's pod runs on the first node, with a new
	// volume there, empty; the old PersistentVolume is gone.
	poll(t, 3*time.Minute, "the released StatefulSet's pod running on "+c.node, func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), "released-0", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName == c.node && p.Status.Phase == corev1.PodRunning, fmt.Sprintf("%s on %q%s", p.Status.Phase, p.Spec.NodeName, podEvents("released-0"))
	})
	if v := boundVolume(t, "data-released-0"); v.n != c.kubeNode || v.pv == droppedVol.pv {
		t.Errorf("the released claim's new volume: %s on %s, want a new one on %s", v.pv, v.n.node, c.node)
	}
	if out, err := execIn(t, "released-0", "cat "+dataDir+"/f"); err == nil {
		t.Errorf("the new volume holds the lost one's data: %s", out)
	}
	if _, err := c.client.CoreV1().PersistentVolumes().Get(context.Background(), droppedVol.pv, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the released volume's PersistentVolume %s: %v, want it gone", droppedVol.pv, err)
	}
	// The PV's finalizer, which the gone node's provisioner would have
	// taken off after DeleteVolume, was taken off by converge-controller,
	// which says so in an event. Events are written after the act: the
	// new pod can run before it (the real provisioner makes its volume at
	// once), so it is waited for.
	poll(t, 30*time.Second, "a VolumeReleased event on "+droppedVol.pv, func() (bool, string) {
		return len(eventsOf(droppedVol.pv, "VolumeReleased")) > 0, ""
	})
	// Retained: the pod, made again, stays Pending, the scheduler saying
	// why; the claim's event says what happened and what to do.
	poll(t, 3*time.Minute, "the retained StatefulSet's pod Pending for the volume's node", func() (bool, string) {
		events := podEvents("kept-0")
		return strings.Contains(events, "didn't match PersistentVolume's node affinity"), events
	})
	if p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), "kept-0", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("the retained pod: %v, on %q; want it Pending", err, p.Spec.NodeName)
	}
	evs := eventsOf("data-kept-0", "NodeLost")
	if len(evs) == 0 || !strings.Contains(evs[0], "node "+b.node+" carries the node.kubernetes.io/out-of-service taint and is not Ready") || !strings.Contains(evs[0], "delete the claim") {
		t.Errorf("the retained claim's NodeLost events: %q", evs)
	}
	t.Logf("the retained claim's event: %s", strings.Join(evs, "; "))
	if _, err := c.client.CoreV1().PersistentVolumes().Get(context.Background(), keptVol.pv, metav1.GetOptions{}); err != nil {
		t.Errorf("the retained volume: %v", err)
	}

	back()
	pod := waitRunning(t, "kept-0")
	if pod.Spec.NodeName != b.node {
		t.Errorf("the retained pod runs on %s, want %s", pod.Spec.NodeName, b.node)
	}
	if out := mustExec(t, "kept-0", "cat "+dataDir+"/f"); strings.TrimSpace(out) != "kept" {
		t.Errorf("the retained volume's data back: %q", out)
	}
	// The released volume's image is left on the node: the kubelet that
	// came back unmounts it (its pod is gone), and gc finds it alone.
	var out string
	poll(t, 2*time.Minute, "csi-node gc on "+b.node+" finding the released volume", func() (bool, string) {
		var err error
		out, err = docsGC(t, b.node, "--min-age=0")
		return err == nil && strings.Contains(out, droppedVol.handle+" ") && !strings.Contains(out, "kept: staged"), fmt.Sprint(out, err)
	})
	t.Logf("csi-node gc on %s:\n%s", b.node, out)
	if n := strings.Count(out, "left over"); n != 1 {
		t.Errorf("csi-node gc on %s lists %d left over, want the released volume alone", b.node, n)
	}
	out, err = docsGC(t, b.node, "--min-age=0", "--delete")
	if err != nil || !strings.Contains(out, "deleted") {
		t.Errorf("csi-node gc --delete: %v\n%s", err, out)
	}
	if _, err := os.Stat(droppedVol.image()); !os.IsNotExist(err) {
		t.Errorf("the released volume's image after gc --delete: %v", err)
	}
	if _, err := os.Stat(keptVol.image()); err != nil {
		t.Errorf("the retained volume's image after gc --delete: %v", err)
	}
}

// docsGC runs the csi-node gc pipeline of docs/operations.md for node,
// with extra arguments to csi-node gc.
func docsGC(t *testing.T, node string, args ...string) (string, error) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.repo, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var pipeline string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "| kubectl exec") && strings.Contains(l, "csi-node gc") {
			pipeline = l
		}
	}
	if pipeline == "" {
		t.Fatal("docs/operations.md has no csi-node gc pipeline (a line with | kubectl exec ... csi-node gc)")
	}
	cmd := exec.Command("sh", "-c", pipeline+" "+strings.Join(args, " "))
	cmd.Env = append(os.Environ(), "PATH="+c.bin+":"+os.Getenv("PATH"), "KUBECONFIG="+c.admin, "NODE="+node)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestTwoNodesDrain drains the node of a StatefulSet's pod: the pod is
// evicted, its volume unpublished and unstaged there (the image kept), the
// pod made again stays Pending, the scheduler saying it can only run on the
// cordoned node; uncordoned, the node runs it again with its data.
func TestTwoNodesDrain(t *testing.T) {
	b := secondNode(t)
	waitCapacities(t, "converge", b, func(a, bb *resource.Quantity) bool { return !a.IsZero() && !bb.IsZero() })
	statefulSet(t, "drained", "converge", b.node)
	pod := waitRunning(t, "drained-0")
	if pod.Spec.NodeName != b.node {
		t.Fatalf("pod drained-0 runs on %s, want %s", pod.Spec.NodeName, b.node)
	}
	mustExec(t, pod.Name, "echo drained > "+dataDir+"/f && sync")
	v := boundVolume(t, "data-drained-0")
	ctx := context.Background()
	uncordon := func() {
		if out, err := c.kubectl(ctx, "uncordon", b.node); err != nil {
			t.Errorf("uncordon: %v: %s", err, out)
		}
	}
	t.Cleanup(uncordon)
	out, err := c.kubectl(ctx, "drain", b.node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m")
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	t.Logf("kubectl drain %s:\n%s", b.node, out)
	poll(t, 2*time.Minute, "the pod made again Pending for the cordoned node", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ns).Get(ctx, "drained-0", metav1.GetOptions{})
		if err != nil || p.UID == pod.UID || p.Spec.NodeName != "" {
			return false, fmt.Sprint(err)
		}
		events := podEvents("drained-0")
		return strings.Contains(events, "didn't match PersistentVolume's node affinity") && strings.Contains(events, "unschedulable"), events
	})
	t.Logf("why the pod is Pending:%s", podEvents("drained-0"))
	for _, m := range runs.MountsIn(b.ns.mountinfo(), nodeKubeletDir) {
		if strings.Contains(m, v.pv) {
			t.Errorf("after the drain, still mounted on %s: %s", b.node, m)
		}
	}
	for dev, file := range runs.LoopsBackedUnder(c.dir) {
		if file == v.image() {
			t.Errorf("after the drain, loop device %s still attached to %s", dev, file)
		}
	}
	if _, err := os.Stat(v.image()); err != nil {
		t.Errorf("after the drain, the image: %v", err)
	}
	uncordon()
	pod = waitRunning(t, "drained-0")
	if pod.Spec.NodeName != b.node {
		t.Errorf("after the uncordon the pod runs on %s, want %s", pod.Spec.NodeName, b.node)
	}
	if out := mustExec(t, "drained-0", "cat "+dataDir+"/f"); strings.TrimSpace(out) != "drained" {
		t.Errorf("the data after the drain: %q", out)
	}
}

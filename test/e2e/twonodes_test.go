package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/test/e2e/invariants"
	"github.com/converge-csi/converge/test/e2e/privilege"
)

// The two-node tests join a second node to the cluster (the first time one
// of them runs) and use both. Each node has its own kubelet, containerd,
// csi-node, data directory and provisioner; the resizer works on one node
// for the whole cluster. The second node's data directory is a filesystem
// of its own, too small for some claims. Its kubelet is the oldest of
// olderKubelets (kubelets.go), as on a cluster whose nodes are upgraded one
// by one: every two-node test passes with a v1.35 kubelet on it (none
// needs what v1.35 lacks).

const (
	// secondNodeName must resolve to 127.0.0.1 on every machine: the API
	// server reaches a kubelet at its node's host name (the first node's is
	// the machine's).
	secondNodeName = "localhost"
	// secondDataDir is the size of the second node's data directory:
	// room for TestOlderKubelets' xfs grown to 384 MiB, and for little
	// else.
	secondDataDir = 448 << 20
	// compareDataDir is the second node's under make compare, which puts
	// half of a hundred claims there (a sparse image: what is written
	// takes the machine's disk).
	compareDataDir = 8 << 30
)

// secondDataDirSize is the size of the second node's data directory.
func secondDataDirSize() int64 {
	if *compareFull || *soakFor > 0 {
		return compareDataDir
	}
	return secondDataDir
}

var (
	// secondMu guards second and secondErr.
	secondMu  sync.Mutex
	second    *kubeNode
	secondErr error
)

// secondNode joins the second node to the cluster once, and returns it.
func secondNode(t *testing.T) *kubeNode {
	t.Helper()
	secondMu.Lock()
	defer secondMu.Unlock()
	if second == nil && secondErr == nil {
		if c.node == secondNodeName {
			secondErr = fmt.Errorf("the machine's host name is %s, the second node's name", secondNodeName)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			start := time.Now()
			second, secondErr = c.addNode(ctx, secondNodeName, secondDataDirSize(), oldestKubelet())
			cancel()
			fmt.Printf("e2e: second node %s (kubelet %s) joined in %.1fs\n", secondNodeName, oldestKubelet(), time.Since(start).Seconds())
		}
	}
	if secondErr != nil {
		t.Fatalf("joining the second node: %v", secondErr)
	}
	return second
}

// claimOn makes a filesystem claim called name with a pod on node n (the
// claim's name, "-writer"), and returns the pod and the claim's volume,
// which must be on n.
func claimOn(t *testing.T, n *kubeNode, name string) (*corev1.Pod, volume) {
	t.Helper()
	claim(t, name, fs, rwo)
	writer := startPod(t, podSpec{name: name + "-writer", claims: []string{name}, node: n.node})
	v := boundVolume(t, name)
	if v.n != n {
		t.Fatalf("the volume of a pod scheduled to %s was provisioned on %s", n.node, v.n.node)
	}
	return writer, v
}

// A WaitForFirstConsumer claim is provisioned on the node its pod was
// scheduled to, by that node's provisioner and csi-node alone; a second pod
// of the claim, with no say about nodes, goes to the same node (the
// volume's node affinity) and reads the first pod's data.
func TestTwoNodesVolumeFollowsItsPod(t *testing.T) {
	b := secondNode(t)
	writer, v := claimOn(t, b, "follow")
	if _, err := os.Stat(v.image()); err != nil {
		t.Errorf("no image on %s: %v", b.node, err)
	}
	if _, err := os.Stat(c.kubeNode.image(v.handle)); err == nil {
		t.Errorf("an image of %s on %s too", v.handle, c.node)
	}
	mustExec(t, writer.Name, "echo from-"+b.node+" > "+dataDir+"/f && sync")
	deletePod(t, writer.Name)

	reader := startPod(t, podSpec{name: "follow-reader", claims: []string{"follow"}})
	if reader.Spec.NodeName != b.node {
		t.Errorf("the second pod of the volume went to %s, want %s", reader.Spec.NodeName, b.node)
	}
	if got := mustExec(t, reader.Name, "cat "+dataDir+"/f"); got != "from-"+b.node {
		t.Errorf("the second pod read %q", got)
	}
	if calls := c.kubeNode.callsFor(t, v.handle); len(calls) > 0 {
		t.Errorf("%s's csi-node was asked about a volume of %s:%s", c.node, b.node, describe(calls))
	}
	if n := count(v.calls(t), "NodeStageVolume", "OK"); n < 2 {
		t.Errorf("NodeStageVolume answered OK %d times on %s, want once per pod:%s", n, b.node, describe(v.calls(t)))
	}
	release(t, v, "follow", reader.Name)
}

// The second node's data directory is too small for a claim: its
// provisioner publishes that in its CSIStorageCapacity, and a pod that
// prefers that node is scheduled to the first node instead, where its
// volume is provisioned. The claim is just past what the second node can
// hold (448 MiB of data directory, or 8 GiB when a soak or make compare
// joined it first), and within what the first can.
func TestTwoNodesCapacitySteersScheduling(t *testing.T) {
	b := secondNode(t)
	var want resource.Quantity
	// Both nodes' capacity for the class, as the scheduler reads it.
	waitCapacities(t, "converge", b, func(a, bb *resource.Quantity) bool {
		want = *bb
		want.Add(resource.MustParse("64Mi"))
		return a.Cmp(want) >= 0
	})
	size := want.String()
	claimOf(t, "roomy", fs, rwo, size, "converge")
	pod := startPod(t, podSpec{name: "roomy", claims: []string{"roomy"}, prefer: b.node})
	if pod.Spec.NodeName != c.node {
		t.Errorf("a pod that prefers %s, whose data directory cannot hold its %s claim, went to %s", b.node, size, pod.Spec.NodeName)
	}
	v := boundVolume(t, "roomy")
	if v.n.node != c.node {
		t.Errorf("its volume was provisioned on %s, want %s", v.n.node, c.node)
	}
	if calls := b.callsFor(t, v.handle); len(calls) > 0 {
		t.Errorf("%s's csi-node was asked about a volume it cannot hold:%s", b.node, describe(calls))
	}
	release(t, v, "roomy", pod.Name)
}

// A claim on the first node is expanded online while the cluster's resizer
// runs beside the second node's csi-node: that node's ControllerExpandVolume
// grows nothing (the image is not there) and asks for node expansion, and
// the first node's kubelet grows the image, the device and the filesystem
// through its own csi-node. Before, the second node answered NOT_FOUND for
// the first node's volume, and the claim never grew.
func TestTwoNodesExpansionWhereverTheResizerRuns(t *testing.T) {
	b := secondNode(t)
	// xfs grows online on this machine (a mounted ext4 needs
	// CAP_SYS_RESOURCE), and needs 300 MiB.
	class := xfsClass(t)
	claimOf(t, "grow", fs, rwo, "320Mi", class)
	pod := startPod(t, podSpec{name: "grow", claims: []string{"grow"}, node: c.node})
	v := boundVolume(t, "grow")
	if v.n.node != c.node {
		t.Fatalf("the volume of a pod on %s was provisioned on %s", c.node, v.n.node)
	}
	mustExec(t, pod.Name, "echo before-growth > "+dataDir+"/f && sync")
	size := func() int64 {
		out := mustExec(t, pod.Name, "df -k "+dataDir+" | tail -1 | awk '{print $2}'")
		n, err := strconv.ParseInt(out, 10, 64)
		if err != nil {
			t.Fatalf("df in the pod: %q: %v", out, err)
		}
		return n << 10
	}
	before := size()

	// The resizer's leader moves to the second node.
	moveResizerLease(t, b)
	const grown = "448Mi"
	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, grown)
	if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Patch(context.Background(), "grow", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("grow the claim: %v", err)
	}
	want := resource.MustParse(grown)
	poll(t, 3*time.Minute, "claim grow at "+grown, func() (bool, string) {
		pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), "grow", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got := pvc.Status.Capacity[corev1.ResourceStorage]
		return got.Cmp(want) >= 0, fmt.Sprintf("capacity %s, allocated %v, conditions %v%s", got.String(), pvc.Status.AllocatedResourceStatuses,
			pvc.Status.Conditions, describe(v.calls(t)))
	})
	// The kubelet marks the claim grown once NodeExpandVolume answered,
	// which is once the filesystem grew.
	after := size()
	if after-before < 100<<20 {
		t.Errorf("the pod's filesystem was %d bytes before the growth and is %d after; want at least 100 MiB more", before, after)
	}
	t.Logf("the pod's filesystem: %d bytes before, %d after", before, after)
	if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != "before-growth" {
		t.Errorf("after the growth the pod read %q", got)
	}
	if n := count(v.calls(t), "NodeExpandVolume", "OK"); n < 1 {
		t.Errorf("NodeExpandVolume never answered OK on %s:%s", c.node, describe(v.calls(t)))
	}
	if fi, err := os.Stat(v.image()); err != nil || fi.Size() < want.Value() {
		t.Errorf("the image on %s after the growth: %v, %v; want %d bytes", c.node, fi, err, want.Value())
	}
	if calls := b.callsFor(t, v.handle); count(calls, "ControllerExpandVolume", "OK") == 0 || count(calls, "ControllerExpandVolume", "OK") != len(calls) {
		t.Errorf("%s's csi-node, beside the resizer, was asked %v about a volume of %s; want ControllerExpandVolume = OK only", b.node, calls, c.node)
	}
	if _, err := os.Stat(b.image(v.handle)); err == nil {
		t.Errorf("an image of %s on %s", v.handle, b.node)
	}
	release(t, v, "grow", pod.Name)
}

// Deleting a pod on the second node leaves the first node's volume, and
// the pod that uses it, untouched; csi-node's container killed on the
// first node does not disturb the second: a new pod there stages and
// publishes its volume meanwhile, and the first node's pod keeps its
// mounts and data.
func TestTwoNodesNodesAreIndependent(t *testing.T) {
	b := secondNode(t)
	claim(t, "on-a", fs, rwo)
	claim(t, "on-b", fs, rwo)
	podA := startPod(t, podSpec{name: "on-a", claims: []string{"on-a"}, node: c.node})
	podB := startPod(t, podSpec{name: "on-b", claims: []string{"on-b"}, node: b.node})
	va, vb := boundVolume(t, "on-a"), boundVolume(t, "on-b")
	if va.n.node != c.node || vb.n.node != b.node {
		t.Fatalf("volumes on %s and %s, want %s and %s", va.n.node, vb.n.node, c.node, b.node)
	}
	mustExec(t, podA.Name, "echo a > "+dataDir+"/f && sync")
	mustExec(t, podB.Name, "echo b > "+dataDir+"/f && sync")
	mountsA := va.mounts(t, podA)

	deletePod(t, podB.Name)
	vb.waitCalls(t, "NodeUnstageVolume", 1)
	if now := va.mounts(t, podA); now != mountsA {
		t.Errorf("deleting a pod on %s changed the mounts on %s: %s, now %s", b.node, c.node, mountsA, now)
	}
	if n := count(va.calls(t), "NodeUnpublishVolume", "OK") + count(va.calls(t), "NodeUnstageVolume", "OK"); n != 0 {
		t.Errorf("deleting a pod on %s tore down a volume on %s:%s", b.node, c.node, describe(va.calls(t)))
	}

	restarts, err := c.killContainer(context.Background(), t, "csi-node")
	if err != nil {
		t.Fatal(err)
	}
	podB2 := startPod(t, podSpec{name: "on-b-again", claims: []string{"on-b"}, node: b.node})
	if got := mustExec(t, podB2.Name, "cat "+dataDir+"/f"); got != "b" {
		t.Errorf("with %s's csi-node down, the new pod on %s read %q", c.node, b.node, got)
	}
	if got := mustExec(t, podA.Name, "cat "+dataDir+"/f"); got != "a" {
		t.Errorf("with its csi-node down, the pod on %s read %q", c.node, got)
	}
	if err := c.waitRestarted(context.Background(), "csi-node", restarts); err != nil {
		t.Fatalf("csi-node on %s after its kill: %v", c.node, err)
	}
	if now := va.mounts(t, podA); now != mountsA {
		t.Errorf("the restart on %s remounted its volume: %s, now %s", c.node, mountsA, now)
	}
	release(t, vb, "on-b", podB2.Name)
	release(t, va, "on-a", podA.Name)
}

// A snapshot lives on its volume's node, and a claim restored from it, or
// cloned from the volume, is made there. A pod of such a claim that may
// only run on the other node is never given it: that node's csi-node
// answers RESOURCE_EXHAUSTED naming the source's node (the snapshot's or
// the volume's ID names it), the claim's selected node is dropped (as
// external-provisioner does), and nothing is made on the wrong node. A pod
// given the source's node, as docs/operations.md says to, runs there and reads
// what was written before. (A pod free to go anywhere is not enough: the
// scheduler does not know where a snapshot is, v1.37's no more than
// v1.36's, which picked the other node again at every retry in a run here.)
func TestTwoNodesRestoreStaysWithItsSnapshot(t *testing.T) {
	b := secondNode(t)
	writer, src := claimOn(t, b, "far-src")
	mustExec(t, writer.Name, "echo from-"+b.node+" > "+dataDir+"/f && sync")
	volumeSnapshot(t, "far-snap", "far-src")

	// The first node's csi-node refuses each (RESOURCE_EXHAUSTED, naming
	// the second), which external-provisioner reports as a warning before
	// it drops the selected node.
	expectWarning(t, "ProvisioningFailed", "PersistentVolumeClaim/"+ns+"/far-restored")
	expectWarning(t, "ProvisioningFailed", "PersistentVolumeClaim/"+ns+"/far-clone")
	claimFrom(t, "far-restored", "far-snap", true)
	refusedAndRescheduled(t, "far-restored", b)
	claimFrom(t, "far-clone", "far-src", false)
	refusedAndRescheduled(t, "far-clone", b)

	for _, made := range []string{"far-restored", "far-clone"} {
		if made == "far-clone" {
			// The second node's small data directory holds the source,
			// the clone and the clone's own snapshot, not the snapshot
			// taken before too.
			if err := c.dynamic.Resource(volumeSnapshots).Namespace(ns).Delete(context.Background(), "far-snap", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			poll(t, time.Minute, "the snapshot deleted on "+b.node, func() (bool, string) {
				entries, _ := os.ReadDir(filepath.Join(b.dataDir, "snapshots"))
				return len(entries) == 0, fmt.Sprint(entries)
			})
		}
		reader := startPod(t, podSpec{name: made + "-reader", claims: []string{made}, node: b.node})
		v := boundVolume(t, made)
		if v.n != b {
			t.Errorf("%s was provisioned on %s, want %s", made, v.n.node, b.node)
		}
		if got := mustExec(t, reader.Name, "cat "+dataDir+"/f"); got != "from-"+b.node {
			t.Errorf("%s holds %q", made, got)
		}
		release(t, v, made, reader.Name)
	}
	release(t, src, "far-src", writer.Name)
}

// refusedAndRescheduled binds a pod of claimName, which is to be made from
// a volume or snapshot of node far, to the first node, and checks that the
// first node's csi-node refuses the claim, RESOURCE_EXHAUSTED naming far,
// that its selected node is dropped and selected again, that nothing is
// made there and the claim stays Pending; then it deletes the pod.
func refusedAndRescheduled(t *testing.T, claimName string, far *kubeNode) {
	t.Helper()
	ctx := context.Background()
	pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The name the provisioner asks for the volume under.
	name := "pvc-" + string(pvc.UID)
	// The nodes selected for the claim, in turn ("" once dropped).
	w, err := c.client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + claimName, ResourceVersion: pvc.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var selected []string
	pinned := createPod(t, podSpec{name: claimName + "-pinned", claims: []string{claimName}, node: c.node})
	poll(t, 2*time.Minute, "the claim selected for "+c.node+", dropped, and selected again", func() (bool, string) {
		for drained := false; !drained; {
			select {
			case ev := <-w.ResultChan():
				if p, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok {
					sel := p.Annotations["volume.kubernetes.io/selected-node"]
					if len(selected) == 0 || selected[len(selected)-1] != sel {
						selected = append(selected, sel)
					}
				}
			default:
				drained = true
			}
		}
		return slices.Equal(selected[:min(len(selected), 3)], []string{c.node, "", c.node}), fmt.Sprintf("%q", selected)
	})
	refused := 0
	for _, call := range c.kubeNode.callsFor(t, name) {
		if call.method != "CreateVolume" {
			continue
		}
		if call.code != "ResourceExhausted" || !strings.Contains(call.msg, "on node "+far.node) {
			t.Errorf("%s's csi-node answered %s (%s), want RESOURCE_EXHAUSTED naming %s", c.node, call, call.msg, far.node)
		}
		refused++
	}
	if refused == 0 {
		t.Errorf("%s's csi-node was never asked for %s", c.node, claimName)
	}
	if pvc, err = c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claimName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending {
		t.Errorf("%s, made from a volume of %s, for a pod bound to %s, is %s, want Pending", claimName, far.node, c.node, pvc.Status.Phase)
	}
	if made, _ := filepath.Glob(filepath.Join(c.kubeNode.dataDir, name+"*")); len(made) > 0 {
		t.Errorf("an image of %s on %s: %v", claimName, c.node, made)
	}
	deletePod(t, pinned.Name)
}

// moveResizerLease makes the csi-resizer of node to's converge pod the
// cluster's one, through their Lease, as an administrator can: the Lease
// is given to it by name, the holder loses it at its next renewal (and its
// container starts again, as csi-lib-utils' leader election ends the
// process), and to's resizer, finding itself the holder, renews it. It
// waits until to's resizer says it leads and the holder before has
// stopped.
func moveResizerLease(t *testing.T, to *kubeNode) {
	t.Helper()
	ctx := context.Background()
	pod, err := to.driverPod(ctx)
	if err != nil || pod == nil {
		t.Fatalf("the converge pod of %s: %v", to.node, err)
	}
	leases := c.client.CoordinationV1().Leases(daemonSetNamespace)
	var from *kubeNode
	var fromRestarts int32 = -1
	already := false
	// The holder renews its Lease every few seconds, so an update made on
	// a copy read before a renewal conflicts: read it again and retry.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := leases.Get(ctx, privilege.ResizerLease, metav1.GetOptions{})
		if err != nil {
			return err
		}
		from, fromRestarts = nil, -1
		already = lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == pod.Name
		if already {
			return nil
		}
		for _, n := range c.nodes {
			if p, _ := n.driverPod(ctx); p != nil && lease.Spec.HolderIdentity != nil && p.Name == *lease.Spec.HolderIdentity {
				from = n
				for _, s := range p.Status.ContainerStatuses {
					if s.Name == "csi-resizer" {
						fromRestarts = s.RestartCount
					}
				}
			}
		}
		lease.Spec.HolderIdentity = ptr.To(pod.Name)
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("give the resizer's Lease to %s: %v", pod.Name, err)
	}
	if already {
		return
	}
	if from != nil {
		// Its exit meets the kubelet's crash-loop back-off when it
		// restarted in the last minutes (a Lease moved off it before).
		if p, _ := from.driverPod(ctx); p != nil {
			intendRestart(p, "csi-resizer")
			expect(invariants.Expected{Reason: "BackOff", Object: "Pod/" + p.Namespace + "/" + p.Name, Message: "container csi-resizer", Test: t.Name()})
		}
		if err := from.waitRestarted(ctx, "csi-resizer", fromRestarts); err != nil {
			t.Fatalf("the resizer on %s after losing its Lease: %v", from.node, err)
		}
	}
	poll(t, time.Minute, "the resizer on "+to.node+" leads", func() (bool, string) {
		tail := to.containerLogTail("csi-resizer", 20)
		return strings.Contains(tail, resizerLeading), tail
	})
}

// xfsClass makes a StorageClass of converge volumes with xfs that may be
// expanded, deleted when t ends, and returns its name.
func xfsClass(t *testing.T) string {
	t.Helper()
	return storageClass(t, "converge-xfs", map[string]string{"csi.storage.k8s.io/fstype": "xfs"})
}

// storageClass makes a StorageClass called name of converge volumes with
// parameters, WaitForFirstConsumer, that may be expanded, deleted when t
// ends, and returns its name.
func storageClass(t *testing.T, name string, parameters map[string]string) string {
	t.Helper()
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: name},
		Provisioner:          contract.DefaultDriverName,
		Parameters:           parameters,
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		AllowVolumeExpansion: ptr.To(true),
	}
	ctx := context.Background()
	if _, err := c.client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StorageClass %s: %v", sc.Name, err)
	}
	t.Cleanup(func() {
		err := c.client.StorageV1().StorageClasses().Delete(ctx, sc.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete StorageClass %s: %v", sc.Name, err)
		}
	})
	return sc.Name
}

// Pool fast is on the first node alone (an xfs that clones by reflink;
// the second node has no such directory, so its csi-node has no such
// pool). A StorageClass that names the pool has capacity on the first node
// and none on the second, as each node's provisioner publishes it; a pod
// that prefers the second node is scheduled to the first, and its volume
// is made in the pool there. A claim larger than the pool can hold finds
// no node: its pod stays Pending, the scheduler saying why.
func TestTwoNodesPoolSteersScheduling(t *testing.T) {
	b := secondNode(t)
	class := storageClass(t, "converge-fast", map[string]string{"converge.csi.dev/pool": fastPool})
	waitCapacities(t, class, b, func(a, bb *resource.Quantity) bool {
		return bb.IsZero() && a.Value() >= fastPoolSize/2 && a.Value() <= fastPoolSize
	})
	// The first node's two pools, as its csi-node reports them, and what
	// its provisioner published for the class of each.
	waitCapacities(t, "converge", b, func(a, bb *resource.Quantity) bool { return !a.IsZero() && !bb.IsZero() })
	pod, err := c.kubeNode.driverPod(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	status, err := c.kubectl(t.Context(), "-n", daemonSetNamespace, "exec", pod.Name, "-c", "csi-node", "--", "csi-node", "status")
	if err != nil || !strings.Contains(status, "POOL default") || !strings.Contains(status, "POOL "+fastPool) {
		t.Errorf("csi-node status on %s: %v; want both pools:\n%s", c.node, err, status)
	}
	t.Logf("csi-node status on %s:\n%s", c.node, status)

	claimOf(t, "in-fast", fs, rwo, "64Mi", class)
	pod = startPod(t, podSpec{name: "in-fast", claims: []string{"in-fast"}, prefer: b.node})
	if pod.Spec.NodeName != c.node {
		t.Errorf("a pod of pool %s that prefers %s, which lacks the pool, went to %s", fastPool, b.node, pod.Spec.NodeName)
	}
	v := boundVolume(t, "in-fast")
	if _, err := os.Stat(filepath.Join(c.kubeNode.poolsDir, fastPool, v.handle+".img")); err != nil {
		t.Errorf("the volume's image is not in pool %s of %s: %v", fastPool, c.node, err)
	}
	mustExec(t, pod.Name, "echo fast > "+dataDir+"/f && sync")

	claimOf(t, "too-big", fs, rwo, strconv.Itoa(2*fastPoolSize), class)
	createPod(t, podSpec{name: "too-big", claims: []string{"too-big"}})
	poll(t, time.Minute, "the pod of a claim no pool can hold unschedulable", func() (bool, string) {
		events := podEvents("too-big")
		return strings.Contains(events, "FailedScheduling") && strings.Contains(events, "storage"), events
	})
	if p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), "too-big", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("the pod of a claim larger than pool %s: %v on node %q, want it unscheduled", fastPool, err, p.Spec.NodeName)
	}
	deletePod(t, "too-big")
	if err := c.client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), "too-big", metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete claim too-big: %v", err)
	}
	release(t, v, "in-fast", pod.Name)
	if _, err := os.Stat(filepath.Join(c.kubeNode.poolsDir, fastPool, v.handle+".img")); !os.IsNotExist(err) {
		t.Errorf("the released volume's image in pool %s: %v", fastPool, err)
	}
}

// waitCapacities waits until the first node and b each have a
// CSIStorageCapacity for class, as their provisioners publish them and the
// scheduler reads them, that ok accepts (the first node's, then b's); it
// logs them, or fails after a minute naming them.
func waitCapacities(t *testing.T, class string, b *kubeNode, ok func(a, b *resource.Quantity) bool) {
	t.Helper()
	poll(t, time.Minute, "CSIStorageCapacity of both nodes for "+class, func() (bool, string) {
		caps, err := c.client.StorageV1().CSIStorageCapacities("kube-system").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]*resource.Quantity{}
		var all []string
		for _, o := range caps.Items {
			if o.StorageClassName != class || o.NodeTopology == nil {
				continue
			}
			node := o.NodeTopology.MatchLabels[contract.TopologyKey]
			seen[node] = o.Capacity
			all = append(all, fmt.Sprintf("%s: %v", node, o.Capacity))
		}
		a, bb := seen[c.node], seen[b.node]
		if a == nil || bb == nil || !ok(a, bb) {
			return false, strings.Join(all, ", ")
		}
		t.Logf("CSIStorageCapacity for class %s: %s", class, strings.Join(all, ", "))
		return true, ""
	})
}

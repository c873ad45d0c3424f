package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
	polling "github.com/converge-csi/converge/test/testenv/poll"
)

// The convention between docs/troubleshooting.md and this test: a fenced
// block whose info string is "sh {#<id>}" (a list item may indent it) is a
// command this test runs as written, with bash -eu -o pipefail, the
// cluster's kubectl first in PATH and its admin kubeconfig, once each word
// in angle brackets is filled in: <namespace>, <claim>, <pod>, <snapshot>,
// <node> and <size> (troubleshootingWords). A word it does not know fails
// the test, as does an id in the page that the test does not run, so
// that every block marked with an id is one a cluster showed working.
// What the test wants in an answer (an event's reason, a status, a piece
// of converge's message) must be named in the same "## " section of the
// page, which tells the reader what that answer means: the page and the
// cluster cannot drift apart. A block marked "sh" alone is for a symptom
// this test does not make: a node lost (the two-node tests lose one, at a
// cost of minutes), csi-node crash-looping (the hung and daemonset tests
// stop and restart it), a pod stuck Terminating.

const (
	// troubleshootingNamespace holds what testTroubleshooting makes; its
	// cluster-scoped objects (classes, a PV, a snapshot content) carry
	// the same name as a prefix.
	troubleshootingNamespace = "converge-troubleshooting"
	// troubleshootingGhost is a node no cluster of the run has, which a
	// snapshot content's handle names.
	troubleshootingGhost = "troubleshooting-ghost-node"
	// troubleshootingWait bounds each wait for a symptom to show.
	troubleshootingWait = 2 * time.Minute
)

// troubleshootingWords are the words in angle brackets that the page's
// tested blocks may hold.
var troubleshootingWords = []string{"namespace", "claim", "pod", "snapshot", "node", "size"}

// docBlock is one tested block of the page, and the text of the "## "
// section it is in.
type docBlock struct{ script, section string }

var (
	docBlockStart = regexp.MustCompile("^```sh \\{#([a-z0-9-]+)\\}$")
	docWord       = regexp.MustCompile(`<[a-z][a-z -]*>`)
)

// troubleshootingBlocks reads the page's tested blocks by id.
func troubleshootingBlocks(t *testing.T) map[string]docBlock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.repo, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	blocks := map[string]docBlock{}
	var section []string
	var ids []string // the current section's
	id, indent, in := "", "", false
	var script []string
	flush := func() {
		for _, i := range ids {
			blk := blocks[i]
			blk.section = strings.Join(section, "\n")
			blocks[i] = blk
		}
		section, ids = nil, nil
	}
	for _, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case !in && strings.HasPrefix(line, "## "):
			flush()
		case !in && docBlockStart.MatchString(trimmed):
			id, indent, in, script = docBlockStart.FindStringSubmatch(trimmed)[1], line[:len(line)-len(trimmed)], true, nil
			if _, dup := blocks[id]; dup {
				t.Fatalf("docs/troubleshooting.md has two blocks {#%s}", id)
			}
			blocks[id] = docBlock{}
			ids = append(ids, id)
		case in && trimmed == "```":
			in = false
			blk := blocks[id]
			blk.script = strings.Join(script, "\n") + "\n"
			blocks[id] = blk
		case in:
			script = append(script, strings.TrimPrefix(line, indent))
		}
		section = append(section, line)
	}
	flush()
	return blocks
}

// docRunner runs the page's tested blocks and remembers which it ran.
type docRunner struct {
	blocks map[string]docBlock
	ran    map[string]bool
}

// mark records that block id is run.
func (r *docRunner) mark(id string) { r.ran[id] = true }

// run runs block id with words filled in, and returns its output.
func (r *docRunner) run(t *testing.T, id string, words map[string]string) (string, error) {
	t.Helper()
	blk, ok := r.blocks[id]
	if !ok {
		t.Fatalf("docs/troubleshooting.md has no block {#%s}", id)
	}
	script := blk.script
	for k, v := range words {
		if !slices.Contains(troubleshootingWords, k) {
			t.Fatalf("the test fills in <%s>, which is not one of the page's words %v", k, troubleshootingWords)
		}
		script = strings.ReplaceAll(script, "<"+k+">", v)
	}
	if w := docWord.FindString(script); w != "" {
		t.Fatalf("block {#%s} still holds %s once the test's words are filled in:\n%s", id, w, script)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-eu", "-o", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.admin, "PATH="+c.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// wait runs block id until it succeeds and its answer holds every string
// of want, each of which the block's section of the page must name, and
// returns that answer.
func (r *docRunner) wait(t *testing.T, id string, words map[string]string, want ...string) string {
	t.Helper()
	return r.waitCheck(t, id, words, nil, want...)
}

// waitCheck is wait with a check of its own on the answer (nil: none).
func (r *docRunner) waitCheck(t *testing.T, id string, words map[string]string, check func(out string) error, want ...string) string {
	t.Helper()
	r.mark(id)
	// The page's lines wrap where they will.
	section := strings.Join(strings.Fields(r.blocks[id].section), " ")
	for _, w := range want {
		if !strings.Contains(section, strings.Join(strings.Fields(w), " ")) {
			t.Errorf("docs/troubleshooting.md's section of {#%s} does not name %q, which the test wants in its answer", id, w)
		}
	}
	var out string
	polling.Until(t, troubleshootingWait, time.Second, fmt.Sprintf("block {#%s} of docs/troubleshooting.md (%v) answering %q", id, words, want), func() error {
		var err error
		out, err = r.run(t, id, words)
		if err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("no %q in:\n%s", w, out)
			}
		}
		if check != nil {
			return check(out)
		}
		return nil
	})
	t.Logf("block {#%s} (%v) answers:\n%s", id, words, out)
	return out
}

// testTroubleshooting makes, in a namespace of its own, the symptoms of
// docs/troubleshooting.md that a cluster shows in seconds, runs each
// symptom's tested commands and checks that they answer what the page
// says they mean:
//   - claims Pending: of a class naming a pool no node has (the scheduler:
//     not enough free storage; the class's capacity 0 on every node), of
//     a class with a typo in its parameters (ProvisioningFailed, converge's
//     "unknown parameters"), and larger than any node's capacity;
//   - a pool's status as csi-node gives it;
//   - an expansion the pool has no room for (ResourceExhausted, retried,
//     and still the size first asked for once the request is lowered),
//     and one larger than the pool's filesystem (OutOfRange, infeasible),
//     which lowering the request ends, the volume grown to that;
//   - a pre-provisioned snapshot whose handle names a node that does not
//     exist (converge-controller's SnapshotNodeGone);
//   - a pod ContainerCreating on a PV whose volume its node does not have
//     (NotFound, "does not exist", missing from csi-node status), the
//     pod, the volume's handle and the PV's node affinity on one node.
//
// Every symptom's objects are made first, so that the cluster works on
// all of them while the checks run one after the other, in one of the
// run's parallel slots. Deleting the namespace at the end takes its claims
// and volumes with it.
func testTroubleshooting(t *testing.T) {
	ctx := context.Background()
	r := &docRunner{blocks: troubleshootingBlocks(t), ran: map[string]bool{}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: troubleshootingNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(removeTroubleshooting(t))
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		for id := range r.blocks {
			if !r.ran[id] {
				t.Errorf("docs/troubleshooting.md's block {#%s} is not run by the test", id)
			}
		}
	})
	words := func(kv ...string) map[string]string {
		m := map[string]string{"namespace": troubleshootingNamespace}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, x := range []struct{ reason, claim string }{
		{"ProvisioningFailed", "typo"}, {"VolumeResizeFailed", "grow-stuck"}, {"VolumeResizeFailed", "grow-refused"},
	} {
		expectWarning(t, x.reason, "PersistentVolumeClaim/"+troubleshootingNamespace+"/"+x.claim)
	}
	expectWarning(t, "SnapshotNodeGone", troubleshootingNamespace)

	// Claims Pending. Each pod before its claim: the claim's first look
	// finds the pod that waits for it (WaitForPodScheduled), rather than
	// the next resync of claims, 15 s later.
	noPool := troubleshootingClass(t, "nopool", map[string]string{contract.PoolKey: "nosuchpool"})
	typo := troubleshootingClass(t, "typo", map[string]string{"converge.csi.dev/poool": fastPool})
	for _, x := range []struct{ name, class, size string }{{"nopool", noPool, volumeSize}, {"typo", typo, volumeSize}, {"huge", "converge", "1Pi"}} {
		troubleshootingPod(t, x.name, x.name)
		troubleshootingClaim(t, x.name, x.class, x.size, "")
	}
	// Volumes to grow. The one the page's fix grows is xfs: this
	// machine's root cannot grow a mounted ext4 (it lacks
	// CAP_SYS_RESOURCE), so its claim would stay NodeResizeInProgress;
	// xfs grows online (and starts at its mkfs minimum, 300 MiB).
	xfs := troubleshootingClass(t, "xfs", map[string]string{"csi.storage.k8s.io/fstype": "xfs"})
	for _, x := range []struct{ name, class, size string }{{"grow-stuck", "converge", volumeSize}, {"grow-refused", xfs, refusedSize}} {
		troubleshootingClaim(t, x.name, x.class, x.size, "")
		troubleshootingPod(t, x.name, x.name)
	}
	// A snapshot whose node does not exist.
	troubleshootingSnapshot(t, "ghost", troubleshootingNamespace+"-ghost", "troubleshooting_"+troubleshootingGhost)
	// A PV whose volume its node does not have.
	pv, handle := troubleshootingNamespace+"-gone", "troubleshooting-gone_"+c.node
	troubleshootingPV(t, pv, handle, "gone")
	troubleshootingClaim(t, "gone", "", volumeSize, pv)
	troubleshootingPod(t, "gone", "gone")

	t.Run("claim Pending", func(t *testing.T) {
		r.wait(t, "pending", words("claim", "nopool", "pod", "nopool"), "WaitForPodScheduled", "did not have enough free storage")
		row := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(noPool) + `\s+\S+\s+0\s+<none>\s*$`)
		r.waitCheck(t, "capacity", words("claim", "nopool"), func(out string) error {
			if !row.MatchString(out) {
				return fmt.Errorf("no row of class %s with CAPACITY 0 and MAXIMUM <none>, as the page says of a pool no node has, in:\n%s", noPool, out)
			}
			return nil
		}, "CAPACITY", "MAXIMUM", "<none>")
		r.wait(t, "pending", words("claim", "typo", "pod", "typo"), "ProvisioningFailed", "InvalidArgument", "unknown parameters",
			"Volume provisioning failed with infeasible error")
		r.wait(t, "pending", words("claim", "huge", "pod", "huge"), "WaitForPodScheduled", "did not have enough free storage")
	})

	t.Run("pool full", func(t *testing.T) {
		r.wait(t, "pool-full", words("node", c.node), "AVAILABLE", "PROMISED", "SNAPSHOTS", "guard")
	})

	t.Run("expansion stuck", func(t *testing.T) {
		waitRunningIn(t, troubleshootingNamespace, "grow-stuck")
		// Within the pool's filesystem, beyond what it can promise: its
		// guard alone (5% here) is more than the MiB this rounds off.
		size, available := troubleshootingPool(t, "grow-stuck")
		asked := resource.MustParse(fmt.Sprintf("%dMi", size>>20))
		if size>>20<<20-(64<<20) <= available {
			t.Fatalf("pool default: %d bytes, %d available: no size fits its filesystem and not its promise", size, available)
		}
		troubleshootingResize(t, "grow-stuck", asked.String())
		r.wait(t, "expansion", words("claim", "grow-stuck"), "ControllerResizeInProgress", "VolumeResizeFailed", "ResourceExhausted", "can still be promised")

		// Lowering the request does not end it: csi-resizer asks again,
		// for the size it recorded.
		before := resizeFailures(t, "grow-stuck")
		troubleshootingResize(t, "grow-stuck", "65Mi")
		poll(t, troubleshootingWait, "csi-resizer asking again once the request is lowered", func() (bool, string) {
			n := resizeFailures(t, "grow-stuck")
			return n > before, fmt.Sprintf("%d VolumeResizeFailed, %d before", n, before)
		})
		out := r.wait(t, "expansion", words("claim", "grow-stuck"), "ControllerResizeInProgress", "allocated", "capacity")
		if first, _, _ := strings.Cut(out, "\n"); !strings.Contains(first, "capacity 64Mi") || !strings.Contains(first, "allocated "+asked.String()) {
			t.Errorf("the claim once its request is lowered: %q, want capacity 64Mi and allocated %s, as the page says", first, &asked)
		}
	})

	t.Run("expansion refused", func(t *testing.T) {
		waitRunningIn(t, troubleshootingNamespace, "grow-refused")
		size, _ := troubleshootingPool(t, "grow-refused")
		troubleshootingResize(t, "grow-refused", fmt.Sprintf("%dGi", 2*size>>30+1))
		r.wait(t, "expansion", words("claim", "grow-refused"), "ControllerResizeInfeasible", "ControllerResizeError", "OutOfRange", "is more than the")
		r.mark("expansion-fix")
		if out, err := r.run(t, "expansion-fix", words("claim", "grow-refused", "size", refusedFix)); err != nil {
			t.Fatalf("the page's fix: %v\n%s", err, out)
		}
		r.waitCheck(t, "expansion", words("claim", "grow-refused"), func(out string) error {
			if first, _, _ := strings.Cut(out, "\n"); !strings.Contains(first, "capacity "+refusedFix) || strings.Contains(first, "Resize") {
				return fmt.Errorf("the claim after the page's fix: %q, want capacity %s and no resize status", first, refusedFix)
			}
			return nil
		}, "capacity")
	})

	t.Run("snapshot not ready", func(t *testing.T) {
		out := r.wait(t, "snapshot", words("snapshot", "ghost"), "SnapshotNodeGone", "does not exist")
		if !strings.Contains(out, "node , ") {
			t.Errorf("the content whose handle names node %s: got\n%s\nwant no node label", troubleshootingGhost, out)
		}
	})

	t.Run("pod ContainerCreating", func(t *testing.T) {
		// Each of the kubelet's retries records a stage that csi-node
		// withdraws within milliseconds, which the status may catch (the
		// page says so): the block runs again until it does not.
		out := r.waitCheck(t, "containercreating", words("pod", "gone"), func(out string) error {
			if _, status, ok := strings.Cut(out, "\nNODE "); !ok || strings.Contains(status, handle) {
				return fmt.Errorf("csi-node status: got\n%s\nwant it without volume %s, which the node does not have", status, handle)
			}
			return nil
		}, "FailedMount", "MountVolume.MountDevice failed", "NotFound", "does not exist", "converge.csi.dev")
		if !strings.Contains(out, "volume "+handle+" does not exist") {
			t.Errorf("the pod's events: got\n%s\nwant csi-node's answer that volume %s does not exist", out, handle)
		}
		// The page's check before deleting such a PV: the pod, the
		// handle and the PV's node affinity all name the run's node.
		one := fmt.Sprintf("pod on %s, handle names %s, PV pinned to %s", c.node, c.node, c.node)
		r.waitCheck(t, "containercreating-node", words("claim", "gone", "pod", "gone"), func(out string) error {
			if !strings.Contains(out, one) {
				return fmt.Errorf("no %q in:\n%s", one, out)
			}
			return nil
		}, "NODE")
		r.wait(t, "containercreating-log", words("claim", "gone", "pod", "gone"), "Call failed", "does not exist")
	})
}

// troubleshootingClass makes a WaitForFirstConsumer StorageClass of
// converge's, named after the namespace and name, with params; it is
// deleted when t ends.
// refusedSize is the size of the claim grown past its pool and back,
// refusedFix the size the page's fix asks for then.
const refusedSize, refusedFix = "320Mi", "321Mi"

func troubleshootingClass(t *testing.T, name string, params map[string]string) string {
	t.Helper()
	ctx := context.Background()
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: troubleshootingNamespace + "-" + name}, Provisioner: contract.DefaultDriverName,
		Parameters: params, VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer), AllowVolumeExpansion: ptr.To(true)}
	if _, err := c.client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.client.StorageV1().StorageClasses().Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting StorageClass %s: %v", sc.Name, err)
		}
	})
	return sc.Name
}

// troubleshootingClaim makes a filesystem claim of size in the namespace,
// of class ("": none, bound to the PV volume).
func troubleshootingClaim(t *testing.T, name, class, size, volume string) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{rwo}, StorageClassName: ptr.To(class), VolumeName: volume,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	if _, err := c.client.CoreV1().PersistentVolumeClaims(troubleshootingNamespace).Create(context.Background(), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// troubleshootingPod makes a pod in the namespace that mounts claim, and
// deletes it at once when t ends.
func troubleshootingPod(t *testing.T, name, claim string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: podSpecOf(podSpec{claims: []string{claim}})}
	pods := c.client.CoreV1().Pods(troubleshootingNamespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting pod %s: %v", name, err)
		}
	})
}

// troubleshootingResize sets the claim's request to size.
func troubleshootingResize(t *testing.T, claim, size string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size)
	if _, err := c.client.CoreV1().PersistentVolumeClaims(troubleshootingNamespace).Patch(context.Background(), claim, types.MergePatchType,
		[]byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("claim %s to %s: %v", claim, size, err)
	}
}

// troubleshootingPool is the size of the default pool's filesystem on the
// node of the claim's volume, and what it can still promise a thick
// volume, as that node's csi-node reports them.
func troubleshootingPool(t *testing.T, claim string) (size, available int64) {
	t.Helper()
	ctx := context.Background()
	pvc, err := c.client.CoreV1().PersistentVolumeClaims(troubleshootingNamespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := c.nodeNamed(nodeOf(pv))
	if n == nil {
		t.Fatalf("PV %s names node %q, not one of the cluster's", pv.Name, nodeOf(pv))
	}
	pod, err := n.driverPod(ctx)
	if err != nil || pod == nil {
		t.Fatalf("converge's pod on %s: %v", n.node, err)
	}
	out, err := c.kubectl(ctx, "exec", "-n", daemonSetNamespace, pod.Name, "-c", "csi-node", "--", "csi-node", "status", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pools []struct {
			Name                string `json:"name"`
			SizeBytes           int64  `json:"sizeBytes"`
			ThickAvailableBytes int64  `json:"thickAvailableBytes"`
		} `json:"pools"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("csi-node status -o json: %v\n%s", err, out)
	}
	for _, p := range st.Pools {
		if p.Name == "default" {
			return p.SizeBytes, p.ThickAvailableBytes
		}
	}
	t.Fatalf("csi-node status on %s has no pool default:\n%s", n.node, out)
	return 0, 0
}

// resizeFailures counts csi-resizer's VolumeResizeFailed events on the
// claim, each as often as it recurred.
func resizeFailures(t *testing.T, claim string) int32 {
	t.Helper()
	evs, err := c.client.CoreV1().Events(troubleshootingNamespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + claim + ",reason=VolumeResizeFailed"})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, e := range evs.Items {
		n += max(e.Count, 1)
	}
	return n
}

// troubleshootingPV makes a converge PV of handle on the run's node,
// retained, for claim of the namespace, as a PV copied from elsewhere
// would be; it is deleted when t ends.
func troubleshootingPV(t *testing.T, name, handle, claim string) {
	t.Helper()
	ctx := context.Background()
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{rwo},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		StorageClassName:              "",
		ClaimRef:                      &corev1.ObjectReference{Namespace: troubleshootingNamespace, Name: claim},
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
			Driver: contract.DefaultDriverName, VolumeHandle: handle, FSType: "ext4"}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: contract.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{c.node}}},
		}}}},
	}}
	if _, err := c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting PV %s: %v", name, err)
		}
	})
}

// troubleshootingSnapshot makes a pre-provisioned VolumeSnapshotContent of
// converge's named content, of handle, retained, and the VolumeSnapshot
// name of the namespace bound to it, as a restore of a backup makes them;
// both are deleted when t ends, their finalizers taken off.
func troubleshootingSnapshot(t *testing.T, name, content, handle string) {
	t.Helper()
	ctx := context.Background()
	o := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": snapshotContents.GroupVersion().String(), "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": content},
		"spec": map[string]any{
			"driver": contract.DefaultDriverName, "deletionPolicy": "Retain",
			"source":            map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"name": name, "namespace": troubleshootingNamespace},
		},
	}}
	if _, err := c.dynamic.Resource(snapshotContents).Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unfinalizeAndDelete(t, snapshotContents, "", content) })
	s := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": volumeSnapshots.GroupVersion().String(), "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"source": map[string]any{"volumeSnapshotContentName": content}},
	}}
	if _, err := c.dynamic.Resource(volumeSnapshots).Namespace(troubleshootingNamespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unfinalizeAndDelete(t, volumeSnapshots, troubleshootingNamespace, name) })
}

// unfinalizeAndDelete takes the object's finalizers off and deletes it,
// until it is gone (a controller may add a finalizer again meanwhile).
func unfinalizeAndDelete(t *testing.T, gvr schema.GroupVersionResource, namespace, name string) {
	t.Helper()
	ctx := context.Background()
	res := c.dynamic.Resource(gvr).Namespace(namespace)
	poll(t, time.Minute, fmt.Sprintf("%s %s gone", gvr.Resource, name), func() (bool, string) {
		_, err := res.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err == nil {
			err = res.Delete(ctx, name, metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err.Error()
		}
		_, err = res.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// removeTroubleshooting returns the cleanup that deletes the namespace,
// its pods first at once, and waits for it and every volume of its claims
// to be gone.
func removeTroubleshooting(t *testing.T) func() {
	return func() {
		ctx := context.Background()
		if err := c.client.CoreV1().Pods(troubleshootingNamespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the pods of %s: %v", troubleshootingNamespace, err)
		}
		if err := c.client.CoreV1().Namespaces().Delete(ctx, troubleshootingNamespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", troubleshootingNamespace, err)
		}
		poll(t, 5*time.Minute, "namespace "+troubleshootingNamespace+" and its volumes gone", func() (bool, string) {
			var left []string
			if _, err := c.client.CoreV1().Namespaces().Get(ctx, troubleshootingNamespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				left = append(left, "the namespace")
			}
			pvs, err := c.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, pv := range pvs.Items {
				if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == troubleshootingNamespace {
					left = append(left, "PV "+pv.Name)
				}
			}
			return len(left) == 0, strings.Join(left, ", ")
		})
	}
}

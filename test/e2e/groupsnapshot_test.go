package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

var (
	volumeGroupSnapshots        = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshots"}
	volumeGroupSnapshotContents = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotcontents"}
)

const (
	// groupSnapshotsTaken is how many group snapshots
	// testGroupSnapshotConsistency takes while its pod writes.
	groupSnapshotsTaken = 20
	// groupRestoreBatch is how many of them it restores at once: a pod of
	// two claims each, besides the writer's two, well under
	// maxVolumesPerNode.
	groupRestoreBatch = 5
	// groupCounter is the file each volume's counter is written to: a
	// fixed width, written in place (one write of one block, which a
	// freeze lets through whole or not at all).
	groupCounter = "counter"
)

// groupWriter writes an increasing counter alternately to /a and /b, each
// write fsynced before the next begins: n to a, n to b, then n+1. At every
// instant a holds n and b holds n or n-1, so a snapshot of both taken at
// one instant reads a-b of 0 or 1 (the write in flight); snapshots taken
// one after the other read any difference.
const groupWriter = `n=0; trap "exit 0" TERM
while true; do
  printf '%012d\n' $n | dd of=/a/` + groupCounter + ` conv=notrunc,fsync 2>/dev/null
  printf '%012d\n' $n | dd of=/b/` + groupCounter + ` conv=notrunc,fsync 2>/dev/null
  n=$((n+1))
done`

// testGroupSnapshotConsistency takes VolumeGroupSnapshots of a database's
// two volumes (data and WAL, chosen by a label) through the real
// snapshot-controller and csi-snapshotter, in pool fast (an xfs that
// clones by reflink), while a pod writes an increasing counter to both
// alternately (groupWriter). Each group is restored to two new claims
// from its member VolumeSnapshots and read in a new pod: the two counters
// differ by at most the one write in flight, and are never older on the
// volume written first. A control first shows that the check can fail:
// two ordinary VolumeSnapshots of the same claims, taken one after the
// other while the pod writes, differ by more. It logs how many group
// snapshots it took and checked, the largest difference, and the freeze
// times csi-node's metric recorded. Deleting the groups deletes their
// member snapshots on the node.
func testGroupSnapshotConsistency(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	groupsEnabled(t)
	class := storageClass(t, "converge-group", map[string]string{
		"csi.storage.k8s.io/fstype": "ext4", "converge.csi.dev/provisioning": "thin", "converge.csi.dev/pool": fastPool})
	const app = "grp-db"
	claims := []string{"grp-data", "grp-wal"}
	for _, name := range claims {
		labeledClaim(t, name, class, map[string]string{"app": app})
	}
	createGroupPod(t, "grp-writer", claims, groupWriter)
	writer := waitRunning(t, "grp-writer")
	for _, name := range claims {
		if v := boundVolume(t, name); v.n != c.kubeNode {
			t.Fatalf("claim %s is on %s, want %s, the node of pool %s", name, v.n.node, c.node, fastPool)
		}
	}
	waitExec(t, writer.Name, "test -s /b/"+groupCounter)

	// The control: the same claims snapshotted one after the other, the
	// second once the writer has written WAL twice more than data held
	// when the first was taken (no more than it holds once that snapshot
	// is ready): the two differ by 2 or more however slowly it writes.
	volumeSnapshot(t, "grp-ctl-data", "grp-data")
	taken, err := waitRead(writer.Name)
	if err != nil {
		t.Fatalf("the writer's counters after the control's first snapshot: %v", err)
	}
	poll(t, 2*time.Minute, fmt.Sprintf("the writer's WAL counter past %d", taken[0]+1), func() (bool, string) {
		now, err := waitRead(writer.Name)
		return err == nil && now[1] >= taken[0]+2, fmt.Sprint(now, err)
	})
	volumeSnapshot(t, "grp-ctl-wal", "grp-wal")
	ctl := restorePairs(t, class, []restorePair{{name: "grp-ctl", snapshots: [2]string{"grp-ctl-data", "grp-ctl-wal"}}})[0]
	if d := ctl.a - ctl.b; d >= 0 && d <= 1 {
		t.Fatalf("the control: snapshots of data (%d) and WAL (%d) taken one after the other differ by %d, which the check would pass: it cannot tell", ctl.a, ctl.b, d)
	}
	t.Logf("the control: single snapshots of data and WAL, one after the other, read %d and %d (difference %d)", ctl.a, ctl.b, ctl.a-ctl.b)

	pod, err := c.kubeNode.driverPod(ctx)
	if err != nil || pod == nil {
		t.Fatalf("the converge pod of %s: %v", c.node, err)
	}
	metrics := "http://" + pod.Status.PodIP + ":9810/metrics"
	before := freezeMetric(t, writer.Name, metrics)

	var pairs []restorePair
	var uids []string
	took := time.Now()
	for i := range groupSnapshotsTaken {
		name := fmt.Sprintf("grp-%02d", i)
		uid, members := volumeGroupSnapshot(t, name, app, claims)
		uids = append(uids, uid)
		pairs = append(pairs, restorePair{name: name, snapshots: [2]string{members["grp-data"], members["grp-wal"]}})
	}
	tookFor := time.Since(took)
	after := freezeMetric(t, writer.Name, metrics)

	var read []restoredPair
	for i := 0; i < len(pairs); i += groupRestoreBatch {
		read = append(read, restorePairs(t, class, pairs[i:min(i+groupRestoreBatch, len(pairs))])...)
	}
	worst := 0
	for _, r := range read {
		d := r.a - r.b
		if d < 0 || d > 1 {
			t.Errorf("group %s restored: data %d, WAL %d: they differ by %d, want 0 or 1 (the write in flight)", r.name, r.a, r.b, d)
		}
		worst = max(worst, d)
	}
	first, last := read[0], read[len(read)-1]
	if last.a <= first.a {
		t.Errorf("the last group (%s) reads %d, the first (%s) %d: the writer did not write between them", last.name, last.a, first.name, first.a)
	}
	frozen := after.minus(before)
	if frozen.count < groupSnapshotsTaken {
		t.Errorf("csi-node's %s counted %v freezes during the groups, want at least %d", freezeMetricName, frozen.count, groupSnapshotsTaken)
	}
	freezes := groupFreezes(t, uids)
	t.Logf("group snapshots: %d taken in %.1fs (%.2fs each, asked to ready), %d pairs restored and checked, largest difference %d; "+
		"the counters ran from %d to %d; freezes (csi-node's log): %s; the metric: %v freezes, mean %.1f ms, the longest at most %s",
		len(uids), tookFor.Seconds(), tookFor.Seconds()/float64(len(uids)), len(read), worst, first.a, last.a,
		freezes, frozen.count, 1000*frozen.sum/math.Max(frozen.count, 1), frozen.bound())
	deletePod(t, writer.Name)

	// Deleting the groups (their class's deletionPolicy is Delete) deletes
	// the member snapshots on the node: none of their files is left.
	groups := c.dynamic.Resource(volumeGroupSnapshots).Namespace(ns)
	for _, p := range pairs {
		if err := groups.Delete(ctx, p.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete VolumeGroupSnapshot %s: %v", p.name, err)
		}
	}
	snapshots := filepath.Join(c.kubeNode.poolsDir, fastPool, "snapshots")
	poll(t, 2*time.Minute, "the groups' member snapshots deleted on the node", func() (bool, string) {
		entries, _ := os.ReadDir(snapshots)
		var left []string
		for _, e := range entries {
			if slices.ContainsFunc(uids, func(uid string) bool { return strings.Contains(e.Name(), uid) }) {
				left = append(left, e.Name())
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	t.Logf("the test took %.0fs", time.Since(start).Seconds())
}

// groupsEnabled fails t at once if snapshot-controller or the node's
// csi-snapshotter turned group snapshots off for its run: each does so,
// with only a warning, when it cannot List the group CRDs (missing, or
// refused by its RBAC).
func groupsEnabled(t *testing.T) {
	t.Helper()
	const off = "disabling the VolumeGroupSnapshot feature"
	logs := append([]string{c.snapshotController.log}, c.kubeNode.containerLogs("csi-snapshotter")...)
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.Index(string(b), off); i >= 0 {
			line, _, _ := strings.Cut(string(b[i:]), "\n")
			t.Fatalf("%s turned group snapshots off: %s", l, line)
		}
	}
}

// labeledClaim creates a filesystem claim of class with labels, deleted
// when t ends.
func labeledClaim(t *testing.T, name, class string, labels map[string]string) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{rwo},
			StorageClassName: ptr.To(class),
			VolumeMode:       ptr.To(fs),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(volumeSize),
			}},
		},
	}
	ctx := context.Background()
	if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PVC %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := c.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete PVC %s: %v", name, err)
		}
	})
}

// createGroupPod creates a pod of the busybox image that runs command
// (sh -c; "" waits for SIGTERM) with its claims mounted at /a, /b, ...
// rather than all at dataDir, without waiting for it; it is deleted when
// t ends.
func createGroupPod(t *testing.T, name string, claims []string, command string) {
	t.Helper()
	spec := podSpecOf(podSpec{name: name, claims: claims, command: command})
	for i := range spec.Containers[0].VolumeMounts {
		spec.Containers[0].VolumeMounts[i].MountPath = "/" + string(rune('a'+i))
	}
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if _, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
}

// volumeGroupSnapshot creates a VolumeGroupSnapshot of the converge class
// of the claims labeled app=app, waits for it to be ready with a member
// VolumeSnapshot per claim of claims, each ready and naming the group,
// and returns its UID and its member snapshots by claim. The group is
// deleted when t ends (after the claims restored from it).
func volumeGroupSnapshot(t *testing.T, name, app string, claims []string) (string, map[string]string) {
	t.Helper()
	ctx := context.Background()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1",
		"kind":       "VolumeGroupSnapshot",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"volumeGroupSnapshotClassName": "converge",
			"source":                       map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": app}}},
		},
	}}
	groups := c.dynamic.Resource(volumeGroupSnapshots).Namespace(ns)
	created, err := groups.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create VolumeGroupSnapshot %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := groups.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete VolumeGroupSnapshot %s: %v", name, err)
		}
	})
	uid := string(created.GetUID())
	members := map[string]string{}
	// A test deletes a group once it is there, as a user should.
	poll(t, 2*time.Minute, "VolumeGroupSnapshot "+name+" ready with its members and its finalizer", func() (bool, string) {
		got, err := groupMembers(ctx, name, uid, claims)
		if err != nil {
			return false, err.Error()
		}
		maps.Copy(members, got)
		return true, ""
	})
	content, _, _ := unstructured.NestedString(mustGet(t, volumeGroupSnapshots, name).Object, "status", "boundVolumeGroupSnapshotContentName")
	if info, _, _ := unstructured.NestedSlice(mustGet(t, volumeGroupSnapshotContents, content).Object, "status", "volumeSnapshotInfoList"); len(info) != len(claims) {
		t.Fatalf("VolumeGroupSnapshotContent %s lists %d snapshots, want %d: %v", content, len(info), len(claims), info)
	}
	return uid, members
}

// groupBoundFinalizer is snapshot-controller's finalizer of a
// VolumeGroupSnapshot bound to its content (external-snapshotter's
// utils.VolumeGroupSnapshotBoundFinalizer).
const groupBoundFinalizer = "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-bound-protection"

// groupMembers returns the member VolumeSnapshots, by claim, of the
// VolumeGroupSnapshot name (of UID uid) of claims, or an error that says
// what it waits for: the group ready and carrying snapshot-controller's
// finalizer, which it may add a sync after it set the group ready (a group
// deleted before then goes unprocessed and its content is never marked
// being deleted: docs/group-snapshots.md, "The upstream gap"), and a ready
// member naming the group for each claim.
func groupMembers(ctx context.Context, name, uid string, claims []string) (map[string]string, error) {
	got, err := c.dynamic.Resource(volumeGroupSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse"); !ready {
		return nil, fmt.Errorf("status %v%s", got.Object["status"], objectEvents("VolumeGroupSnapshot", name))
	}
	if !slices.Contains(got.GetFinalizers(), groupBoundFinalizer) {
		return nil, fmt.Errorf("ready; finalizers %v, waiting for %s", got.GetFinalizers(), groupBoundFinalizer)
	}
	list, err := c.dynamic.Resource(volumeSnapshots).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	members := map[string]string{}
	var waiting []string
	for _, s := range list.Items {
		if !slices.ContainsFunc(s.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return string(o.UID) == uid }) {
			continue
		}
		claim, _, _ := unstructured.NestedString(s.Object, "spec", "source", "persistentVolumeClaimName")
		group, _, _ := unstructured.NestedString(s.Object, "status", "volumeGroupSnapshotName")
		ready, _, _ := unstructured.NestedBool(s.Object, "status", "readyToUse")
		if !ready || group != name {
			waiting = append(waiting, fmt.Sprintf("%s (of %s): ready %v, group %q", s.GetName(), claim, ready, group))
		}
		members[claim] = s.GetName()
	}
	if len(waiting) > 0 || len(members) != len(claims) {
		return nil, fmt.Errorf("members %v; waiting for %v", members, waiting)
	}
	for _, cl := range claims {
		if members[cl] == "" {
			return nil, fmt.Errorf("no member of claim %s among %v", cl, members)
		}
	}
	return members, nil
}

// mustGet gets the object of gvr named name (in ns if namespaced).
func mustGet(t *testing.T, gvr schema.GroupVersionResource, name string) *unstructured.Unstructured {
	t.Helper()
	r := c.dynamic.Resource(gvr)
	var obj *unstructured.Unstructured
	var err error
	if gvr == volumeGroupSnapshotContents {
		obj, err = r.Get(context.Background(), name, metav1.GetOptions{})
	} else {
		obj, err = r.Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatalf("get %s %s: %v", gvr.Resource, name, err)
	}
	return obj
}

// objectEvents is the events about the object of kind named name, to
// explain a wait.
func objectEvents(kind, name string) string {
	evs, err := c.client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "\n    event %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// restorePair is a pair of member snapshots, data's and WAL's, to restore.
type restorePair struct {
	name      string
	snapshots [2]string
}

// restoredPair is what a pair restored reads: data's counter and WAL's.
type restoredPair struct {
	name string
	a, b int
}

// restorePairs restores each pair's two snapshots to two new claims of
// class, mounts them in a new pod per pair (all at once), reads both
// counters, and deletes the pods and the claims.
func restorePairs(t *testing.T, class string, pairs []restorePair) []restoredPair {
	t.Helper()
	ctx := context.Background()
	var made []string
	for _, p := range pairs {
		var claims []string
		for i, s := range p.snapshots {
			cl := fmt.Sprintf("%s-r%d", p.name, i)
			makeClaim(t, cl, fs, rwo, volumeSize, class,
				&corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: s})
			claims = append(claims, cl)
		}
		made = append(made, claims...)
		createGroupPod(t, p.name+"-reader", claims, "")
	}
	out := make([]restoredPair, len(pairs))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	for i, p := range pairs {
		wg.Go(func() {
			pod := p.name + "-reader"
			got, err := waitRead(pod)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v%s", pod, err, podEvents(pod)))
				return
			}
			out[i] = restoredPair{name: p.name, a: got[0], b: got[1]}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("reading the restored pairs:\n%s", strings.Join(failed, "\n"))
	}
	for _, p := range pairs {
		deletePod(t, p.name+"-reader")
	}
	for _, cl := range made {
		if err := c.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, cl, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete PVC %s: %v", cl, err)
		}
	}
	return out
}

// waitRead waits up to two minutes for pod to run and reads the counters
// of its two volumes.
func waitRead(pod string) ([2]int, error) {
	var got [2]int
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := c.kubectl(ctx, "exec", "-n", ns, pod, "-c", "c", "--", "cat", "/a/"+groupCounter, "/b/"+groupCounter)
		cancel()
		if err == nil {
			f := strings.Fields(out)
			if len(f) != 2 {
				return got, fmt.Errorf("read %q, want two counters", out)
			}
			for i := range f {
				if got[i], err = strconv.Atoi(f[i]); err != nil {
					return got, fmt.Errorf("counter %q: %v", f[i], err)
				}
			}
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("not read in 2m: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// tookGroup is csi-node's log line for a group snapshot taken, with how
// long its members were frozen.
var tookGroup = regexp.MustCompile(`"Took group snapshot" .*groupSnapshotID="([^"]+)".* frozenFor="([^"]+)"`)

// groupFreezes finds, in csi-node's log, how long each group of uids
// (csi-snapshotter names a group groupsnapshot-<UID>) held its members
// frozen, fails t for a group it does not find, and describes them:
// shortest, median and longest.
func groupFreezes(t *testing.T, uids []string) string {
	t.Helper()
	took := map[string]time.Duration{}
	for _, l := range c.kubeNode.containerLogs("csi-node") {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tookGroup.FindAllStringSubmatch(string(b), -1) {
			for _, uid := range uids {
				if strings.Contains(m[1], uid) {
					d, err := time.ParseDuration(m[2])
					if err != nil {
						t.Errorf("group %s frozen for %q: %v", m[1], m[2], err)
					}
					took[uid] = d
				}
			}
		}
	}
	var ds []time.Duration
	for _, uid := range uids {
		d, ok := took[uid]
		if !ok {
			t.Errorf("csi-node's log has no %q line for the group of VolumeGroupSnapshot UID %s", "Took group snapshot", uid)
			continue
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return "none found"
	}
	slices.Sort(ds)
	return fmt.Sprintf("%d, shortest %v, median %v, longest %v", len(ds), ds[0].Round(10*time.Microsecond), ds[len(ds)/2].Round(10*time.Microsecond), ds[len(ds)-1].Round(10*time.Microsecond))
}

// freezeMetricName is csi-node's histogram of how long a snapshot held its
// volumes frozen.
const freezeMetricName = "converge_snapshot_freeze_duration_seconds"

// histogram is a scrape of a Prometheus histogram: its count, its sum and
// its cumulative buckets by upper bound.
type histogram struct {
	count, sum float64
	buckets    map[float64]float64
}

// minus is what h observed since earlier.
func (h histogram) minus(earlier histogram) histogram {
	d := histogram{count: h.count - earlier.count, sum: h.sum - earlier.sum, buckets: map[float64]float64{}}
	for le, n := range h.buckets {
		d.buckets[le] = n - earlier.buckets[le]
	}
	return d
}

// bound is the smallest bucket bound that holds every observation.
func (h histogram) bound() string {
	les := slices.Sorted(func(yield func(float64) bool) {
		for le := range h.buckets {
			if !yield(le) {
				return
			}
		}
	})
	for _, le := range les {
		if h.buckets[le] >= h.count {
			return fmt.Sprintf("%.3g ms", 1000*le)
		}
	}
	return "(no bucket)"
}

// freezeMetric scrapes csi-node's freeze histogram at url from pod, which
// runs on the node's network.
func freezeMetric(t *testing.T, pod, url string) histogram {
	t.Helper()
	out := mustExec(t, pod, "wget -qO- "+url+" | grep '^"+freezeMetricName+"'")
	h := histogram{buckets: map[float64]float64{}}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", url, sc.Text(), err)
		}
		switch {
		case name == freezeMetricName+"_count":
			h.count = v
		case name == freezeMetricName+"_sum":
			h.sum = v
		case strings.HasPrefix(name, freezeMetricName+`_bucket{le="`):
			le, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(name, freezeMetricName+`_bucket{le="`), `"}`), 64)
			if err == nil {
				h.buckets[le] = v
			}
		}
	}
	return h
}

// testGroupContentDeletedAfterAMissedLook deletes a VolumeGroupSnapshotContent
// that csi-snapshotter first sees deleted while it still says its creation
// is in flight (the being-created annotation, which snapshot-controller
// can write back from a stale copy of the content, as it replaces all its
// annotations when it marks the content being deleted). csi-snapshotter
// leaves the deletion, takes the annotation off itself, and a change of
// that annotation is one it does not look at: only its resync
// (--resync-period, 15 minutes by default) comes back to the deletion. As
// the storage suite's pre-provisioned group tests do, the group is kept
// (Retain) while it is deleted, and its content deleted after it. The
// content must be gone, and the group's snapshots deleted on the node,
// within 2 minutes (the suite waits 5); without the resync's flag it stays
// until the default's 15 minutes come round, which may fall within the 2
// (about 2 runs in 15).
func testGroupContentDeletedAfterAMissedLook(t *testing.T) {
	ctx := context.Background()
	groupsEnabled(t)
	class := storageClass(t, "converge-group-missed", map[string]string{
		"csi.storage.k8s.io/fstype": "ext4", "converge.csi.dev/provisioning": "thin", "converge.csi.dev/pool": fastPool})
	const app, name = "grp-missed", "grp-missed"
	claims := []string{"grp-missed-a", "grp-missed-b"}
	for _, claim := range claims {
		labeledClaim(t, claim, class, map[string]string{"app": app})
	}
	createGroupPod(t, "grp-missed-pod", claims, "")
	waitRunning(t, "grp-missed-pod")
	uid, _ := volumeGroupSnapshot(t, name, app, claims)
	content, _, _ := unstructured.NestedString(mustGet(t, volumeGroupSnapshots, name).Object, "status", "boundVolumeGroupSnapshotContentName")
	contents := c.dynamic.Resource(volumeGroupSnapshotContents)
	patchContent := func(patch string) *unstructured.Unstructured {
		t.Helper()
		got, err := contents.Patch(ctx, content, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("patch VolumeGroupSnapshotContent %s with %s: %v", content, patch, err)
		}
		return got
	}
	// Whatever happens below, the content goes, with the group's snapshots
	// on the node: a change of its labels is one csi-snapshotter looks at.
	t.Cleanup(func() {
		if _, err := contents.Get(ctx, content, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		_, err := contents.Patch(ctx, content, types.MergePatchType, []byte(`{"spec":{"deletionPolicy":"Delete"},"metadata":{"labels":{"converge.csi.dev/test-cleanup":"yes"}}}`), metav1.PatchOptions{})
		if err == nil {
			err = contents.Delete(ctx, content, metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleaning up VolumeGroupSnapshotContent %s: %v", content, err)
		}
	})
	snapshots := filepath.Join(c.kubeNode.poolsDir, fastPool, "snapshots")
	groupFiles := func() []string {
		t.Helper()
		entries, err := os.ReadDir(snapshots)
		if err != nil {
			t.Fatal(err)
		}
		var files []string
		for _, e := range entries {
			if strings.Contains(e.Name(), uid) {
				files = append(files, e.Name())
			}
		}
		return files
	}
	if len(groupFiles()) == 0 {
		t.Fatalf("no file of group %s in %s", uid, snapshots)
	}
	patchContent(`{"spec":{"deletionPolicy":"Retain"}}`)
	groups := c.dynamic.Resource(volumeGroupSnapshots).Namespace(ns)
	if err := groups.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete VolumeGroupSnapshot %s: %v", name, err)
	}
	const beingDeleted = "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-deleted"
	poll(t, 2*time.Minute, "VolumeGroupSnapshot "+name+" gone, its content kept and marked being deleted", func() (bool, string) {
		if _, err := groups.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("the group is still there (%v)", err)
		}
		got, err := contents.Get(ctx, content, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get VolumeGroupSnapshotContent %s: %v", content, err)
		}
		return got.GetAnnotations()[beingDeleted] != "", fmt.Sprintf("annotations %v", got.GetAnnotations())
	})
	// Deleted with the group's snapshots on the node, as a content made
	// with policy Delete is. A change of the spec is one csi-snapshotter
	// looks at; of the annotation after it, one it does not.
	patchContent(`{"spec":{"deletionPolicy":"Delete"}}`)
	// The content is deleted as it carries the annotation: had
	// csi-snapshotter's look at the spec's change taken the annotation off
	// meanwhile, the deletion's precondition fails and the annotation is
	// put back.
	start := time.Now()
	for try := 0; ; try++ {
		rv := patchContent(`{"metadata":{"annotations":{"groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-created":"yes"}}}`).GetResourceVersion()
		err := contents.Delete(ctx, content, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) || try == 10 {
			t.Fatalf("delete VolumeGroupSnapshotContent %s at version %s: %v", content, rv, err)
		}
	}
	poll(t, 2*time.Minute, "VolumeGroupSnapshotContent "+content+" gone", func() (bool, string) {
		got, err := contents.Get(ctx, content, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("deleting since %v, annotations %v, finalizers %v%s", got.GetDeletionTimestamp(), got.GetAnnotations(),
			got.GetFinalizers(), objectEvents("VolumeGroupSnapshotContent", content))
	})
	t.Logf("the content was gone %.0fs after it was deleted", time.Since(start).Seconds())
	poll(t, time.Minute, "the group's snapshots deleted on the node", func() (bool, string) {
		left := groupFiles()
		return len(left) == 0, strings.Join(left, ", ")
	})
}

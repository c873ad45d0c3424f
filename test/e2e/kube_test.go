package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/e2e/runs"
	polling "github.com/converge-csi/converge/test/testenv/poll"
)

const (
	ns = "default"
	// Volumes are small: mkfs and the images stay quick.
	volumeSize = "64Mi"
	// A pod volume's path in the test pods.
	dataDir   = "/data"
	blockPath = "/dev/xvda"
	// hostnameLabel is the label the kubelet gives its Node: its name.
	hostnameLabel = "kubernetes.io/hostname"
)

// claim creates a PVC of the converge StorageClass and deletes it (and
// waits for its volume to be gone) when t ends.
func claim(t *testing.T, name string, mode corev1.PersistentVolumeMode, access corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
	t.Helper()
	return claimOf(t, name, mode, access, volumeSize, "converge")
}

// claimOf is claim with a size and a StorageClass of the caller's.
func claimOf(t *testing.T, name string, mode corev1.PersistentVolumeMode, access corev1.PersistentVolumeAccessMode, size, class string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return makeClaim(t, name, mode, access, size, class, nil)
}

// makeClaim is claimOf filled from source (a claim or a VolumeSnapshot;
// nil: empty).
func makeClaim(t *testing.T, name string, mode corev1.PersistentVolumeMode, access corev1.PersistentVolumeAccessMode, size, class string, source *corev1.TypedObjectReference) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{access},
			StorageClassName: ptr.To(class),
			VolumeMode:       &mode,
			DataSourceRef:    source,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(size),
			}},
		},
	}
	return createClaim(t, pvc)
}

// createClaim creates the PVC in the test namespace and deletes it when t
// ends.
func createClaim(t *testing.T, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	t.Helper()
	ctx := context.Background()
	out, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PVC %s: %v", pvc.Name, err)
	}
	t.Cleanup(func() {
		err := c.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, pvc.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete PVC %s: %v", pvc.Name, err)
		}
	})
	return out
}

// podSpec is what a test pod varies.
type podSpec struct {
	name    string
	claims  []string // mounted at /data (the first) or attached at /dev/xvda
	block   bool
	command string // sh -c; the default waits for SIGTERM
	// podNetwork runs the pod in a network namespace of its own (an eth0
	// from the run's CNI plugin) rather than on the host's network.
	podNetwork bool
	// image replaces the busybox image; it is pulled if not present.
	image string
	// readyPort, when set, is where the kubelet's readiness probe asks
	// GET / of the pod.
	readyPort int
	// node, when set, is the only node the pod may be scheduled to (a
	// nodeSelector on kubernetes.io/hostname); prefer is a node the
	// scheduler should prefer (a preferred node affinity of weight 100).
	node, prefer string
}

// startPod creates a pod of the busybox image on the host's network and
// waits for it to run; it is deleted when t ends.
func startPod(t *testing.T, s podSpec) *corev1.Pod {
	t.Helper()
	pod := createPod(t, s)
	return waitRunning(t, pod.Name)
}

// podSpecOf is the pod s describes (its claims mounted as volumes v0,
// v1...).
func podSpecOf(s podSpec) corev1.PodSpec {
	if s.command == "" {
		// PID 1 ignores SIGTERM unless it traps it.
		s.command = `trap "exit 0" TERM; while true; do sleep 0.2; done`
	}
	ctr := corev1.Container{
		Name:            "c",
		Image:           busyboxImage,
		ImagePullPolicy: corev1.PullNever,
		Command:         []string{"sh", "-c", s.command},
	}
	if s.image != "" {
		ctr.Image, ctr.ImagePullPolicy = s.image, corev1.PullIfNotPresent
	}
	if s.readyPort != 0 {
		ctr.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(s.readyPort)}}}
	}
	var vols []corev1.Volume
	for i, cl := range s.claims {
		vname := fmt.Sprintf("v%d", i)
		vols = append(vols, corev1.Volume{Name: vname, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cl},
		}})
		if s.block {
			ctr.VolumeDevices = append(ctr.VolumeDevices, corev1.VolumeDevice{Name: vname, DevicePath: blockPath})
		} else {
			ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: vname, MountPath: dataDir})
		}
	}
	pod := corev1.PodSpec{
		HostNetwork:                   !s.podNetwork,
		AutomountServiceAccountToken:  ptr.To(false),
		TerminationGracePeriodSeconds: ptr.To[int64](5),
		Containers:                    []corev1.Container{ctr},
		Volumes:                       vols,
	}
	if s.node != "" {
		pod.NodeSelector = map[string]string{hostnameLabel: s.node}
	}
	if s.prefer != "" {
		pod.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100,
				Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{s.prefer},
				}}},
			}},
		}}
	}
	return pod
}

// createPod creates the pod without waiting for it.
func createPod(t *testing.T, s podSpec) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: s.name}, Spec: podSpecOf(s)}
	ctx := context.Background()
	out, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", s.name, err)
	}
	t.Cleanup(func() { deletePod(t, s.name) })
	return out
}

// waitRunning waits for the pod to be running and ready.
func waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return waitRunningIn(t, ns, name)
}

// waitRunningIn waits for pod name of namespace to be ready, as
// waitRunning.
func waitRunningIn(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll(t, 2*time.Minute, "pod "+namespace+"/"+name+" running", func() (bool, string) {
		var err error
		pod, err = c.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod %s ended: %s%s", name, pod.Status.Phase, podEvents(name))
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("phase %s, conditions %v%s", pod.Status.Phase, pod.Status.Conditions, podEvents(name))
	})
	return pod
}

// deletePod deletes the pod and waits for it to be gone from the API.
func deletePod(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	err := c.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("delete pod %s: %v", name, err)
		return
	}
	poll(t, 2*time.Minute, "pod "+name+" gone", func() (bool, string) {
		_, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// podEvents is the pod's events, to explain a wait that failed.
func podEvents(name string) string {
	evs, err := c.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "\n    event %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// execIn runs a shell command in the pod's container through the API
// server and the kubelet (kubectl exec) and returns its output.
func execIn(t *testing.T, pod, command string) (string, error) {
	t.Helper()
	return execWithin(t, pod, command, 30*time.Second)
}

// execWithin is execIn for a command that may take up to within: one
// that reads or writes a volume while a run's other tests load the disk.
func execWithin(t *testing.T, pod, command string, within time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	out, err := c.kubectl(ctx, "exec", "-n", ns, pod, "-c", "c", "--", "sh", "-c", command)
	return strings.TrimSpace(out), err
}

// waitExec runs the command until it succeeds (the kubelet may not know
// the pod yet) and returns its output.
func waitExec(t *testing.T, pod, command string) string {
	t.Helper()
	var out string
	poll(t, time.Minute, "exec in "+pod, func() (bool, string) {
		var err error
		out, err = execIn(t, pod, command)
		return err == nil, fmt.Sprint(err)
	})
	return out
}

// mustExec is execIn that fails t on error.
func mustExec(t *testing.T, pod, command string) string {
	t.Helper()
	out, err := execIn(t, pod, command)
	if err != nil {
		t.Fatalf("exec in %s: %v", pod, err)
	}
	return out
}

// podWithVolume creates a filesystem claim of ReadWriteOnce and a pod
// using it, both named name, and waits for the pod to run.
func podWithVolume(t *testing.T, name string) (*corev1.Pod, volume) {
	t.Helper()
	claim(t, name, corev1.PersistentVolumeFilesystem, corev1.ReadWriteOnce)
	pod := startPod(t, podSpec{name: name, claims: []string{name}})
	return pod, boundVolume(t, name)
}

// mounts identifies the volume's staging mount and the pod's bind mount
// by their unique mount IDs, to show they were left alone. Either missing
// fails t.
func (v volume) mounts(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	staging, target := v.n.mountID(t, v.stagingPath()), v.n.mountID(t, v.targetPath(pod))
	if staging == "" || target == "" {
		t.Fatalf("volume %s not mounted: staging mount %q, target mount %q", v.handle, staging, target)
	}
	return fmt.Sprintf("staging mount %s, target mount %s", staging, target)
}

// volume is a claim's provisioned volume as its node sees it.
type volume struct {
	pv, handle string
	n          *kubeNode // the node it lives on
}

// boundVolume waits for the claim to be bound and returns its volume.
func boundVolume(t *testing.T, claimName string) volume {
	t.Helper()
	var v volume
	poll(t, time.Minute, "claim "+claimName+" bound", func() (bool, string) {
		pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), claimName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return false, string(pvc.Status.Phase) + podEvents(claimName)
		}
		pv, err := c.client.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := c.nodeNamed(nodeOf(pv))
		if n == nil {
			return false, fmt.Sprintf("PV %s names node %q, not one of the cluster's", pv.Name, nodeOf(pv))
		}
		v = volume{pv: pv.Name, handle: pv.Spec.CSI.VolumeHandle, n: n}
		return true, ""
	})
	return v
}

// stagingPath is where the kubelet stages the volume, on the node.
func (v volume) stagingPath() string {
	sum := sha256.Sum256([]byte(v.handle))
	return filepath.Join(nodeKubeletDir, "plugins", "kubernetes.io", "csi", contract.DefaultDriverName, hex.EncodeToString(sum[:]), "globalmount")
}

// targetPath is where the kubelet publishes a filesystem volume for a pod,
// on the node.
func (v volume) targetPath(pod *corev1.Pod) string {
	return filepath.Join(nodeKubeletDir, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", v.pv, "mount")
}

// image is the volume's backing file in csi-node's data directory.
func (v volume) image() string { return v.n.image(v.handle) }

// calls is what the kubelet (and the suite's provisioner) asked csi-node
// about the volume so far.
func (v volume) calls(t *testing.T) []call {
	t.Helper()
	return v.n.callsFor(t, v.handle)
}

// callsFor is what the node's csi-node was asked about volume handle so
// far.
func (n *kubeNode) callsFor(t *testing.T, handle string) []call {
	t.Helper()
	calls, err := readCalls(n.containerLogs("csi-node"), handle)
	if err != nil {
		t.Fatalf("read csi-node's log on %s: %v", n.node, err)
	}
	return calls
}

// waitCalls waits until csi-node has answered method OK for the volume n
// times in all.
func (v volume) waitCalls(t *testing.T, method string, n int) {
	t.Helper()
	poll(t, 2*time.Minute, fmt.Sprintf("%d x %s(%s) = OK", n, method, v.handle), func() (bool, string) {
		calls := v.calls(t)
		return count(calls, method, "OK") >= n, describe(calls)
	})
}

// gone waits for the volume to be deleted (claim deleted, DeleteVolume
// answered, PV removed) and checks that nothing of it is left on the node:
// no mount of its staging or target paths, no loop device of its image and
// no image.
func (v volume) gone(t *testing.T) {
	t.Helper()
	poll(t, 2*time.Minute, "volume "+v.pv+" deleted", func() (bool, string) {
		_, err := c.client.CoreV1().PersistentVolumes().Get(context.Background(), v.pv, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	for _, m := range runs.MountsIn(v.n.ns.mountinfo(), nodeKubeletDir) {
		if strings.Contains(m, v.pv) || strings.HasPrefix(m, filepath.Dir(v.stagingPath())) {
			t.Errorf("still mounted: %s", m)
		}
	}
	for dev, file := range runs.LoopsBackedUnder(c.dir) {
		if file == v.image() {
			t.Errorf("loop device %s still attached to %s", dev, file)
		}
	}
	if _, err := os.Stat(v.image()); err == nil {
		t.Errorf("image %s still exists", v.image())
	}
}

// release deletes the pods and the claim and checks the volume is gone
// with nothing left behind; the kubelet's calls for it are logged.
func release(t *testing.T, v volume, claimName string, pods ...string) {
	t.Helper()
	for _, p := range pods {
		deletePod(t, p)
	}
	err := c.client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), claimName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete PVC %s: %v", claimName, err)
	}
	v.gone(t)
	t.Logf("csi-node's calls for %s (claim %s):%s", v.handle, claimName, describe(v.calls(t)))
}

// mountID is the first node's mountID.
func mountID(t *testing.T, path string) string {
	t.Helper()
	return c.kubeNode.mountID(t, path)
}

// mountID identifies the mount at path on the node by the kernel's unique
// mount ID (statx STATX_MNT_ID_UNIQUE, never reused, unlike mountinfo's),
// or is "" when nothing is mounted there.
func (n *kubeNode) mountID(t *testing.T, path string) string {
	t.Helper()
	path = n.ns.path(path)
	var st, parent unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &st); err != nil {
		return ""
	}
	if st.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		t.Fatalf("this kernel has no unique mount IDs (STATX_MNT_ID_UNIQUE, Linux 6.8)")
	}
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(path), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &parent); err != nil {
		return ""
	}
	if st.Mnt_id == parent.Mnt_id {
		return ""
	}
	return strconv.FormatUint(st.Mnt_id, 10)
}

// breakExt4 makes the kernel record an error in the ext4 staged for v on
// the node of ns (its sysfs trigger_fs_error), as a failing disk would:
// with errors=remount-ro the filesystem turns read-only.
func breakExt4(t *testing.T, ns *nodeNS, v volume) {
	t.Helper()
	mounts, err := devices.ReadMounts(ns.mountinfo())
	if err != nil {
		t.Fatal(err)
	}
	dev := ""
	for _, m := range mounts {
		if m.Path == v.stagingPath() {
			dev = m.Source
		}
	}
	if !strings.HasPrefix(dev, "/dev/loop") {
		explain := ""
		if ns == c.ns {
			explain = "\n" + mountLines(v.stagingPath())
		}
		t.Fatalf("staging mount of %s: got source %q, want a loop device%s", v.handle, dev, explain)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(dev), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("converge e2e"), 0); err != nil {
		t.Fatalf("triggering an ext4 error: %v", err)
	}
}

// mountLines describes every mount at path on the node, to explain a
// failure.
func mountLines(path string) string {
	mounts, err := devices.ReadMounts(c.ns.mountinfo())
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, m := range mounts {
		if m.Path == path {
			out = append(out, fmt.Sprintf("%s on %s (%s, root %s)", m.Source, m.Path, m.FsType, m.Root))
		}
	}
	return strings.Join(out, "\n")
}

// poll calls check every 200 ms until it reports done or timeout passes;
// then t fails with what and check's last detail.
func poll(t *testing.T, timeout time.Duration, what string, check func() (bool, string)) {
	t.Helper()
	polling.Until(t, timeout, 200*time.Millisecond, what, func() error {
		if done, detail := check(); !done {
			return errors.New(detail)
		}
		return nil
	})
}

// nodeOf is the node a converge volume's node affinity names, "" for none.
func nodeOf(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == contract.TopologyKey && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

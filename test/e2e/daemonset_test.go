package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/converge-csi/converge/pkg/contract"
	polling "github.com/converge-csi/converge/test/testenv/poll"
)

// What only a DaemonSet-deployed driver goes through: its pod deleted and
// replaced, and a rolling update, both under volumes that pods use.

// reconstructed is what csi-node logs when its start-up reconstruction is
// done, the moment /readyz, and so the pod's readiness, turns true.
const reconstructed = "Start-up reconstruction finished"

// writerPod starts a pod of a new claim called name whose container
// appends a counter to /data/count five times a second, and returns it
// with the claim's volume.
func writerPod(t *testing.T, name string) (*corev1.Pod, volume) {
	t.Helper()
	claim(t, name, fs, rwo)
	pod := startPod(t, podSpec{name: name, claims: []string{name},
		command: `trap "exit 0" TERM; i=0; while true; do echo $i >> ` + dataDir + `/count && i=$((i+1)); sleep 0.2; done`})
	return pod, boundVolume(t, name)
}

// counted checks that the writer pod's counter file holds 0, 1, 2, ...
// with no value missing or repeated, and returns how many.
func counted(t *testing.T, pod string) int {
	t.Helper()
	out := mustExec(t, pod, "cat "+dataDir+"/count")
	lines := strings.Fields(out)
	for i, l := range lines {
		if n, err := strconv.Atoi(l); err != nil || n != i {
			t.Fatalf("the writer's file has %q at line %d, want %d", l, i, i)
		}
	}
	return len(lines)
}

// podLog is the log of the named container of one of converge's pods, all
// of its runs; the node is the pod's.
func podLog(pod *corev1.Pod, container string) string {
	n := c.nodeNamed(pod.Spec.NodeName)
	if n == nil {
		return "no node " + pod.Spec.NodeName
	}
	var b strings.Builder
	for _, f := range n.containerLogs(container) {
		if strings.Contains(f, "_"+string(pod.UID)+"/") {
			b.WriteString(tailFile(f, 1<<20))
		}
	}
	return b.String()
}

// waitReplacedPod waits for the node's converge pod to be one other than
// old, Ready, with the driver registered, and checks at every look that
// the pod was never Ready before its csi-node had logged the end of its
// start-up reconstruction.
func waitReplacedPod(t *testing.T, n *kubeNode, old types.UID) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll(t, 3*time.Minute, "a new converge pod on "+n.node+" Ready", func() (bool, string) {
		p, err := n.driverPod(context.Background())
		if err != nil || p == nil || p.UID == old {
			return false, fmt.Sprintf("pod %v: %v", p, err)
		}
		if !podReady(p) {
			return false, containerStates(p)
		}
		if log := podLog(p, "csi-node"); !strings.Contains(log, reconstructed) {
			t.Fatalf("pod %s is Ready, but its csi-node has not logged %q:\n%s", p.Name, reconstructed, tail(log, 20))
		}
		if !n.driverRegistered() {
			return false, "CSINode does not list " + contract.DefaultDriverName
		}
		pod = p
		return true, ""
	})
	return pod
}

// The node's converge pod is deleted while a pod writes to a published
// volume: the application pod goes on writing, its mounts stay, the
// DaemonSet's new pod becomes Ready only once its csi-node has rebuilt its
// view (finding the device its predecessor attached), and a new claim
// mounts afterwards.
func TestDriverPodReplaced(t *testing.T) {
	ctx := context.Background()
	pod, v := writerPod(t, "replaced")
	mounts := v.mounts(t, pod)
	old, err := c.driverPod(ctx)
	if err != nil || old == nil {
		t.Fatalf("the converge pod: %v", err)
	}
	before := counted(t, pod.Name)
	if err := c.client.CoreV1().Pods(daemonSetNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplacedPod(t, c.kubeNode, old.UID)
	afterReplacement(t, pod, v, before, mounts, "after-replace")
}

// afterReplacement checks, once converge's pods were replaced under the
// writer pod, that the writer wrote on (it had written before values), that
// its volume has the mounts it had, and that a new claim called next
// mounts; then it releases both.
func afterReplacement(t *testing.T, pod *corev1.Pod, v volume, before int, mounts, next string) {
	t.Helper()
	after := counted(t, pod.Name)
	if after <= before {
		t.Errorf("the writer wrote nothing while converge's pods were replaced: %d values before, %d after", before, after)
	}
	if now := v.mounts(t, pod); now != mounts {
		t.Errorf("the new converge pod remounted the volume: %s, now %s", mounts, now)
	}
	t.Logf("the writer had written %d values before converge's pods were replaced, %d once they were Ready", before, after)
	nextPod, nv := podWithVolume(t, next)
	mustExec(t, nextPod.Name, "echo new > "+dataDir+"/f && sync")
	release(t, nv, next, nextPod.Name)
	release(t, v, pod.Name, pod.Name)
}

// The DaemonSet is updated to another csi-node image tag while a pod
// writes to a published volume: every node's converge pod is replaced in
// turn (maxUnavailable 1) by one running the new tag, the writer goes on,
// its mounts stay, and a new claim mounts afterwards. The update is
// rolled back when the test ends, the same way.
func TestDriverRollingUpdate(t *testing.T) {
	ctx := context.Background()
	pod, v := writerPod(t, "rolled")
	mounts := v.mounts(t, pod)
	before := counted(t, pod.Name)
	olds := map[string]types.UID{}
	for _, n := range c.nodes {
		p, err := n.driverPod(ctx)
		if err != nil || p == nil {
			t.Fatalf("the converge pod of %s: %v", n.node, err)
		}
		olds[n.node] = p.UID
	}
	setImage := func(tag string) error {
		if _, err := c.kubectl(ctx, "-n", daemonSetNamespace, "set", "image", "daemonset/"+daemonSetName,
			"csi-node="+csiNodeImageName+":"+tag); err != nil {
			return err
		}
		_, err := c.kubectl(ctx, "-n", daemonSetNamespace, "rollout", "status", "daemonset/"+daemonSetName, "--timeout=5m")
		return err
	}
	t.Cleanup(func() {
		if err := setImage(csiNodeImageTag); err != nil {
			t.Errorf("rolling back to %s: %v", csiNodeImageTag, err)
		}
		for _, n := range c.nodes {
			if err := n.waitDriver(ctx); err != nil {
				t.Errorf("after the rollback on %s: %v", n.node, err)
			}
		}
	})
	if err := setImage(csiNodeUpdateTag); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		p := waitReplacedPod(t, n, olds[n.node])
		image := ""
		for _, ctr := range p.Spec.Containers {
			if ctr.Name == "csi-node" {
				image = ctr.Image
			}
		}
		if image != csiNodeImageName+":"+csiNodeUpdateTag {
			t.Errorf("the converge pod of %s runs csi-node of %q, want the new tag", n.node, image)
		}
	}
	afterReplacement(t, pod, v, before, mounts, "after-update")
}

// The node's converge pod is deleted while its csi-node formats a volume
// whose mkfs is stopped (SIGSTOP), as if its writes hung: csi-node, told
// to stop, lets the kubelet's call wait for its own 10 s, within deploy/'s
// termination grace period, then ends what still runs, the mkfs with it.
// The new pod's csi-node takes the volume up from the store,
// finds its device, formats what holds no filesystem yet, and the
// kubelet's retried NodeStageVolume succeeds: the pod runs, reads what it
// writes, and the filesystem, once unmounted, checks clean. Nothing is left
// half-done. The new csi-node's own mkfs is held too, for a while: its
// pod must not be Ready before its start-up reconstruction, which that
// mkfs is part of, has ended.
func TestDriverPodStoppedDuringMkfs(t *testing.T) {
	ctx := context.Background()
	// A large thin xfs: mkfs.xfs writes its log and every allocation
	// group's headers, which gives the test time to find it.
	class := storageClass(t, "converge-slow-mkfs", map[string]string{"csi.storage.k8s.io/fstype": "xfs", "converge.csi.dev/provisioning": "thin"})
	old, err := c.driverPod(ctx)
	if err != nil || old == nil {
		t.Fatalf("the converge pod: %v", err)
	}
	var name string
	var mkfs int
	for attempt := range 3 {
		name = fmt.Sprintf("mkfs-%d", attempt)
		claimOf(t, name, fs, rwo, "8Gi", class)
		createPod(t, podSpec{name: name, claims: []string{name}, node: c.node})
		if mkfs = stopProcessOf(t, old, isMkfs, name); mkfs != 0 {
			break
		}
		// The mkfs ended before the test saw it: the pod runs.
		deletePod(t, name)
		release(t, boundVolume(t, name), name)
	}
	if mkfs == 0 {
		t.Fatalf("no mkfs of csi-node's seen in 3 tries")
	}
	t.Logf("mkfs (process %d) stopped; deleting %s", mkfs, old.Name)
	if err := c.client.CoreV1().Pods(daemonSetNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The new csi-node's start-up formats the volume again: with its mkfs
	// held too, start-up reconstruction cannot end, and the pod must stay
	// not Ready through several of deploy/'s readiness probes (every 5 s).
	var next *corev1.Pod
	poll(t, 2*time.Minute, "the converge pod's successor", func() (bool, string) {
		p, err := c.driverPod(ctx)
		if err != nil || p == nil || p.UID == old.UID {
			return false, fmt.Sprint(p, err)
		}
		next = p
		return true, ""
	})
	if held := stopProcessOf(t, next, isMkfs, name); held == 0 {
		t.Logf("the new csi-node's mkfs ended before the test saw it: its readiness during start-up is not checked")
	} else {
		deadline := time.Now().Add(12 * time.Second)
		for time.Now().Before(deadline) {
			if p, err := c.driverPod(ctx); err == nil && p != nil && podReady(p) {
				t.Fatalf("pod %s is Ready while its csi-node's start-up mkfs is held", p.Name)
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("pod %s stayed not Ready for 12 s while its start-up mkfs (process %d) was held", next.Name, held)
		if err := syscall.Kill(held, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	waitReplacedPod(t, c.kubeNode, old.UID)
	if err := syscall.Kill(mkfs, 0); err == nil {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", mkfs))
		if argv0, _, _ := strings.Cut(string(cmd), "\x00"); isMkfs(filepath.Base(argv0)) {
			t.Errorf("the stopped mkfs (%d) outlived its container", mkfs)
		}
	}
	pod := waitRunning(t, name)
	v := boundVolume(t, name)
	mustExec(t, pod.Name, "echo after > "+dataDir+"/f && sync")
	if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != "after" {
		t.Errorf("the pod read %q", got)
	}
	deletePod(t, pod.Name)
	v.waitCalls(t, "NodeUnstageVolume", 1)
	if out, err := exec.Command("xfs_repair", "-n", v.image()).CombinedOutput(); err != nil {
		t.Errorf("xfs_repair -n of the volume's image: %v\n%s", err, tail(string(out), 30))
	}
	t.Logf("csi-node's calls for %s since the new pod:%s", v.handle, describe(v.calls(t)))
	release(t, v, name)
}

// podProcesses are the PIDs of the pod's processes (their cgroup names the
// pod) whose program's base name matches.
func podProcesses(pod *corev1.Pod, matches func(program string) bool) []int {
	cgroup := "pod" + string(pod.UID)
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		argv0, _, _ := strings.Cut(string(cmd), "\x00")
		if err != nil || !matches(filepath.Base(argv0)) {
			continue
		}
		if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); strings.Contains(string(cg), cgroup) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// isMkfs matches mkfs and its per-filesystem programs (mkfs.xfs).
func isMkfs(program string) bool { return program == "mkfs" || strings.HasPrefix(program, "mkfs.") }

// programNamed matches the program called name only: "csi-node" is also
// the start of "csi-node-driver-registrar", the sidecar beside it.
func programNamed(name string) func(string) bool {
	return func(program string) bool { return program == name }
}

// stopProcessOf waits for a process of the converge pod (its cgroup names
// the pod) whose program's name matches, and stops it with SIGSTOP,
// returning its PID; or returns 0 once the pod called podName runs
// without one having been seen.
func stopProcessOf(t *testing.T, pod *corev1.Pod, matches func(program string) bool, podName string) int {
	t.Helper()
	stopped, lastLook := 0, time.Now()
	// No pause between looks: the process may live for moments only.
	polling.Until(t, 2*time.Minute, 0, fmt.Sprintf("a process of %s stopped, or pod %s running", pod.Name, podName), func() error {
		for _, pid := range podProcesses(pod, matches) {
			if syscall.Kill(pid, syscall.SIGSTOP) == nil {
				stopped = pid
				return nil
			}
		}
		if time.Since(lastLook) > 500*time.Millisecond {
			lastLook = time.Now()
			p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), podName, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}
		return errors.New("no such process, and the pod not running")
	})
	return stopped
}

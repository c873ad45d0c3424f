package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	fs  = corev1.PersistentVolumeFilesystem
	blk = corev1.PersistentVolumeBlock
	rwo = corev1.ReadWriteOnce
)

// A pod writes to a claim and is deleted; a second pod reads the data. The
// kubelet stages, publishes, unpublishes and unstages through converge, and
// nothing is left mounted afterwards.
func testDataOutlivesPod(t *testing.T) {
	claim(t, "outlive", fs, rwo)
	writer := startPod(t, podSpec{name: "outlive-writer", claims: []string{"outlive"}})
	v := boundVolume(t, "outlive")
	token := "written by " + string(writer.UID)
	mustExec(t, writer.Name, fmt.Sprintf("echo %q > %s/f && sync", token, dataDir))
	if id := mountID(t, v.targetPath(writer)); id == "" {
		t.Fatalf("nothing mounted at the writer's target %s", v.targetPath(writer))
	}
	deletePod(t, writer.Name)
	v.waitCalls(t, "NodeUnstageVolume", 1)
	if id := mountID(t, v.stagingPath()); id != "" {
		t.Fatalf("staging path %s still mounted (%s) after NodeUnstageVolume", v.stagingPath(), id)
	}

	reader := startPod(t, podSpec{name: "outlive-reader", claims: []string{"outlive"}})
	if got := mustExec(t, reader.Name, "cat "+dataDir+"/f"); got != token {
		t.Fatalf("the second pod read %q, want %q", got, token)
	}
	deletePod(t, reader.Name)
	v.waitCalls(t, "NodeUnstageVolume", 2)
	calls := v.calls(t)
	for _, m := range []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"} {
		if n := count(calls, m, "OK"); n != 2 {
			t.Errorf("%s answered OK %d times, want 2 (once per pod):%s", m, n, describe(calls))
		}
	}
	release(t, v, "outlive")
}

// A raw block claim is attached to a pod as a device; what the pod writes
// to it is in the volume's image, and a second pod reads it back.
func testRawBlock(t *testing.T) {
	claim(t, "raw", blk, rwo)
	writer := startPod(t, podSpec{name: "raw-writer", claims: []string{"raw"}, block: true})
	v := boundVolume(t, "raw")
	token := "raw " + string(writer.UID)
	mustExec(t, writer.Name, fmt.Sprintf("printf %%s %q | dd of=%s bs=4096 conv=sync,fsync 2>/dev/null", token, blockPath))
	img, err := os.Open(v.image())
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, len(token))
	_, err = img.ReadAt(head, 0)
	img.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(head); got != token {
		t.Fatalf("the image starts with %q, want %q: the pod's device is not the volume", got, token)
	}
	deletePod(t, writer.Name)

	reader := startPod(t, podSpec{name: "raw-reader", claims: []string{"raw"}, block: true})
	got := mustExec(t, reader.Name, fmt.Sprintf("dd if=%s bs=%d count=1 2>/dev/null", blockPath, len(token)))
	if got != token {
		t.Fatalf("the second pod read %q from its device, want %q", got, token)
	}
	if n := count(v.calls(t), "NodePublishVolume", "OK"); n != 2 {
		t.Errorf("NodePublishVolume answered OK %d times, want 2:%s", n, describe(v.calls(t)))
	}
	release(t, v, "raw", reader.Name)
}

// Two pods on the node share a ReadWriteOnce volume: one stage, two
// publishes, and each sees the other's writes. A ReadWriteOncePod volume
// refuses a second pod until the first is gone.
func testSharedVolume(t *testing.T) {
	t.Run("ReadWriteOnce", func(t *testing.T) {
		claim(t, "shared", fs, rwo)
		a := startPod(t, podSpec{name: "shared-a", claims: []string{"shared"}})
		b := startPod(t, podSpec{name: "shared-b", claims: []string{"shared"}})
		v := boundVolume(t, "shared")
		mustExec(t, a.Name, "echo from-a > "+dataDir+"/a")
		mustExec(t, b.Name, "echo from-b > "+dataDir+"/b")
		if got := mustExec(t, a.Name, "cat "+dataDir+"/b"); got != "from-b" {
			t.Errorf("pod a read %q, want from-b", got)
		}
		if got := mustExec(t, b.Name, "cat "+dataDir+"/a"); got != "from-a" {
			t.Errorf("pod b read %q, want from-a", got)
		}
		calls := v.calls(t)
		if n := count(calls, "NodeStageVolume", "OK"); n != 1 {
			t.Errorf("NodeStageVolume answered OK %d times, want 1:%s", n, describe(calls))
		}
		if n := count(calls, "NodePublishVolume", "OK"); n != 2 {
			t.Errorf("NodePublishVolume answered OK %d times, want 2:%s", n, describe(calls))
		}
		release(t, v, "shared", a.Name, b.Name)
	})
	t.Run("ReadWriteOncePod", func(t *testing.T) {
		claim(t, "single", fs, corev1.ReadWriteOncePod)
		first := startPod(t, podSpec{name: "single-first", claims: []string{"single"}})
		v := boundVolume(t, "single")
		createPod(t, podSpec{name: "single-second", claims: []string{"single"}})
		// The scheduler refuses the second pod while the first holds the
		// volume; it is never published twice.
		poll(t, time.Minute, "second pod refused", func() (bool, string) {
			p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), "single-second", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, "ReadWriteOncePod") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%s %v", p.Status.Phase, p.Status.Conditions)
		})
		if n := count(v.calls(t), "NodePublishVolume", "OK"); n != 1 {
			t.Fatalf("NodePublishVolume answered OK %d times while the second pod waits, want 1:%s", n, describe(v.calls(t)))
		}
		mustExec(t, first.Name, "echo from-first > "+dataDir+"/f && sync")
		deletePod(t, first.Name)
		second := waitRunning(t, "single-second")
		if got := mustExec(t, second.Name, "cat "+dataDir+"/f"); got != "from-first" {
			t.Errorf("the second pod read %q, want from-first", got)
		}
		release(t, v, "single", second.Name)
	})
}

// csi-node's container is killed with SIGKILL while a pod uses its volume:
// the pod keeps its data and its mounts, the kubelet starts the container
// again, and the new csi-node, Ready once it has rebuilt its view, mounts
// nothing anew: it finds the volume's loop device, which the container
// before attached through a hostPath mount that ended with it. Deleting the
// pod afterwards tears everything down, device included.
func TestPluginKilled(t *testing.T) {
	pod, v := podWithVolume(t, "killed")
	mustExec(t, pod.Name, "echo before > "+dataDir+"/f && sync")
	mounts := v.mounts(t, pod)

	restarts, err := c.killContainer(context.Background(), t, "csi-node")
	if err != nil {
		t.Fatal(err)
	}
	// Mounts belong to the pods, not to the plugin's process.
	mustExec(t, pod.Name, "echo during >> "+dataDir+"/f && sync")
	if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != "before\nduring" {
		t.Fatalf("while csi-node is down the pod read %q", got)
	}
	if err := c.waitRestarted(context.Background(), "csi-node", restarts); err != nil {
		t.Fatalf("csi-node after its kill: %v", err)
	}
	if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != "before\nduring" {
		t.Fatalf("after the restart the pod read %q", got)
	}
	if now := v.mounts(t, pod); now != mounts {
		t.Errorf("the restart remounted the volume: %s, now %s", mounts, now)
	}
	release(t, v, "killed", pod.Name)
}

// The kubelet is restarted while a pod runs: the pod, its container and its
// mounts are undisturbed, and deleting the pod later is clean.
func TestKubeletRestart(t *testing.T) {
	pod, v := podWithVolume(t, "kubelet-restart")
	mustExec(t, pod.Name, "echo kept > "+dataDir+"/f")
	mounts := v.mounts(t, pod)
	containerID := pod.Status.ContainerStatuses[0].ContainerID

	if err := c.restartKubelet(context.Background()); err != nil {
		t.Fatalf("restart kubelet: %v", err)
	}
	keptAcrossKubeletRestart(t, v, pod, c.node, time.Now(), 2, containerID, "kept", mounts)
	release(t, v, "kubelet-restart", pod.Name)
}

// A pod's volume is unmounted on the host behind the kubelet's back:
// converge mounts it again on its own (the kubelet calls nothing), and the
// pod's container, restarted, finds its data.
func TestExternalUnmountRepaired(t *testing.T) {
	pod, v := podWithVolume(t, "unmounted")
	mustExec(t, pod.Name, "echo survives > "+dataDir+"/f && sync")
	target := v.targetPath(pod)
	publishes := count(v.calls(t), "NodePublishVolume", "OK")
	before := mountID(t, target)

	if out, err := c.ns.run("umount", target); err != nil {
		t.Fatalf("umount %s on the node: %v: %s", target, err, out)
	}
	poll(t, 30*time.Second, "target mounted again", func() (bool, string) {
		id := mountID(t, target)
		return id != "" && id != before, "mounts at the target:\n" + mountLines(target)
	})
	if n := count(v.calls(t), "NodePublishVolume", "OK"); n != publishes {
		t.Errorf("the repair came from the kubelet (%d publishes, had %d)", n, publishes)
	}
	// The running container holds its own copy of the old mount; a new
	// container binds the target afresh and would get an empty directory
	// had converge not repaired it.
	cid := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if out, err := c.ctr("tasks", "kill", "-s", "SIGKILL", cid); err != nil {
		t.Fatalf("kill the container: %v %s", err, out)
	}
	poll(t, 2*time.Minute, "container restarted", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, fmt.Sprint(err)
		}
		s := p.Status.ContainerStatuses[0]
		return s.RestartCount > 0 && s.Ready, fmt.Sprintf("restarts %d, ready %v", s.RestartCount, s.Ready)
	})
	if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != "survives" {
		t.Fatalf("the restarted container read %q", got)
	}
	release(t, v, "unmounted", pod.Name)
}

// testVolumeConditionReachesThePod makes a published ext4 volume go
// read-only after errors, as a failing disk does, and checks that the
// kubelet (CSIVolumeHealth on) reads it from csi-node and writes it into
// the pod's status.volumeHealth, under the pod's name of the volume, as a
// Degraded condition with the reconciler's reason and message. Kubernetes
// v1.37 asks NodeGetVolumeHealth (csi-node's VolumeHealth feature); up to
// v1.36 the kubelet read the condition in NodeGetVolumeStats
// (VolumeCondition) and raised a VolumeConditionAbnormal event instead,
// which v1.37 does not.
func testVolumeConditionReachesThePod(t *testing.T) {
	pod, v := podWithVolume(t, "condition")
	breakExt4(t, c.ns, v)
	volName := pod.Spec.Volumes[0].Name
	poll(t, 2*time.Minute, "a FilesystemReadOnly condition of volume "+volName+" in the pod's status.volumeHealth", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, vh := range p.Status.VolumeHealth {
			for _, hc := range vh.HealthConditions {
				if vh.Name == volName && hc.Status == corev1.VolumeHealthDegraded && hc.Reason == "FilesystemReadOnly" && strings.Contains(hc.Message, v.handle) {
					t.Logf("status.volumeHealth: %s %s: %s", hc.Status, hc.Reason, hc.Message)
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("status.volumeHealth: %+v\n%s", p.Status.VolumeHealth, podEvents(pod.Name))
	})
	release(t, v, "condition", pod.Name)
}

// deployWith copies deploy/ into a directory of the test's, adds the
// components to its kustomization, as a user would, and returns it.
func deployWith(t *testing.T, components ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "deploy")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(c.repo, "deploy"))); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "kustomization.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("components:\n  - " + strings.Join(components, "\n  - ") + "\n")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// The whole of deploy/ (DaemonSet, RBAC, CSIDriver, StorageClass) is valid
// for this API server.
func TestDeployDryRun(t *testing.T) {
	out, err := c.kubectl(context.Background(), "apply", "--dry-run=server", "-k", filepath.Join(c.repo, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"csidriver.storage.k8s.io/converge.csi.dev", "storageclass.storage.k8s.io/converge",
		"daemonset.apps/converge-node", "serviceaccount/converge-node", "clusterrole.rbac.authorization.k8s.io/converge-provisioner"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl apply --dry-run=server -k deploy/ did not report %s:\n%s", want, out)
		}
	}
	t.Logf("kubectl apply --dry-run=server -k deploy/:\n%s", out)

	// SELinux nodes add a component; the API server takes what it makes.
	dir := deployWith(t, "components/selinux")
	built, err := c.kubectl(context.Background(), "kustomize", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"mountPath: /sys/fs/selinux", "path: /sys/fs/selinux", "mountPath: /etc/selinux"} {
		if !strings.Contains(built, want) {
			t.Errorf("deploy/ with components/selinux does not hold %q", want)
		}
	}
	if out, err := c.kubectl(context.Background(), "apply", "--dry-run=server", "-k", dir); err != nil || !strings.Contains(out, "daemonset.apps/converge-node") {
		t.Errorf("kubectl apply --dry-run=server -k deploy/ with components/selinux: %v\n%s", err, out)
	}

	// Snapshots add a component too; the cluster has the snapshot CRDs,
	// the group ones included.
	dir = deployWith(t, "components/snapshots")
	out, err = c.kubectl(context.Background(), "apply", "--dry-run=server", "-k", dir)
	for _, want := range []string{"daemonset.apps/converge-node", "volumesnapshotclass.snapshot.storage.k8s.io/converge",
		"volumegroupsnapshotclass.groupsnapshot.storage.k8s.io/converge", "clusterrole.rbac.authorization.k8s.io/converge-snapshotter"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("kubectl apply --dry-run=server -k deploy/ with components/snapshots did not report %s: %v\n%s", want, err, out)
		}
	}
	if built, err := c.kubectl(context.Background(), "kustomize", dir); err != nil || !strings.Contains(built, "--node-deployment") || !strings.Contains(built, "--resync-period=1m") ||
		!strings.Contains(built, "csi-snapshotter:v8.7.0") {
		t.Errorf("deploy/ with components/snapshots does not run csi-snapshotter v8.7.0 with --node-deployment and --resync-period=1m: %v", err)
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// A pod on the pod network gets an eth0 with a link-local address of its
// own, its node a route to it, so that the kubelet's readiness probe
// reaches the pod's server, and the host no route at all.
func TestPodNetwork(t *testing.T) {
	pod := startPod(t, podSpec{name: "netns", podNetwork: true, readyPort: 8080,
		command: `mkdir -p /tmp/www && echo ok >/tmp/www/index.html && httpd -p 8080 -h /tmp/www && trap "exit 0" TERM; while true; do sleep 0.2; done`})
	addr := mustExec(t, pod.Name, "ip -o -4 addr show eth0")
	if !strings.Contains(addr, "inet 169.254.") {
		t.Errorf("the pod's eth0: got %q, want a 169.254.0.0/16 address", addr)
	}
	nodeRoutes, err := exec.Command("nsenter", "--net="+c.ns.netns(), "ip", "-o", "route").Output()
	if err != nil || !strings.Contains(string(nodeRoutes), pod.Status.PodIP+" dev cv") {
		t.Errorf("the node's routes: got %v %s, want one to %s", err, nodeRoutes, pod.Status.PodIP)
	}
	routes, err := exec.Command("ip", "-o", "route", "show", "table", "all").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(routes), "169.254.") {
		t.Errorf("the host has a route for the pod network:\n%s", routes)
	}
}

// An image that is not on the machine is never pulled from outside: every
// registry resolves to a refusing loopback port.
func TestNoPullLeavesTheMachine(t *testing.T) {
	for i, image := range []string{"registry.k8s.io/e2e-test-images/not-here:1.0", "docker.io/library/not-here:1.0", "pull.example.invalid/not-here:1.0"} {
		name := fmt.Sprintf("pull-%d", i)
		createPod(t, podSpec{name: name, image: image, podNetwork: true})
		poll(t, time.Minute, "a failed pull of "+image, func() (bool, string) {
			evs := podEvents(name)
			return strings.Contains(evs, "Failed to pull image"), evs
		})
		evs := podEvents(name)
		if !strings.Contains(evs, strings.TrimPrefix(refusedRegistry, "http://")) {
			t.Errorf("the pull of %s did not go to %s:%s", image, refusedRegistry, evs)
		}
		deletePod(t, name)
	}
}

// The storage suite's images are here under their manifest names, and
// their shell runs GNU dd (multiVolume writes with oflag=nocache) and has
// let (volumeIO's loops count with it).
func TestSuiteImages(t *testing.T) {
	for i, image := range []string{"registry.k8s.io/e2e-test-images/busybox:1.37.0-2", "registry.k8s.io/e2e-test-images/agnhost:2.66.1"} {
		pod := startPod(t, podSpec{name: fmt.Sprintf("image-%d", i), image: image, podNetwork: true})
		mustExec(t, pod.Name, "i=0; let i+=1; test $i = 1 && dd if=/dev/zero of=/tmp/f bs=512 count=1 oflag=nocache")
		deletePod(t, pod.Name)
	}
}

// keptAcrossKubeletRestart checks what a kubelet restarted (on node, at
// start) under pod must leave as it was: it reports the node again and
// confirms the volume with NodeStageVolume and NodePublishVolume (the
// publishes-th), which change nothing: the same container, never
// restarted, reads want from the volume; the same mounts; nothing torn
// down.
func keptAcrossKubeletRestart(t *testing.T, v volume, pod *corev1.Pod, node string, start time.Time, publishes int, containerID, want, mounts string) {
	t.Helper()
	poll(t, 2*time.Minute, "kubelet back", func() (bool, string) {
		l, err := c.client.CoordinationV1().Leases("kube-node-lease").Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Spec.RenewTime != nil && l.Spec.RenewTime.After(start), "lease not renewed yet"
	})
	v.waitCalls(t, "NodePublishVolume", publishes)
	got := waitRunning(t, pod.Name)
	if id := got.Status.ContainerStatuses[0].ContainerID; id != containerID {
		t.Errorf("container replaced across the kubelet's restart: %s -> %s", containerID, id)
	}
	if n := got.Status.ContainerStatuses[0].RestartCount; n != 0 {
		t.Errorf("container restarted %d times", n)
	}
	if out := waitExec(t, pod.Name, "cat "+dataDir+"/f"); out != want {
		t.Errorf("after the kubelet's restart the pod read %q", out)
	}
	if now := v.mounts(t, pod); now != mounts {
		t.Errorf("mounts changed across the kubelet's restart: %s, now %s", mounts, now)
	}
	calls := v.calls(t)
	if n := count(calls, "NodeUnpublishVolume", "OK") + count(calls, "NodeUnstageVolume", "OK"); n != 0 {
		t.Errorf("the kubelet's restart tore the volume down:%s", describe(calls))
	}
}

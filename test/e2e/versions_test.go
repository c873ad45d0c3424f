package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/converge-csi/converge/pkg/devices"
)

// The older kubelets: converge's node service under each kubelet of
// olderKubeletsToRun (kubelets.go), one node per release. This file's name
// sorts after storage_test.go on purpose: go test runs a package's tests
// in its files' order, and the nodes joined here stay for the rest of the
// run, where the storage suite's scheduler would put its pods on them
// (their pools are small) and fail. The oldest runs
// on the two-node tests' second node; each other one joins a node of its
// own.

// olderNodeNames name the nodes of the kubelets of olderKubeletsToRun
// after the oldest, in order. A node's name must resolve to 127.0.0.1 on
// every machine (the API server dials its kubelet there, for exec and
// metrics): "localhost" is the second node's, and an address is its own
// name.
var olderNodeNames = []string{"127.0.0.1"}

var (
	// olderMu guards olderNodes and olderErrs.
	olderMu    sync.Mutex
	olderNodes = map[string]*kubeNode{}
	olderErrs  = map[string]error{}
)

// olderKubeletNode is the node whose kubelet is of release version, one
// of olderKubeletsToRun, joined to the cluster the first time it is asked
// for.
func olderKubeletNode(t *testing.T, version string) *kubeNode {
	t.Helper()
	if version == oldestKubelet() {
		return secondNode(t)
	}
	olderMu.Lock()
	defer olderMu.Unlock()
	if olderNodes[version] == nil && olderErrs[version] == nil {
		i := -1
		for j, v := range olderKubeletsToRun()[1:] {
			if v == version {
				i = j
			}
		}
		switch {
		case i < 0:
			olderErrs[version] = fmt.Errorf("kubelet %s is not one of %v", version, olderKubeletsToRun())
		case i >= len(olderNodeNames):
			olderErrs[version] = fmt.Errorf("no node name for kubelet %s: add one to olderNodeNames", version)
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			start := time.Now()
			// A data directory of its own, as the second node's: on the
			// first node's filesystem, a run here saw the volume's loop
			// device set to detach from outside 4 s after its stage.
			olderNodes[version], olderErrs[version] = c.addNode(ctx, olderNodeNames[i], secondDataDir, version)
			cancel()
			fmt.Printf("e2e: node %s (kubelet %s) joined in %.1fs\n", olderNodeNames[i], version, time.Since(start).Seconds())
		}
	}
	if err := olderErrs[version]; err != nil {
		t.Fatalf("joining a node with kubelet %s: %v", version, err)
	}
	return olderNodes[version]
}

// Under each older kubelet a pod's volume is staged and published (a pod
// on that node writes and reads it), grows online, survives the kubelet's
// SIGKILL and restart untouched (the restarted kubelet reconstructs it
// from the node's mounts) and is torn down afterwards; a volume whose
// filesystem fails is reported by that kubelet as it reads
// NodeGetVolumeStats' condition: a VolumeConditionAbnormal event on the
// pod and kubelet_volume_stats_health_status_abnormal at 1 (its
// CSIVolumeHealth gate is on, as for every kubelet of the run).
func TestOlderKubelets(t *testing.T) {
	older := olderKubeletsToRun()
	if len(older) == 0 {
		t.Skipf("none of %v is older than the cluster's kubelet %s", olderKubelets, kubernetesVersion)
	}
	// xfs grows online on this machine (a mounted ext4 needs
	// CAP_SYS_RESOURCE to grow), and needs 300 MiB. btrfs would be no
	// smaller: its kernel refuses to resize one to less than 256 MiB.
	class := xfsClass(t)
	// Each release has a node of its own, joined first, one at a time
	// (a join changes the cluster's list of nodes, which the others
	// read): the releases' tests then run at once, each on its own node.
	for _, version := range older {
		olderKubeletNode(t, version)
	}
	for _, version := range older {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			testOlderKubelet(t, version, class)
		})
	}
}

// testOlderKubelet is TestOlderKubelets for kubelet version, volumes of
// class (xfs).
func testOlderKubelet(t *testing.T, version, class string) {
	n := olderKubeletNode(t, version)
	minor, _ := minorOf(version)
	name := "kubelet-" + strings.ReplaceAll(strings.TrimPrefix(minor, "v"), ".", "-")
	const size, grown = "320Mi", "384Mi"

	t.Run("version", func(t *testing.T) {
		node, err := c.client.CoreV1().Nodes().Get(context.Background(), n.node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := node.Status.NodeInfo.KubeletVersion; got != version {
			t.Errorf("node %s reports kubelet %s, want %s", n.node, got, version)
		}
		if !n.driverRegistered() {
			t.Errorf("the CSINode of %s does not list converge: the kubelet did not register it", n.node)
		}
	})

	claimOf(t, name, fs, rwo, size, class)
	pod := startPod(t, podSpec{name: name, claims: []string{name}, node: n.node})
	v := boundVolume(t, name)
	if v.n != n {
		t.Fatalf("the volume of a pod on %s was provisioned on %s", n.node, v.n.node)
	}
	podSize := func(t *testing.T) int64 {
		out := mustExec(t, pod.Name, "df -k "+dataDir+" | tail -1 | awk '{print $2}'")
		k, err := strconv.ParseInt(out, 10, 64)
		if err != nil {
			t.Fatalf("df in the pod: %q: %v", out, err)
		}
		return k << 10
	}

	t.Run("stage and publish", func(t *testing.T) {
		mustExec(t, pod.Name, "echo "+version+" > "+dataDir+"/f && sync")
		if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != version {
			t.Errorf("the pod read %q, want %q", got, version)
		}
		if got := fsTypeAt(t, n, v.targetPath(pod)); got != "xfs" {
			t.Errorf("the pod's volume is mounted as %q, want xfs", got)
		}
		calls := v.calls(t)
		for _, m := range []string{"NodeStageVolume", "NodePublishVolume"} {
			if count(calls, m, "OK") != 1 {
				t.Errorf("%s answered OK %d times on %s, want once:%s", m, count(calls, m, "OK"), n.node, describe(calls))
			}
		}
	})

	t.Run("expansion", func(t *testing.T) {
		before := podSize(t)
		patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, grown)
		if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("grow the claim: %v", err)
		}
		want := resource.MustParse(grown)
		poll(t, 3*time.Minute, "claim grown to "+grown, func() (bool, string) {
			pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got := pvc.Status.Capacity[corev1.ResourceStorage]
			return got.Cmp(want) >= 0, fmt.Sprintf("capacity %s, allocated %v, conditions %v%s", got.String(), pvc.Status.AllocatedResourceStatuses,
				pvc.Status.Conditions, describe(v.calls(t)))
		})
		// The kubelet marks the claim grown once NodeExpandVolume answered,
		// which is once the filesystem grew.
		after := podSize(t)
		if after-before < 48<<20 {
			t.Errorf("the pod's filesystem was %d bytes before the growth and is %d after; want at least 48 MiB more", before, after)
		}
		if n := count(v.calls(t), "NodeExpandVolume", "OK"); n < 1 {
			t.Errorf("NodeExpandVolume never answered OK:%s", describe(v.calls(t)))
		}
		if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != version {
			t.Errorf("after the growth the pod read %q", got)
		}
	})

	t.Run("reconstruction after the kubelet restarts", func(t *testing.T) {
		mounts := v.mounts(t, pod)
		p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		containerID := p.Status.ContainerStatuses[0].ContainerID
		publishes := count(v.calls(t), "NodePublishVolume", "OK")
		// Killed, the kubelet leaves no record of its volumes: the one that
		// starts reconstructs them from the pods' directories and mounts.
		n.kubelet.kill()
		restarted := false
		defer func() {
			// Not left dead for the tests after this one when it fails.
			if !restarted {
				n.runKubelet()
			}
		}()
		if now := v.mounts(t, pod); now != mounts {
			t.Errorf("the kubelet's death changed the mounts: %s, now %s", mounts, now)
		}
		start := time.Now()
		restarted = true
		if err := n.runKubelet(); err != nil {
			t.Fatalf("start the kubelet again: %v", err)
		}
		keptAcrossKubeletRestart(t, v, pod, n.node, start, publishes+1, containerID, version, mounts)
		// The restarted kubelet tears down what it reconstructed.
		deletePod(t, pod.Name)
		v.waitCalls(t, "NodeUnstageVolume", 1)
		calls := v.calls(t)
		if count(calls, "NodeUnpublishVolume", "OK") != 1 {
			t.Errorf("NodeUnpublishVolume answered OK %d times, want once:%s", count(calls, "NodeUnpublishVolume", "OK"), describe(calls))
		}
		release(t, v, name)
	})

	t.Run("volume health", func(t *testing.T) { testOlderKubeletHealth(t, n, name+"-health") })
}

// testOlderKubeletHealth makes the ext4 of a pod's volume on n fail
// (read-only after errors) and checks what n's kubelet makes of the
// condition csi-node reports: an event on the pod and its metric.
func testOlderKubeletHealth(t *testing.T, n *kubeNode, name string) {
	claim(t, name, fs, rwo)
	pod := startPod(t, podSpec{name: name, claims: []string{name}, node: n.node})
	v := boundVolume(t, name)
	// The kubelet reports the volume's health once it has read its stats.
	poll(t, time.Minute, "kubelet_volume_stats_health_status_abnormal of "+name, func() (bool, string) {
		got, err := volumeHealthMetric(n, name)
		return err == nil && got == "0", fmt.Sprintf("%q, %v", got, err)
	})
	breakExt4(t, n.ns, v)
	poll(t, 2*time.Minute, "VolumeConditionAbnormal event on the pod", func() (bool, string) {
		evs, err := c.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == "VolumeConditionAbnormal" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "FilesystemReadOnly") {
				t.Logf("event: %s", e.Message)
				return true, ""
			}
		}
		return false, podEvents(pod.Name)
	})
	poll(t, time.Minute, "kubelet_volume_stats_health_status_abnormal of "+name+" at 1", func() (bool, string) {
		got, err := volumeHealthMetric(n, name)
		return err == nil && got == "1", fmt.Sprintf("%q, %v", got, err)
	})
	release(t, v, name, pod.Name)
}

// fsTypeAt is the filesystem type of the mount at path on n, "" when
// nothing is mounted there.
func fsTypeAt(t *testing.T, n *kubeNode, path string) string {
	t.Helper()
	mounts, err := devices.ReadMounts(n.ns.mountinfo())
	if err != nil {
		t.Fatal(err)
	}
	fsType := ""
	for _, m := range mounts {
		if m.Path == path {
			fsType = m.FsType // the last one is on top
		}
	}
	return fsType
}

// volumeHealthMetric is the value of n's kubelet's
// kubelet_volume_stats_health_status_abnormal for claim, or "" when it has
// none.
func volumeHealthMetric(n *kubeNode, claim string) (string, error) {
	body, err := n.kubeletGet("/metrics")
	if err != nil {
		return "", err
	}
	prefix := fmt.Sprintf(`kubelet_volume_stats_health_status_abnormal{namespace=%q,persistentvolumeclaim=%q}`, ns, claim)
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return strings.TrimSpace(rest), nil
		}
	}
	return "", sc.Err()
}

// kubeletGet gets path of n's kubelet as the API server does, with its
// kubelet client certificate. Not through the API server's node proxy,
// which refuses a node at a loopback address ("address not allowed").
// The kubelet's serving certificate is its own, self-signed: the API
// server does not check it either (no --kubelet-certificate-authority).
func (n *kubeNode) kubeletGet(path string) ([]byte, error) {
	cert, err := tls.LoadX509KeyPair(n.c.pki.path("apiserver-kubelet-client.crt"), n.c.pki.path("apiserver-kubelet-client.key"))
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d%s", n.ports["kubelet"], path))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s of the kubelet of %s: %s: %s", path, n.node, resp.Status, body)
	}
	return body, nil
}

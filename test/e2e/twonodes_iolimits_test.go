package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestTwoNodesIOLimitsWhereverTheResizerRuns switches the class of a claim
// of the second node while the cluster's csi-resizer leads on the first:
// the resizer's csi-node answers the modify of a volume it does not hold
// once the class passes, the resizer writes the class into the volume's
// PV, and the second node's agent (converge-controller node-agent) hands
// it to its own csi-node, which sets the new rule in the pod's cgroups.
// The class the claim was made with is the second node's own
// (CreateVolume's mutable parameters, on the node that provisions). Then
// csi-node and the kubelet of the second node restart: the rule is in
// force at every look, ten a second, from before the kill until a pass
// after csi-node's start-up.
func TestTwoNodesIOLimitsWhereverTheResizerRuns(t *testing.T) {
	b := secondNode(t)
	moveResizerLease(t, c.kubeNode)
	const slow, fast, name = "converge-io-b-slow", "converge-io-b-fast", "io-b"
	attributesClass(t, slow, ioSlowIOPS)
	attributesClass(t, fast, ioFastIOPS)
	classClaim(t, name, slow)
	pod := startPod(t, podSpec{name: name + "-reader", claims: []string{name}, node: b.node, image: toolsImage})
	v := boundVolume(t, name)
	if v.n != b {
		t.Fatalf("the volume of a pod scheduled to %s was provisioned on %s", b.node, v.n.node)
	}
	dev := podDevice(t, pod.Name, dataDir)
	waitReadIOPSRule(t, b, pod, dev, ioSlowIOPS)

	ctx := context.Background()
	claims := c.client.CoreV1().PersistentVolumeClaims(ns)
	if _, err := claims.Patch(ctx, name, types.MergePatchType,
		[]byte(`{"spec":{"volumeAttributesClassName":"`+fast+`"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("switching %s to %s: %v", name, fast, err)
	}
	poll(t, 2*time.Minute, name+"'s current class "+fast, func() (bool, string) {
		pvc, err := claims.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, "") == fast,
			fmt.Sprintf("current class %q, modify %+v, conditions %+v%s", ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, ""),
				pvc.Status.ModifyVolumeStatus, pvc.Status.Conditions, podEvents(name))
	})
	waitReadIOPSRule(t, b, pod, dev, ioFastIOPS)

	// csi-node and the kubelet restart: the rule stays in force
	// throughout, every tenth of a second, and csi-node's start-up, which
	// reconstructs the volume, and its first pass leave it as it is.
	lapses := sampleReadIOPSRule(b, pod, dev, ioFastIOPS)
	restarts, err := b.killContainer(ctx, t, "csi-node")
	if err != nil {
		t.Fatal(err)
	}
	// Its sidecars exit with it; the resizer had restarted when the
	// Lease moved off this node, and meets the kubelet's back-off.
	if p, _ := b.driverPod(ctx); p != nil {
		expectWarning(t, "BackOff", "Pod/"+p.Namespace+"/"+p.Name)
	}
	if err := b.restartKubelet(ctx); err != nil {
		t.Fatalf("restarting %s's kubelet: %v", b.node, err)
	}
	holdsReadIOPSRule(t, b, pod, dev, ioFastIOPS)
	if err := b.waitRestarted(ctx, "csi-node", restarts); err != nil {
		t.Fatalf("csi-node on %s: %v", b.node, err)
	}
	time.Sleep(ioResync)
	samples, bad := lapses()
	if samples < 10 || len(bad) > 0 {
		t.Errorf("the rule out of force at %d of %d looks across the restarts: %s", len(bad), samples, strings.Join(bad[:min(len(bad), 5)], "; "))
	}
	holdsReadIOPSRule(t, b, pod, dev, ioFastIOPS)
	release(t, v, name, pod.Name)
}

// sampleReadIOPSRule looks every tenth of a second at every cgroup of pod
// on n for the read IOPS rule iops of dev, until the function it returns
// is called, which says how many looks there were and what each look that
// found it missing saw.
func sampleReadIOPSRule(n *kubeNode, pod *corev1.Pod, dev string, iops int) func() (int, []string) {
	want := fmt.Sprintf("%s %d", dev, iops)
	stop, done := make(chan struct{}), make(chan struct{})
	var samples int
	var bad []string
	go func() {
		defer close(done)
		for {
			samples++
			files, err := readIOPSFiles(n, pod)
			if err != nil {
				bad = append(bad, time.Now().Format("15:04:05.0")+" "+err.Error())
			}
			for _, f := range files {
				if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != want {
					bad = append(bad, fmt.Sprintf("%s %s: %q (%v)", time.Now().Format("15:04:05.0"), f, strings.TrimSpace(string(b)), err))
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() (int, []string) {
		close(stop)
		<-done
		return samples, bad
	}
}

// holdsReadIOPSRule fails t unless every cgroup of pod on n holds the read
// IOPS rule iops for dev now.
func holdsReadIOPSRule(t *testing.T, n *kubeNode, pod *corev1.Pod, dev string, iops int) {
	t.Helper()
	files, err := readIOPSFiles(n, pod)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s %d", dev, iops)
	for _, f := range files {
		if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s: %q (%v), want %q", f, strings.TrimSpace(string(b)), err, want)
		}
	}
}

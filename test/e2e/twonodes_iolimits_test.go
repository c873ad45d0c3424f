package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

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
// (CreateVolume's mutable parameters, on the node that provisions).
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
	release(t, v, name, pod.Name)
}

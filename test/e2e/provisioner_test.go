package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
)

// TestProvisionerCapacityAsDeployAsks: the capacity csi-provisioner
// publishes is what deploy/'s flags ask of the release
// (--enable-capacity=true, --capacity-ownerref-level=0, and
// --capacity-for-immediate-binding left false): a CSIStorageCapacity per
// WaitForFirstConsumer class for the node, in converge's namespace, owned
// by the node's converge pod (so it goes with the pod, and no DaemonSet
// need be read), and none for a class of Immediate binding, which
// converge does not provision.
func TestProvisionerCapacityAsDeployAsks(t *testing.T) {
	ctx := context.Background()
	immediate := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "capacity-immediate"},
		Provisioner:       contract.DefaultDriverName,
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}
	if _, err := c.client.StorageV1().StorageClasses().Create(ctx, immediate, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.client.StorageV1().StorageClasses().Delete(ctx, immediate.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete StorageClass %s: %v", immediate.Name, err)
		}
	})
	// The Immediate class first: the provisioner's capacity controller
	// reads classes from one informer, in order, so once it has published
	// the second, it has seen the first.
	wffc := storageClass(t, "capacity-wffc", nil)
	pod, err := c.driverPod(ctx)
	if err != nil || pod == nil {
		t.Fatalf("the converge pod of %s: %v", c.node, err)
	}
	var mine *storagev1.CSIStorageCapacity
	poll(t, 2*time.Minute, "CSIStorageCapacity of "+c.node+" for class "+wffc, func() (bool, string) {
		caps, err := c.client.StorageV1().CSIStorageCapacities(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for i, o := range caps.Items {
			seen = append(seen, fmt.Sprintf("%s/%s (class %s)", o.Namespace, o.Name, o.StorageClassName))
			if o.StorageClassName == wffc && o.NodeTopology != nil && o.NodeTopology.MatchLabels[contract.TopologyKey] == c.node {
				mine = &caps.Items[i]
			}
		}
		return mine != nil, strings.Join(seen, ", ")
	})
	if mine.Namespace != daemonSetNamespace {
		t.Errorf("CSIStorageCapacity %s is in namespace %s, want converge's, %s", mine.Name, mine.Namespace, daemonSetNamespace)
	}
	if owners := mine.OwnerReferences; len(owners) != 1 || owners[0].Kind != "Pod" || owners[0].Name != pod.Name || owners[0].UID != pod.UID {
		t.Errorf("CSIStorageCapacity %s is owned by %+v, want pod %s alone", mine.Name, owners, pod.Name)
	}
	if got := mine.Labels["csi.storage.k8s.io/drivername"]; got != contract.DefaultDriverName {
		t.Errorf("CSIStorageCapacity %s has driver label %q, want %s", mine.Name, got, contract.DefaultDriverName)
	}
	if mine.Capacity == nil || mine.Capacity.Sign() <= 0 {
		t.Errorf("CSIStorageCapacity %s has capacity %v, want the node's free space", mine.Name, mine.Capacity)
	}
	caps, err := c.client.StorageV1().CSIStorageCapacities(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range caps.Items {
		if o.StorageClassName == immediate.Name {
			t.Errorf("CSIStorageCapacity %s/%s for class %s, of Immediate binding", o.Namespace, o.Name, immediate.Name)
		}
	}
}

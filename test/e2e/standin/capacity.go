package standin

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// publishCapacity publishes, as external-provisioner --enable-capacity does
// with --node-deployment, one CSIStorageCapacity for each StorageClass of
// the driver (GetCapacity with the class's parameters and this node's
// topology) in its namespace, and deletes those of classes that are gone.
// As with the release's default --capacity-for-immediate-binding=false,
// a class of Immediate binding gets none: the scheduler reads capacity
// only for WaitForFirstConsumer. The suite makes a StorageClass of its own
// for most tests; without its capacity the scheduler finds no room on the
// node.
func (p *provisioner) publishCapacity(ctx context.Context) error {
	classes, err := p.client.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	caps := p.client.StorageV1().CSIStorageCapacities(p.namespace)
	// Only this node's: each node's provisioner owns its own.
	have, err := caps.List(ctx, metav1.ListOptions{LabelSelector: "csi.storage.k8s.io/drivername=" + DriverName +
		",csi.storage.k8s.io/managed-by=" + p.managedBy()})
	if err != nil {
		return err
	}
	byClass := map[string]*storagev1.CSIStorageCapacity{}
	for i := range have.Items {
		byClass[have.Items[i].StorageClassName] = &have.Items[i]
	}
	for _, sc := range classes.Items {
		if sc.Provisioner != DriverName || immediate(&sc) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, p.timeout)
		resp, err := p.ctrl.GetCapacity(cctx, &csi.GetCapacityRequest{
			Parameters:         sc.Parameters,
			AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyKey: p.node}},
		})
		cancel()
		if err != nil {
			return fmt.Errorf("GetCapacity for %s: %w", sc.Name, err)
		}
		capacity := resource.NewQuantity(resp.AvailableCapacity, resource.BinarySI)
		obj := byClass[sc.Name]
		delete(byClass, sc.Name)
		if obj == nil {
			_, err = caps.Create(ctx, &storagev1.CSIStorageCapacity{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "csisc-", Labels: map[string]string{
					"csi.storage.k8s.io/drivername": DriverName, "csi.storage.k8s.io/managed-by": p.managedBy()},
					OwnerReferences: ownedBy(p.owner)},
				NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{TopologyKey: p.node}},
				StorageClassName: sc.Name,
				Capacity:         capacity,
			}, metav1.CreateOptions{})
		} else if obj.Capacity == nil || obj.Capacity.Cmp(*capacity) != 0 {
			obj.Capacity = capacity
			_, err = caps.Update(ctx, obj, metav1.UpdateOptions{})
		}
		if err != nil {
			return err
		}
	}
	for _, obj := range byClass {
		if err := caps.Delete(ctx, obj.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// ownedBy is the owner references of an object owned by owner, if any.
func ownedBy(owner *metav1.OwnerReference) []metav1.OwnerReference {
	if owner == nil {
		return nil
	}
	return []metav1.OwnerReference{*owner}
}

// managedBy is the label value that marks this node's CSIStorageCapacity
// objects, as external-provisioner's node deployment names them.
func (p *provisioner) managedBy() string { return "external-provisioner-" + p.node }

// immediate says whether sc binds its claims at once (Immediate), as
// external-provisioner reads it: a class without a mode is not taken for
// one (the API server defaults the mode, so it never is).
func immediate(sc *storagev1.StorageClass) bool {
	return sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingImmediate
}

package standin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// reclaim deletes the volumes of this node whose claims are gone, and then
// their objects, their finalizer taken off. As in
// external-provisioner's node deployment, a volume whose topology names
// another node is that node's to delete; each volume is retried on its
// own: one that cannot be deleted yet (still staged, say) holds no other
// back.
func (p *provisioner) reclaim(ctx context.Context) error {
	pvs, err := p.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, pv := range pvs.Items {
		if pv.Annotations["pv.kubernetes.io/provisioned-by"] != DriverName || pv.Status.Phase != corev1.VolumeReleased ||
			pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Spec.CSI == nil ||
			NodeOf(&pv) != p.node {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, p.timeout)
		_, err := p.ctrl.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("DeleteVolume %s: %w", pv.Spec.CSI.VolumeHandle, err))
			continue
		}
		if i := slices.Index(pv.Finalizers, ProvisionerFinalizer); i >= 0 {
			// A patch, as external-provisioner's RBAC (deploy/) allows.
			patch := fmt.Sprintf(`[{"op": "test", "path": "/metadata/finalizers/%d", "value": %q}, {"op": "remove", "path": "/metadata/finalizers/%d"}]`, i, ProvisionerFinalizer, i)
			if _, err := p.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err := p.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ProvisionerFinalizer is the finalizer external-provisioner puts on the
// volumes it provisions with reclaim policy Delete and takes off once
// DeleteVolume has run.
const ProvisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// NodeOf is the node a converge volume's node affinity names, "" for none.
func NodeOf(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == TopologyKey && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

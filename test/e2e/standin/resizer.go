package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// resize does for the suite what external-resizer does in deploy/ (its
// image cannot be fetched here), with Kubernetes' recovery from expansion
// failures (GA since 1.34): for a bound claim of a converge volume whose
// request exceeds its capacity, it records the size being allocated and
// ControllerResizeInProgress, calls ControllerExpandVolume, sets the
// PersistentVolume's capacity, and then either leaves the rest to the
// kubelet (NodeResizePending with the FileSystemResizePending condition,
// when node expansion is required) or finishes the resize. A failure is
// recorded with the ControllerResizeError condition, as
// ControllerResizeInfeasible for a final code (the user must change the
// request) and still ControllerResizeInProgress otherwise, and retried.
func (p *provisioner) resize(ctx context.Context) error {
	claims, err := p.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	// Each claim on its own, as in reclaim.
	var errs []error
	for i := range claims.Items {
		pvc := &claims.Items[i]
		want, have := pvc.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Status.Capacity[corev1.ResourceStorage]
		if pvc.Status.Phase != corev1.ClaimBound || want.Cmp(have) <= 0 {
			continue
		}
		switch pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] {
		case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
			if a := pvc.Status.AllocatedResources[corev1.ResourceStorage]; a.Cmp(want) >= 0 {
				continue // the kubelet's turn
			}
		}
		pv, err := p.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != DriverName {
			continue
		}
		if err := p.resizeOne(ctx, pvc, pv, want); err != nil {
			errs = append(errs, fmt.Errorf("resize %s/%s: %w", pvc.Namespace, pvc.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (p *provisioner) resizeOne(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, want resource.Quantity) error {
	claims := p.client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	// As external-resizer does, every change is a patch (deploy/'s RBAC
	// grants patch, not update, on volumes and claims' status): the
	// strategic merge patch from what was read to what is wanted.
	patchStatus := func(old, c *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
		data, err := twoWayPatch(old, c, corev1.PersistentVolumeClaim{})
		if err != nil {
			return nil, err
		}
		return claims.Patch(ctx, old.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status")
	}
	mark := func(old *corev1.PersistentVolumeClaim, st corev1.ClaimResourceStatus, cond corev1.PersistentVolumeClaimConditionType, msg string) (*corev1.PersistentVolumeClaim, error) {
		c := old.DeepCopy()
		if c.Status.AllocatedResources == nil {
			c.Status.AllocatedResources = corev1.ResourceList{}
		}
		c.Status.AllocatedResources[corev1.ResourceStorage] = want
		if c.Status.AllocatedResourceStatuses == nil {
			c.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
		}
		c.Status.AllocatedResourceStatuses[corev1.ResourceStorage] = st
		c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: cond, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(), Message: msg}}
		return patchStatus(old, c)
	}
	pvc, err := mark(pvc, corev1.PersistentVolumeClaimControllerResizeInProgress, corev1.PersistentVolumeClaimResizing, "")
	if err != nil {
		return err
	}
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER}}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		vc.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType, MountFlags: pv.Spec.MountOptions}}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := p.ctrl.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: pv.Spec.CSI.VolumeHandle, CapacityRange: &csi.CapacityRange{RequiredBytes: want.Value()}, VolumeCapability: vc,
	})
	if err != nil {
		st := corev1.PersistentVolumeClaimControllerResizeInProgress
		switch status.Code(err) {
		case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
			st = corev1.PersistentVolumeClaimControllerResizeInfeasible
		}
		if _, merr := mark(pvc, st, corev1.PersistentVolumeClaimControllerResizeError, err.Error()); merr != nil {
			return merr
		}
		return fmt.Errorf("ControllerExpandVolume: %w", err)
	}
	got := *resource.NewQuantity(resp.CapacityBytes, resource.BinarySI)
	grown := pv.DeepCopy()
	grown.Spec.Capacity[corev1.ResourceStorage] = got
	data, err := twoWayPatch(pv, grown, corev1.PersistentVolume{})
	if err != nil {
		return err
	}
	if _, err := p.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}); err != nil {
		return err
	}
	if resp.NodeExpansionRequired {
		_, err = mark(pvc, corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimFileSystemResizePending,
			"Waiting for user to (re-)start a pod to finish file system resize of volume on node.")
		return err
	}
	done := pvc.DeepCopy()
	done.Status.Capacity[corev1.ResourceStorage] = got
	delete(done.Status.AllocatedResourceStatuses, corev1.ResourceStorage)
	done.Status.Conditions = nil
	_, err = patchStatus(pvc, done)
	return err
}

// twoWayPatch is the strategic merge patch that makes old into new, objects
// of the type of kind.
func twoWayPatch(old, new, kind any) ([]byte, error) {
	o, err := json.Marshal(old)
	if err != nil {
		return nil, err
	}
	n, err := json.Marshal(new)
	if err != nil {
		return nil, err
	}
	return strategicpatch.CreateTwoWayMergePatch(o, n, kind)
}

package standin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// provision makes the volume of each pending claim of a converge class
// whose selected node is this node, as external-provisioner with
// --node-deployment does (checkNode). A claim without a selected node is
// left alone: the scheduler selects one for a claim of a
// WaitForFirstConsumer class once a pod uses it; for a claim of an
// Immediate class, with --node-deployment-immediate-binding=false,
// nothing does, and it stays Pending.
func (p *provisioner) provision(ctx context.Context) error {
	claims, err := p.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	// Each claim on its own, as in reclaim.
	var errs []error
	for i := range claims.Items {
		pvc := &claims.Items[i]
		if pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" ||
			pvc.Annotations[selectedNodeKey] != p.node || pvc.Spec.StorageClassName == nil {
			continue
		}
		if ref := pvc.Spec.DataSourceRef; ref != nil {
			// A data source: external-provisioner leaves a claim whose
			// source is a custom resource to that resource's populator,
			// and fills one from a claim (CLONE_VOLUME) or a snapshot
			// (CREATE_DELETE_SNAPSHOT) through the driver; it never makes
			// an empty volume for it.
			clone := ref.Kind == "PersistentVolumeClaim" && (ref.APIGroup == nil || *ref.APIGroup == "")
			snap := ref.Kind == "VolumeSnapshot" && ref.APIGroup != nil && *ref.APIGroup == "snapshot.storage.k8s.io"
			if !clone && !snap {
				continue
			}
		}
		sc, err := p.client.StorageV1().StorageClasses().Get(ctx, *pvc.Spec.StorageClassName, metav1.GetOptions{})
		if err != nil || sc.Provisioner != DriverName {
			continue
		}
		if err := p.provisionOne(ctx, pvc, sc); err != nil {
			errs = append(errs, fmt.Errorf("provision %s/%s: %w", pvc.Namespace, pvc.Name, err))
			if status.Code(err) == codes.ResourceExhausted {
				// external-provisioner: a driver with topology that answers
				// a claim with a selected node RESOURCE_EXHAUSTED may succeed
				// on another node (checkError: ProvisioningReschedule), so the
				// claim's selected node is dropped and the scheduler picks
				// again (rescheduleProvisioning).
				if err := p.reschedule(ctx, pvc); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// selectedNodeKey is the claim annotation that names the node its volume
// is to be made on: the scheduler's choice for a WaitForFirstConsumer
// class.
const selectedNodeKey = "volume.kubernetes.io/selected-node"

// reschedule drops the node selected for pvc, as external-provisioner's
// rescheduleProvisioning does, so that the scheduler selects one again.
func (p *provisioner) reschedule(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	pvc = pvc.DeepCopy()
	delete(pvc.Annotations, selectedNodeKey)
	if _, err := p.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("rescheduling %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return nil
}

// accessibility is what external-provisioner v6.3.0 asks CreateVolume for
// with --node-deployment and --strict-topology
// (GenerateAccessibilityRequirements): this node's topology, requisite
// and preferred, once the class's allowedTopologies admit it (a class
// without them admits every node); an error otherwise.
func (p *provisioner) accessibility(sc *storagev1.StorageClass) (*csi.TopologyRequirement, error) {
	here := []*csi.Topology{{Segments: map[string]string{TopologyKey: p.node}}}
	if len(sc.AllowedTopologies) == 0 {
		return &csi.TopologyRequirement{Requisite: here, Preferred: here}, nil
	}
	for _, term := range sc.AllowedTopologies {
		ok := true
		for _, e := range term.MatchLabelExpressions {
			ok = ok && e.Key == TopologyKey && slices.Contains(e.Values, p.node)
		}
		if ok {
			return &csi.TopologyRequirement{Requisite: here, Preferred: here}, nil
		}
	}
	return nil, fmt.Errorf("selected node %q is not in the allowed topologies of class %s", p.node, sc.Name)
}

// provisionOne makes the volume of pvc, a claim of sc selected for this
// node, and its PersistentVolume, bound to the claim. A volume whose
// object is made already is left to the PV controller to bind.
func (p *provisioner) provisionOne(ctx context.Context, pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass) error {
	name := "pvc-" + string(pvc.UID)
	if _, err := p.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{}); err == nil {
		return nil // made; the PV controller binds it
	}
	topology, err := p.accessibility(sc)
	if err != nil {
		return err
	}
	fsType := sc.Parameters["csi.storage.k8s.io/fstype"]
	params := map[string]string{}
	if p.extraCreateMetadata {
		params["csi.storage.k8s.io/pvc/name"] = pvc.Name
		params["csi.storage.k8s.io/pvc/namespace"] = pvc.Namespace
		params["csi.storage.k8s.io/pv/name"] = name
	}
	for k, v := range sc.Parameters {
		if !strings.HasPrefix(k, "csi.storage.k8s.io/") {
			params[k] = v
		}
	}
	block := pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER}}
	for _, m := range pvc.Spec.AccessModes {
		if m == corev1.ReadWriteOncePod {
			vc.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
	}
	if block {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		// external-provisioner passes the class's mountOptions as the
		// capability's mount flags.
		vc.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: sc.MountOptions}}
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	source, err := p.contentSource(ctx, pvc)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.ctrl.CreateVolume(cctx, &csi.CreateVolumeRequest{
		Name:                      name,
		CapacityRange:             &csi.CapacityRange{RequiredBytes: size.Value()},
		VolumeCapabilities:        []*csi.VolumeCapability{vc},
		Parameters:                params,
		AccessibilityRequirements: topology,
		VolumeContentSource:       source,
	})
	if err != nil {
		return fmt.Errorf("CreateVolume: %w", err)
	}
	v := resp.GetVolume()
	// external-provisioner writes the volume context into the PV's
	// attributes, which the kubelet passes back to NodeStageVolume and
	// NodePublishVolume and converge-controller reads (the on-node-loss
	// choice), beside its own identity.
	attrs := map[string]string{provisionerIdentityKey: p.identity}
	maps.Copy(attrs, v.VolumeContext)
	csiSource := &corev1.CSIPersistentVolumeSource{Driver: DriverName, VolumeHandle: v.VolumeId, VolumeAttributes: attrs}
	if !block {
		csiSource.FSType = fsType
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if sc.ReclaimPolicy != nil {
		reclaim = *sc.ReclaimPolicy
	}
	var finalizers []string
	if reclaim == corev1.PersistentVolumeReclaimDelete {
		// HonorPVReclaimPolicy, on by default since external-provisioner
		// v5: the volume's object stays until DeleteVolume has run.
		finalizers = []string{ProvisionerFinalizer}
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": DriverName},
			Finalizers:  finalizers,
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(v.CapacityBytes, resource.BinarySI)},
			AccessModes:                   pvc.Spec.AccessModes,
			VolumeMode:                    pvc.Spec.VolumeMode,
			StorageClassName:              sc.Name,
			PersistentVolumeReclaimPolicy: reclaim,
			MountOptions:                  sc.MountOptions,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: csiSource},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{p.node},
				}}}},
			}},
		},
	}
	_, err = p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	return err
}

// contentSource returns what a claim's data source asks CreateVolume to
// fill the volume from, as external-provisioner resolves it: a
// VolumeSnapshot that is ready, through its bound content's snapshot
// handle; a bound claim of the same namespace, through its volume's
// handle. Nil for a claim without one; an error while the source is not
// ready (retried at the next step, as external-provisioner requeues).
func (p *provisioner) contentSource(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (*csi.VolumeContentSource, error) {
	ref := pvc.Spec.DataSourceRef
	switch {
	case ref == nil:
		return nil, nil
	case ref.Kind == "PersistentVolumeClaim":
		src, err := p.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if src.Status.Phase != corev1.ClaimBound {
			return nil, fmt.Errorf("source claim %s is not bound yet", ref.Name)
		}
		pv, err := p.client.CoreV1().PersistentVolumes().Get(ctx, src.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: pv.Spec.CSI.VolumeHandle}}}, nil
	}
	snap, err := p.dynamic.Resource(VolumeSnapshots).Namespace(pvc.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	ready, _, _ := unstructured.NestedBool(snap.Object, "status", "readyToUse")
	contentName, _, _ := unstructured.NestedString(snap.Object, "status", "boundVolumeSnapshotContentName")
	if !ready || contentName == "" {
		return nil, fmt.Errorf("snapshot %s is not ready yet", ref.Name)
	}
	content, err := p.dynamic.Resource(volumeSnapshotContents).Get(ctx, contentName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	handle, _, _ := unstructured.NestedString(content.Object, "status", "snapshotHandle")
	if handle == "" {
		return nil, fmt.Errorf("snapshot content %s has no handle yet", contentName)
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: handle}}}, nil
}

var (
	VolumeSnapshots        = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	volumeSnapshotContents = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

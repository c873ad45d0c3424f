package standin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

const (
	DriverName  = "converge.csi.dev"
	TopologyKey = "topology.converge.csi.dev/node"
	// provisionerIdentityKey is the volume attribute in which
	// external-provisioner names itself.
	provisionerIdentityKey = "storage.kubernetes.io/csiProvisionerIdentity"
)

// provisioner does for the suite what external-provisioner does in deploy/
// with --node-deployment and --enable-capacity (its image cannot be
// fetched here): for a claim of a converge StorageClass whose pod the
// scheduler placed on this node, it calls CreateVolume on csi-node and
// creates the bound PersistentVolume; for a released volume it calls
// DeleteVolume and deletes the PersistentVolume; it publishes the node's
// CSIStorageCapacity from GetCapacity; and, on the node whose stand-in
// leads (as external-resizer's leader election picks one of its instances
// in the DaemonSet), it expands volumes as external-resizer does (see
// resize). The kubelet is not involved; what it does with the volumes is
// what the suite tests.
type provisioner struct {
	client kubernetes.Interface
	// dynamic reads the snapshot API's objects (VolumeSnapshot,
	// VolumeSnapshotContent), whose typed client is not the suite's.
	dynamic dynamic.Interface
	node    string
	conn    *grpc.ClientConn
	ctrl    csi.ControllerClient
	// leads is true on the one node whose resizer works for the cluster.
	leads atomic.Bool
	// provisions is false for a resizer alone.
	provisions bool
	// owner, when set, owns the CSIStorageCapacity objects it makes, so
	// that they go with it (--capacity-ownerref-level).
	owner *metav1.OwnerReference
	// identity is what external-provisioner writes beside the volume
	// context into every PV's attributes, under provisionerIdentityKey:
	// its start in milliseconds, a random number and the driver's name.
	identity string

	// mu guards errs.
	mu   sync.Mutex
	errs []string
}

func newProvisioner(client kubernetes.Interface, dyn dynamic.Interface, node, csiSock string) (*provisioner, error) {
	conn, err := grpc.NewClient("unix://"+csiSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &provisioner{client: client, dynamic: dyn, node: node, conn: conn, ctrl: csi.NewControllerClient(conn), provisions: true,
		identity: fmt.Sprintf("%d-%d-%s", time.Now().UnixMilli(), rand.IntN(10000), DriverName)}, nil
}

// run works every 200 ms until ctx ends. A step that fails (csi-node is
// being restarted, say) is retried at the next one.
func (p *provisioner) run(ctx context.Context) {
	defer p.conn.Close()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	lastCapacity := time.Time{}
	for {
		if p.provisions && time.Since(lastCapacity) > time.Second {
			if p.note(p.publishCapacity(ctx)) {
				lastCapacity = time.Now()
			}
		}
		if p.provisions {
			p.note(p.provision(ctx))
		}
		if p.leads.Load() {
			p.note(p.resize(ctx))
		}
		if p.provisions {
			p.note(p.reclaim(ctx))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lead makes this node's resizer the cluster's leader, or no longer.
func (p *provisioner) lead(on bool) { p.leads.Store(on) }

func (p *provisioner) note(err error) bool {
	if err == nil {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errs) < 100 {
		p.errs = append(p.errs, time.Now().Format("15:04:05.000")+" "+err.Error())
	}
	return false
}

func (p *provisioner) errors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// publishCapacity publishes, as external-provisioner --enable-capacity does
// with per-node topology, one CSIStorageCapacity for each StorageClass of
// the driver (GetCapacity with the class's parameters), and deletes those
// of classes that are gone. The suite makes a StorageClass of its own for
// most tests; without its capacity the scheduler finds no room on the node.
func (p *provisioner) publishCapacity(ctx context.Context) error {
	classes, err := p.client.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	caps := p.client.StorageV1().CSIStorageCapacities("kube-system")
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
		if sc.Provisioner != DriverName {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
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

func (p *provisioner) provision(ctx context.Context) error {
	claims, err := p.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	// Each claim on its own, as in reclaim.
	var errs []error
	for i := range claims.Items {
		pvc := &claims.Items[i]
		selected := pvc.Annotations["volume.kubernetes.io/selected-node"]
		if pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" ||
			selected != "" && selected != p.node || pvc.Spec.StorageClassName == nil {
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
		if selected == "" {
			// Immediate binding: as external-provisioner does with
			// --node-deployment-immediate-binding (its default), the
			// node's provisioner claims a claim its class allows on this
			// node by setting the selected-node annotation, then makes it.
			immediate := sc.VolumeBindingMode == nil || *sc.VolumeBindingMode == storagev1.VolumeBindingImmediate
			if !immediate || !p.allowed(sc) {
				continue
			}
			if pvc.Annotations == nil {
				pvc.Annotations = map[string]string{}
			}
			pvc.Annotations["volume.kubernetes.io/selected-node"] = p.node
			if pvc, err = p.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
				errs = append(errs, fmt.Errorf("claim %s/%s for this node: %w", claims.Items[i].Namespace, claims.Items[i].Name, err))
				continue
			}
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

// reschedule drops the node selected for pvc, as external-provisioner's
// rescheduleProvisioning does, so that the scheduler selects one again.
func (p *provisioner) reschedule(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	pvc = pvc.DeepCopy()
	delete(pvc.Annotations, "volume.kubernetes.io/selected-node")
	if _, err := p.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("rescheduling %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return nil
}

// allowed reports whether the class's allowedTopologies admit this node
// (a class without them admits every node).
func (p *provisioner) allowed(sc *storagev1.StorageClass) bool {
	if len(sc.AllowedTopologies) == 0 {
		return true
	}
	for _, term := range sc.AllowedTopologies {
		ok := true
		for _, e := range term.MatchLabelExpressions {
			ok = ok && e.Key == TopologyKey && slices.Contains(e.Values, p.node)
		}
		if ok {
			return true
		}
	}
	return false
}

func (p *provisioner) provisionOne(ctx context.Context, pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass) error {
	name := "pvc-" + string(pvc.UID)
	if _, err := p.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{}); err == nil {
		return nil // made; the PV controller binds it
	}
	fsType := sc.Parameters["csi.storage.k8s.io/fstype"]
	params := map[string]string{
		// What --extra-create-metadata adds.
		"csi.storage.k8s.io/pvc/name":      pvc.Name,
		"csi.storage.k8s.io/pvc/namespace": pvc.Namespace,
		"csi.storage.k8s.io/pv/name":       name,
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
	here := []*csi.Topology{{Segments: map[string]string{TopologyKey: p.node}}}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	source, err := p.contentSource(ctx, pvc)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := p.ctrl.CreateVolume(cctx, &csi.CreateVolumeRequest{
		Name:                      name,
		CapacityRange:             &csi.CapacityRange{RequiredBytes: size.Value()},
		VolumeCapabilities:        []*csi.VolumeCapability{vc},
		Parameters:                params,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: here, Preferred: here},
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
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
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

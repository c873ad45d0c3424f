package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
)

// nodeVolumesPolicy is deploy/components/node-volumes' ValidatingAdmissionPolicy,
// which deploy/kustomization.yaml lists and so the run installs; its
// refusals name it.
const nodeVolumesPolicy = "converge-node-own-volumes"

// nodeNameExtra is the user extra in which the API server gives the node
// of the pod a service account token is bound to.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// TestTwoNodesNodeTouchesOnlyItsOwnVolumes asks the API server, with the
// token of the first node's converge pod (a TokenRequest bound to the pod,
// as the kubelet makes it), for what root on that node could do with the
// token: each write of another node's volume, of a volume of another kind
// or driver, of a volume that names a Secret or a second node, of another
// node's claim or CSIStorageCapacity, of another driver's claim, of more of
// its own claim than external-provisioner changes, of the status of a claim
// converge did not provision or beyond what csi-resizer writes, and of a
// Lease not the resizer's is refused by the policy, not by RBAC (which
// allows every one of them); the first node's own volume, claim and
// capacity, a growth of the second node's volume, a class set on it, and a claim's status as
// the cluster's one csi-resizer makes them wherever it runs (a resize's,
// and a modify's marked and done), and the
// clone finalizer that csi-provisioner adds to and takes off a converge
// claim of the second node (a clone's source) are accepted; with the
// finalizer, nothing else of that claim may change. Every shape of node
// affinity but one term of key In [its node] (a second term, two values,
// NotIn, Exists, matchFields), a volume of its node with another node's
// handle, a token of the account bound to no pod, and
// a forged volume made by server-side apply or in a dry run are refused
// too.
func TestTwoNodesNodeTouchesOnlyItsOwnVolumes(t *testing.T) {
	b := secondNode(t)
	ctx := context.Background()
	asA := driverPodClient(t, c.kubeNode)
	pvs, caps := asA.CoreV1().PersistentVolumes(), asA.StorageV1().CSIStorageCapacities(daemonSetNamespace)

	// Fixtures, made as the admin: a converge volume of the second node
	// and a volume of another CSI driver on the first node.
	prefix := fmt.Sprintf("policy-%d-", time.Now().UnixNano()%100000)
	// What a refusal that failed, or an acceptance, left.
	t.Cleanup(func() {
		for _, name := range []string{"forged", "hostpath", "own", "secret", "ghost", "terms", "values", "notin", "exists",
			"fields", "unbound", "ssa", "dry", "handle"} {
			deleteAdmin(t, prefix+name)
		}
		for _, name := range []string{"capa", "capb"} {
			err := c.client.StorageV1().CSIStorageCapacities(daemonSetNamespace).Delete(ctx, prefix+name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s: %v", prefix+name, err)
			}
		}
		err := c.client.CoordinationV1().Leases(daemonSetNamespace).Delete(ctx, "cloud-controller-manager", metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the forged Lease: %v", err)
		}
	})
	onB := adminPV(t, convergePV(prefix+"b", b.node))
	// The second node's volumes as external-provisioner makes them, with
	// its finalizer: one kept (Retain), one deleted with its claim.
	retainedB := adminPV(t, withProvisionerFinalizer(t, convergePV(prefix+"retb", b.node)))
	deletedB := convergePV(prefix+"delb", b.node)
	deletedB.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	deletedB = adminPV(t, withProvisionerFinalizer(t, deletedB))
	// external-provisioner's patch that takes its finalizer off (first in
	// the list here), and with it, a label.
	dropFinalizer := []byte(`[{"op":"test","path":"/metadata/finalizers/0","value":"` + provisionerFinalizer + `"},` +
		`{"op":"remove","path":"/metadata/finalizers/0"}]`)
	dropFinalizerAndLabel := []byte(`[{"op":"test","path":"/metadata/finalizers/0","value":"` + provisionerFinalizer + `"},` +
		`{"op":"remove","path":"/metadata/finalizers/0"},{"op":"add","path":"/metadata/labels","value":{"converge.csi.dev/test":"policy"}}]`)
	other := convergePV(prefix+"other", c.node)
	other.Spec.CSI.Driver = "other.csi.example.com"
	adminPV(t, other)

	// Claims of a class nothing provisions, selected for each node, as the
	// scheduler selects them: converge's, and, on the first node, another
	// driver's (whose WaitForFirstConsumer claims the scheduler selects
	// nodes for too).
	claimA := adminClaim(t, prefix+"claima", c.node, "other.csi.example.com")
	claimB := adminClaim(t, prefix+"claimb", b.node, contract.DefaultDriverName)
	ownClaim := adminClaim(t, prefix+"claimown", c.node, contract.DefaultDriverName)
	// A claim converge provisions, selected for the second node: a clone's
	// source, whose clone's pod may land on the first node, whose
	// provisioner then holds the source with its finalizer.
	source := adminClaim(t, prefix+"sourceb", b.node, contract.DefaultDriverName)
	if got, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, source, metav1.GetOptions{}); err != nil ||
		!slices.Contains(got.Finalizers, "kubernetes.io/pvc-protection") {
		t.Fatalf("%s, as the API server's claim protection makes it, has no finalizer kubernetes.io/pvc-protection: %v", source, err)
	}
	// What a refusal that failed, or an acceptance that was not undone,
	// left: a finalizer that would hold the claim's deletion.
	t.Cleanup(func() {
		if err := updateClaim(ctx, c.client, source, func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Finalizers = slices.DeleteFunc(pvc.Finalizers, func(f string) bool { return f != "kubernetes.io/pvc-protection" })
		}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("taking the finalizers off %s: %v", source, err)
		}
	})

	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"a converge volume pinned to the second node", func() error {
			_, err := pvs.Create(ctx, convergePV(prefix+"forged", b.node), metav1.CreateOptions{})
			return err
		}},
		{"a hostPath volume of /", func() error {
			pv := convergePV(prefix+"hostpath", c.node)
			pv.Spec.CSI = nil
			pv.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/"}
			_, err := pvs.Create(ctx, pv, metav1.CreateOptions{})
			return err
		}},
		{"a patch of another driver's volume", func() error {
			_, err := pvs.Patch(ctx, other.Name, types.StrategicMergePatchType,
				[]byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`), metav1.PatchOptions{})
			return err
		}},
		{"a delete of the second node's volume", func() error {
			return pvs.Delete(ctx, onB.Name, metav1.DeleteOptions{})
		}},
		{"a growth of the second node's volume that also binds it to a claim", func() error {
			_, err := pvs.Patch(ctx, onB.Name, types.StrategicMergePatchType,
				[]byte(`{"spec":{"capacity":{"storage":"2Gi"},"claimRef":{"namespace":"default","name":"stolen"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"a shrink of the second node's volume", func() error {
			_, err := pvs.Patch(ctx, onB.Name, types.StrategicMergePatchType,
				[]byte(`{"spec":{"capacity":{"storage":"512Mi"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"an update of a claim selected for the second node", func() error {
			return labelClaim(ctx, asA, claimB)
		}},
		{"an owner for another driver's claim selected for the first node", func() error {
			// The garbage collector deletes a claim whose owner is not there.
			// An update: the verb the account has on claims.
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				pvc, err := asA.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claimA, metav1.GetOptions{})
				if err != nil {
					return err
				}
				pvc.OwnerReferences = append(pvc.OwnerReferences, metav1.OwnerReference{
					APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "00000000-0000-0000-0000-000000000050"})
				_, err = asA.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{})
				return err
			})
		}},
		{"a change of its own claim other than dropping the selected node", func() error {
			return labelClaim(ctx, asA, ownClaim)
		}},
		{"a claim's allocated storage beyond its request", func() error {
			// ResourceQuota counts it: the namespace's quota would be full.
			_, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, ownClaim, types.MergePatchType,
				[]byte(`{"status":{"allocatedResources":{"storage":"1Ei"}}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"a converge volume pinned to the first node that names a Secret", func() error {
			// Bound to a claim a pod on the node uses, the Node authorizer
			// would let the node's kubelet read the Secret.
			pv := convergePV(prefix+"secret", c.node)
			pv.Spec.CSI.NodePublishSecretRef = &corev1.SecretReference{Namespace: "kube-system", Name: "bootstrap-token-abcdef"}
			pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: ns, Name: ownClaim}
			_, err := pvs.Create(ctx, pv, metav1.CreateOptions{})
			return err
		}},
		{"a converge volume pinned to the first node that names another provisioner", func() error {
			// Released, another driver's provisioner, which trusts
			// provisioned-by over spec.csi.driver, would delete the volume
			// of that driver its handle names.
			pv := convergePV(prefix+"otherprov", c.node)
			pv.Annotations = map[string]string{"pv.kubernetes.io/provisioned-by": "other.csi.example.com"}
			pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
			_, err := pvs.Create(ctx, pv, metav1.CreateOptions{})
			return err
		}},
		{"a converge volume pinned to the first node that says it migrated to another driver", func() error {
			pv := convergePV(prefix+"migrated", c.node)
			pv.Annotations = map[string]string{"pv.kubernetes.io/migrated-to": "other.csi.example.com"}
			_, err := pvs.Create(ctx, pv, metav1.CreateOptions{})
			return err
		}},
		{"a converge volume whose affinity names a second node", func() error {
			// A term holds when all its expressions do: this volume is on
			// the first node, but read for its first expression it is on a
			// node that is not there, and converge-controller would release
			// its claim.
			pv := convergePV(prefix+"ghost", c.node)
			term := &pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0]
			term.MatchExpressions = append([]corev1.NodeSelectorRequirement{{
				Key: contract.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"ghost"},
			}}, term.MatchExpressions...)
			_, err := pvs.Create(ctx, pv, metav1.CreateOptions{})
			return err
		}},
		// Every shape of affinity but key In [its node] is refused: pkg/nodeloss
		// and the scheduler would each read another node in it.
		{"a converge volume pinned to the first node with the second node's handle", func() error {
			// The snapshot labeller would find the handle on two PVs and
			// route no group of it.
			pv := convergePV(prefix+"handle", c.node)
			pv.Spec.CSI.VolumeHandle = onB.Spec.CSI.VolumeHandle
			return createPV(ctx, pvs, pv, metav1.CreateOptions{})
		}},
		{"a converge volume with a second affinity term naming the second node", func() error {
			pv := convergePV(prefix+"terms", c.node)
			terms := &pv.Spec.NodeAffinity.Required.NodeSelectorTerms
			*terms = append(*terms, convergePV("", b.node).Spec.NodeAffinity.Required.NodeSelectorTerms...)
			return createPV(ctx, pvs, pv, metav1.CreateOptions{})
		}},
		{"a converge volume whose expression names both nodes", func() error {
			pv := convergePV(prefix+"values", c.node)
			e := &pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0]
			e.Values = append(e.Values, b.node)
			return createPV(ctx, pvs, pv, metav1.CreateOptions{})
		}},
		{"a converge volume whose expression is NotIn", func() error {
			pv := convergePV(prefix+"notin", c.node)
			pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Operator = corev1.NodeSelectorOpNotIn
			return createPV(ctx, pvs, pv, metav1.CreateOptions{})
		}},
		{"a converge volume whose expression is Exists", func() error {
			pv := convergePV(prefix+"exists", c.node)
			e := &pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0]
			e.Operator, e.Values = corev1.NodeSelectorOpExists, nil
			return createPV(ctx, pvs, pv, metav1.CreateOptions{})
		}},
		{"a converge volume pinned to the first node by matchFields beside its expression", func() error {
			pv := convergePV(prefix+"fields", c.node)
			pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchFields = []corev1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{b.node}}}
			return createPV(ctx, pvs, pv, metav1.CreateOptions{})
		}},
		{"the first node's own volume, with a converge-node token bound to no pod", func() error {
			return createPV(ctx, unboundDriverClient(t).CoreV1().PersistentVolumes(), convergePV(prefix+"unbound", c.node), metav1.CreateOptions{})
		}},
		{"a converge volume pinned to the second node, by server-side apply", func() error {
			pv := convergePV(prefix+"ssa", b.node)
			pv.APIVersion, pv.Kind = "v1", "PersistentVolume"
			body, err := json.Marshal(pv)
			if err != nil {
				return err
			}
			_, err = pvs.Patch(ctx, pv.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "policy-test", Force: ptr.To(true)})
			return err
		}},
		{"a converge volume pinned to the second node, in a dry run", func() error {
			return createPV(ctx, pvs, convergePV(prefix+"dry", b.node), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"a Lease other than the resizer's", func() error {
			_, err := asA.CoordinationV1().Leases(daemonSetNamespace).Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "cloud-controller-manager"},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("forged"), LeaseDurationSeconds: ptr.To[int32](1 << 30)},
			}, metav1.CreateOptions{})
			return err
		}},
		{"csi-provisioner's finalizer taken off the second node's volume that is not Retain", func() error {
			_, err := pvs.Patch(ctx, deletedB.Name, types.JSONPatchType, dropFinalizer, metav1.PatchOptions{})
			return err
		}},
		{"csi-provisioner's finalizer taken off the second node's Retain volume, with a label", func() error {
			_, err := pvs.Patch(ctx, retainedB.Name, types.JSONPatchType, dropFinalizerAndLabel, metav1.PatchOptions{})
			return err
		}},
		{"the clone finalizer on another driver's claim", func() error {
			return updateClaim(ctx, asA, claimA, addFinalizer(cloneFinalizer))
		}},
		{"the clone finalizer and another finalizer on a converge claim selected for the second node", func() error {
			return updateClaim(ctx, asA, source, func(pvc *corev1.PersistentVolumeClaim) {
				addFinalizer(cloneFinalizer)(pvc)
				addFinalizer("converge.csi.dev/test")(pvc)
			})
		}},
		{"the clone finalizer and a label on a converge claim selected for the second node", func() error {
			return updateClaim(ctx, asA, source, func(pvc *corev1.PersistentVolumeClaim) {
				addFinalizer(cloneFinalizer)(pvc)
				pvc.Labels = map[string]string{"converge.csi.dev/test": "policy"}
			})
		}},
		{"the clone finalizer on a converge claim selected for the second node, selecting it for the first", func() error {
			return updateClaim(ctx, asA, source, func(pvc *corev1.PersistentVolumeClaim) {
				addFinalizer(cloneFinalizer)(pvc)
				pvc.Annotations["volume.kubernetes.io/selected-node"] = c.node
			})
		}},
		{"the claim protection finalizer taken off a converge claim selected for the second node", func() error {
			return updateClaim(ctx, asA, source, func(pvc *corev1.PersistentVolumeClaim) {
				pvc.Finalizers = slices.DeleteFunc(pvc.Finalizers, func(f string) bool { return f == "kubernetes.io/pvc-protection" })
			})
		}},
		{"a status write of a converge claim of the second node that puts an owner on it", func() error {
			// The claim's status strategy keeps metadata: the garbage
			// collector would delete a claim whose owner is not there.
			_, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claimB, types.MergePatchType,
				[]byte(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000051"}]}}`),
				metav1.PatchOptions{}, "status")
			return err
		}},
		{"a status write of a converge claim of the second node that selects it for the first", func() error {
			_, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claimB, types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"volume.kubernetes.io/selected-node":"`+c.node+`"}}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"a current attributes class of a converge claim of the second node that no modify of it named", func() error {
			// A claim's current class is what csi-resizer reached with a
			// modify the claim asked for, and so its volume's limits.
			_, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claimB, types.MergePatchType,
				[]byte(`{"status":{"currentVolumeAttributesClassName":"forged"}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"a modify of a converge claim of the second node toward a class the claim does not name", func() error {
			_, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claimB, types.MergePatchType,
				[]byte(`{"status":{"modifyVolumeStatus":{"status":"InProgress","targetVolumeAttributesClassName":"forged"}}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"a status patch of a claim converge did not provision", func() error {
			_, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claimA, types.MergePatchType,
				[]byte(`{"status":{"allocatedResources":{"storage":"100Gi"}}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"the second node's CSIStorageCapacity", func() error {
			_, err := caps.Create(ctx, nodeCapacity(prefix+"capb", b.node), metav1.CreateOptions{})
			return err
		}},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			err := tc.do()
			if err == nil {
				t.Fatalf("%s: accepted, want the policy %s to refuse it", tc.name, nodeVolumesPolicy)
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+nodeVolumesPolicy+"'") {
				t.Fatalf("%s: got %v, want the policy %s's refusal", tc.name, err, nodeVolumesPolicy)
			}
			t.Logf("refused: %v", err)
		})
	}

	t.Run("accepted: the first node's own volume", func(t *testing.T) {
		pv, err := pvs.Create(ctx, convergePV(prefix+"own", c.node), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating a converge volume pinned to %s: %v", c.node, err)
		}
		if _, err := pvs.Patch(ctx, pv.Name, types.StrategicMergePatchType,
			[]byte(`{"metadata":{"labels":{"converge.csi.dev/test":"own"}}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("patching its own volume: %v", err)
		}
		if err := pvs.Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting its own volume: %v", err)
		}
	})
	t.Run("accepted: a growth of the second node's volume, as csi-resizer makes it", func(t *testing.T) {
		// external-resizer's patch: spec.capacity grown and, with its
		// AnnotateFsResize gate (beta, on), the capacity before.
		patch := `{"metadata":{"annotations":{"volume.alpha.kubernetes.io/pre-resize-capacity":"1Gi"}},"spec":{"capacity":{"storage":"2Gi"}}}`
		got, err := pvs.Patch(ctx, onB.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("growing %s's volume: %v", b.node, err)
		}
		if q := got.Spec.Capacity[corev1.ResourceStorage]; q.Cmp(resource.MustParse("2Gi")) != 0 {
			t.Errorf("capacity after the growth: got %s, want 2Gi", q.String())
		}
	})
	t.Run("accepted: a class set on the second node's volume, as csi-resizer does once a modify is done", func(t *testing.T) {
		got, err := pvs.Patch(ctx, onB.Name, types.MergePatchType, []byte(`{"spec":{"volumeAttributesClassName":"policy-modified"}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("setting the class of %s's volume: %v", b.node, err)
		}
		if got := ptr.Deref(got.Spec.VolumeAttributesClassName, ""); got != "policy-modified" {
			t.Errorf("class after the patch: %q", got)
		}
	})
	t.Run("accepted: csi-provisioner's finalizer taken off the second node's Retain volume, as every node's provisioner does", func(t *testing.T) {
		got, err := pvs.Patch(ctx, retainedB.Name, types.JSONPatchType, dropFinalizer, metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("taking %s off %s's Retain volume: %v", provisionerFinalizer, b.node, err)
		}
		if slices.Contains(got.Finalizers, provisionerFinalizer) {
			t.Errorf("%s's finalizers after the removal: %v", got.Name, got.Finalizers)
		}
	})
	t.Run("accepted: the selected node dropped from its own claim, as external-provisioner reschedules", func(t *testing.T) {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pvc, err := asA.CoreV1().PersistentVolumeClaims(ns).Get(ctx, ownClaim, metav1.GetOptions{})
			if err != nil {
				return err
			}
			delete(pvc.Annotations, "volume.kubernetes.io/selected-node")
			_, err = asA.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Errorf("dropping the node selected for a claim of %s: %v", c.node, err)
		}
	})
	t.Run("accepted: a claim's status, as csi-resizer marks it", func(t *testing.T) {
		patch := `{"status":{"allocatedResources":{"storage":"1Gi"},"allocatedResourceStatuses":{"storage":"ControllerResizeInProgress"},` +
			`"conditions":[{"type":"Resizing","status":"True"}]}}`
		if _, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claimB, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Errorf("marking the status of a claim of %s: %v", b.node, err)
		}
	})
	t.Run("accepted: a modify marked and done on either node's claim, as csi-resizer marks it", func(t *testing.T) {
		// external-resizer v2.3.0's modify (modify_status.go): the target
		// and ModifyingVolume before ControllerModifyVolume, then the
		// current class with modifyVolumeStatus and the conditions gone.
		// Each claim names the class as its owner would (the admin here);
		// Pending, no resizer acts on it. The resizer's node marks any
		// node's claim: another node's agent applies the class.
		const class = "policy-modify"
		// The cluster's csi-resizer sees the claims name a class that
		// does not exist, and says so.
		expectWarning(t, "VolumeModifyFailed", "PersistentVolumeClaim/"+ns+"/"+prefix)
		mark := `{"status":{"modifyVolumeStatus":{"status":"InProgress","targetVolumeAttributesClassName":"` + class + `"},` +
			`"conditions":[{"type":"ModifyingVolume","status":"True"}]}}`
		done := `{"status":{"currentVolumeAttributesClassName":"` + class + `","modifyVolumeStatus":null,"conditions":null}}`
		// A claim not bound names its class only as it is made.
		own := adminClaimAnnotated(t, prefix+"claimmod", map[string]string{
			"volume.kubernetes.io/selected-node":       c.node,
			"volume.kubernetes.io/storage-provisioner": contract.DefaultDriverName,
		}, func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.VolumeAttributesClassName = ptr.To(class) })
		if err := updateClaim(ctx, c.client, claimB, func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.VolumeAttributesClassName = ptr.To(class)
		}); err != nil {
			t.Fatalf("naming the class %s in %s: %v", class, claimB, err)
		}
		for _, claim := range []string{claimB, own} {
			if _, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claim, types.MergePatchType, []byte(mark), metav1.PatchOptions{}, "status"); err != nil {
				t.Fatalf("marking %s's modify: %v", claim, err)
			}
		}
		for _, claim := range []string{claimB, own} {
			if _, err := asA.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claim, types.MergePatchType, []byte(done), metav1.PatchOptions{}, "status"); err != nil {
				t.Fatalf("marking %s's modify done: %v", claim, err)
			}
			got, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if cur := ptr.Deref(got.Status.CurrentVolumeAttributesClassName, ""); cur != class || got.Status.ModifyVolumeStatus != nil {
				t.Errorf("%s after the modify: current class %q, modify %+v; want %q and none", claim, cur, got.Status.ModifyVolumeStatus, class)
			}
		}
	})
	t.Run("accepted: the clone finalizer added to and taken off a converge claim selected for the second node, as csi-provisioner does", func(t *testing.T) {
		// external-provisioner's setCloneFinalizer, on the clone's node,
		// appends it with an update; its cloning-protection controller, on
		// any node, takes it off with an update.
		if err := updateClaim(ctx, asA, source, addFinalizer(cloneFinalizer)); err != nil {
			t.Fatalf("adding %s to %s: %v", cloneFinalizer, source, err)
		}
		if err := updateClaim(ctx, asA, source, func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Finalizers = slices.DeleteFunc(pvc.Finalizers, func(f string) bool { return f == cloneFinalizer })
		}); err != nil {
			t.Fatalf("taking %s off %s: %v", cloneFinalizer, source, err)
		}
		got, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, source, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(got.Finalizers, cloneFinalizer) {
			t.Errorf("%s's finalizers after the removal: %v", source, got.Finalizers)
		}
	})
	t.Run("accepted: the first node's own CSIStorageCapacity", func(t *testing.T) {
		obj, err := caps.Create(ctx, nodeCapacity(prefix+"capa", c.node), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating %s's CSIStorageCapacity: %v", c.node, err)
		}
		if err := caps.Delete(ctx, obj.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting %s's CSIStorageCapacity: %v", c.node, err)
		}
	})
}

// driverPodClient is a client that authenticates as node n's converge pod:
// with a token of the DaemonSet's service account bound to the pod, which
// the API server gives the pod's node name, as it gives the kubelet's.
func driverPodClient(t *testing.T, n *kubeNode) kubernetes.Interface {
	t.Helper()
	pod, err := n.driverPod(context.Background())
	if err != nil || pod == nil {
		t.Fatalf("%s's converge pod: %v, %v", n.node, pod, err)
	}
	client, u := podTokenClient(t, pod)
	if got := u.Extra[nodeNameExtra]; len(got) != 1 || got[0] != n.node {
		t.Fatalf("the pod's token's %s: got %v, want [%s]", nodeNameExtra, got, n.node)
	}
	return client
}

// tokenClient is a client of the API server that sends token.
func tokenClient(t *testing.T, token string) kubernetes.Interface {
	t.Helper()
	admin, err := clientcmd.BuildConfigFromFlags("", c.admin)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// createPV creates pv with pvs.
func createPV(ctx context.Context, pvs typedcorev1.PersistentVolumeInterface, pv *corev1.PersistentVolume, opts metav1.CreateOptions) error {
	_, err := pvs.Create(ctx, pv, opts)
	return err
}

// unboundDriverClient is a client with a token of converge-node's service
// account bound to no pod (a TokenRequest without a bound object): its
// user names no node, and the node policy refuses every write of it.
func unboundDriverClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	tok, err := c.client.CoreV1().ServiceAccounts(daemonSetNamespace).CreateToken(context.Background(), daemonSetName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of %s bound to no pod: %v", daemonSetName, err)
	}
	return tokenClient(t, tok.Status.Token)
}

// podTokenClient is a client with a token of pod's service account bound
// to pod (a TokenRequest, as the kubelet makes it), and the user the API
// server makes of the token, as a policy sees it; the user must be the
// pod's service account.
func podTokenClient(t *testing.T, pod *corev1.Pod) (kubernetes.Interface, authenticationv1.UserInfo) {
	t.Helper()
	ctx := context.Background()
	tok, err := c.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token bound to %s: %v", pod.Name, err)
	}
	client := tokenClient(t, tok.Status.Token)
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("who the pod's token is: %v", err)
	}
	u := review.Status.UserInfo
	if want := "system:serviceaccount:" + pod.Namespace + ":" + pod.Spec.ServiceAccountName; u.Username != want {
		t.Fatalf("the pod's token is %s, want %s", u.Username, want)
	}
	return client, u
}

// convergePV is a converge volume called name pinned to node, bound to no
// claim and retained, so that nothing in the cluster acts on it.
func convergePV(name, node string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "policy-test",
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: contract.DefaultDriverName, VolumeHandle: name + contract.NodeSep + node}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: contract.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node},
				}}}},
			}},
		},
	}
}

// adminPV creates pv as the admin, to be deleted when the test ends.
func adminPV(t *testing.T, pv *corev1.PersistentVolume) *corev1.PersistentVolume {
	t.Helper()
	got, err := c.client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating %s: %v", pv.Name, err)
	}
	t.Cleanup(func() { deleteAdmin(t, pv.Name) })
	return got
}

// withProvisionerFinalizer is pv with external-provisioner's finalizer, as
// the provisioner makes it, and left alone by the cluster's provisioners
// (provisionersLeave); the finalizer is taken off as the admin before pv
// is deleted when t ends, so that the volume goes.
func withProvisionerFinalizer(t *testing.T, pv *corev1.PersistentVolume) *corev1.PersistentVolume {
	t.Helper()
	pv.Finalizers = append(pv.Finalizers, provisionerFinalizer)
	provisionersLeave(pv)
	t.Cleanup(func() {
		_, err := c.client.CoreV1().PersistentVolumes().Patch(context.Background(), pv.Name, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("taking the finalizers off %s: %v", pv.Name, err)
		}
	})
	return pv
}

// deleteAdmin deletes the PV called name as the admin, if it is there.
func deleteAdmin(t *testing.T, name string) {
	err := c.client.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting %s: %v", name, err)
	}
}

// nodeCapacity is a CSIStorageCapacity of node, as external-provisioner
// publishes it, for a class no claim uses.
func nodeCapacity(name, node string) *storagev1.CSIStorageCapacity {
	return &storagev1.CSIStorageCapacity{
		ObjectMeta:       metav1.ObjectMeta{Name: name},
		NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{contract.TopologyKey: node}},
		StorageClassName: "policy-test",
		Capacity:         ptr.To(resource.MustParse("1Gi")),
	}
}

// adminClaim creates, as the admin, a claim called name of a class nothing
// provisions, selected for node and named for provisioner as
// kube-controller-manager names it, to be deleted when the test ends, and
// returns its name.
func adminClaim(t *testing.T, name, node, provisioner string) string {
	t.Helper()
	return adminClaimAnnotated(t, name, map[string]string{
		"volume.kubernetes.io/selected-node":       node,
		"volume.kubernetes.io/storage-provisioner": provisioner,
	})
}

// adminClaimAnnotated creates, as the admin, a claim called name of a
// class nothing provisions, with annotations, each of mutate applied, to
// be deleted when the test ends, and returns its name.
func adminClaimAnnotated(t *testing.T, name string, annotations map[string]string, mutate ...func(*corev1.PersistentVolumeClaim)) string {
	t.Helper()
	ctx := context.Background()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To("policy-test"),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	for _, m := range mutate {
		m(pvc)
	}
	_, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating claim %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := c.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting claim %s: %v", name, err)
		}
	})
	return name
}

// labelClaim updates the claim called name with a label, as client.
func labelClaim(ctx context.Context, client kubernetes.Interface, name string) error {
	return updateClaim(ctx, client, name, func(pvc *corev1.PersistentVolumeClaim) {
		if pvc.Labels == nil {
			pvc.Labels = map[string]string{}
		}
		pvc.Labels["converge.csi.dev/test"] = "policy"
	})
}

// cloneFinalizer is the finalizer with which external-provisioner holds a
// clone's source claim until no clone of it is Pending.
const cloneFinalizer = "provisioner.storage.kubernetes.io/cloning-protection"

// addFinalizer appends f to a claim's finalizers, as external-provisioner's
// setCloneFinalizer does.
func addFinalizer(f string) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) { pvc.Finalizers = append(pvc.Finalizers, f) }
}

// updateClaim updates the claim called name, changed by change, as client:
// an update, the verb external-provisioner's role has on claims and the one
// it uses, read again when kube-controller-manager changed the claim
// meanwhile (a conflict is found before admission).
func updateClaim(ctx context.Context, client kubernetes.Interface, name string, change func(*corev1.PersistentVolumeClaim)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(pvc)
		_, err = client.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
}

// provisionersLeave marks pv, a converge volume a test makes by hand, as
// provisioned by no provisioner of the cluster's
// (pv.kubernetes.io/provisioned-by), which the provisioners then leave
// alone (sig-storage-lib-external-provisioner v13, isProvisionerForVolume)
// while the admission policies, which read spec.csi.driver, still hold it
// for converge's: every node's csi-provisioner takes its finalizer off a
// Retain volume of converge's at once (handleProtectionFinalizer), which
// would race the test's own writes of that finalizer.
func provisionersLeave(pv *corev1.PersistentVolume) {
	if pv.Annotations == nil {
		pv.Annotations = map[string]string{}
	}
	pv.Annotations["pv.kubernetes.io/provisioned-by"] = "policy-test.converge.invalid"
}

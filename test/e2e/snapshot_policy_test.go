package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/converge-csi/converge/pkg/contract"
)

// nodeSnapshotsPolicy is deploy/components/node-volumes' policy on
// converge-node's writes of snapshot objects.
const nodeSnapshotsPolicy = "converge-node-snapshots"

// TestNodeWritesOnlyItsOwnSnapshots asks the API server, with the token of
// the first node's converge pod, for each forgery that the snapshots
// component's RBAC allows a node (update and patch of every snapshot
// content, group content, their status, and every VolumeSnapshot): a
// status handle naming another node's snapshot on a content of its own,
// a volumeSnapshotRef rewritten, its label moved, a finalizer added, a
// write of a content labelled for another node or of another driver, a
// group content's handle or a member's pair naming another node, and an
// owner, a label or another finalizer put on a VolumeSnapshot. Each is
// refused by the policy, not by RBAC; what csi-snapshotter and
// csi-provisioner write (the being-created mark, status handles of the
// node, the restore source's finalizer) is accepted.
func TestNodeWritesOnlyItsOwnSnapshots(t *testing.T) {
	ctx := context.Background()
	as := driverPodDynamic(t, c.kubeNode)
	prefix := fmt.Sprintf("nodesnap-%d-", time.Now().UnixNano()%100000)
	// csi-snapshotter takes the contents labelled for its node and finds
	// no such snapshot; converge-controller tells of the ghost node's.
	for _, reason := range []string{"SnapshotContentCheckandUpdateFailed", "GroupSnapshotContentCheckandUpdateFailed",
		"SnapshotNodeGone", "SnapshotNodeUnknown"} {
		expectWarning(t, reason, prefix)
	}
	labelled := func(o *unstructured.Unstructured, node string) *unstructured.Unstructured {
		o.SetLabels(map[string]string{managedBy: node})
		return o
	}
	own := adminObject(t, snapshotContents, labelled(contentObject(prefix+"own", contract.DefaultDriverName, "snapown_"+c.node), c.node))
	ghosts := adminObject(t, snapshotContents, labelled(contentObject(prefix+"ghost", contract.DefaultDriverName, "snapghost_"+ghostNode), ghostNode))
	other := adminObject(t, snapshotContents, labelled(contentObject(prefix+"other", "other.csi.example.com", "snapother_"+c.node), c.node))
	group := adminObject(t, groupSnapshotContents, labelled(groupContentObject(prefix+"group", "grp_"+c.node, "m_"+c.node), c.node))
	snapshot := adminNamespaced(t, volumeSnapshots, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": volumeSnapshots.GroupVersion().String(), "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": prefix + "snap", "namespace": ns},
		"spec":     map[string]any{"source": map[string]any{"volumeSnapshotContentName": prefix + "none"}},
	}})

	patch := func(gvr schema.GroupVersionResource, name string, body map[string]any, sub ...string) func() error {
		return func() error {
			b, err := json.Marshal(body)
			if err != nil {
				return err
			}
			_, err = as.Resource(gvr).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}, sub...)
			return err
		}
	}
	snaps := as.Resource(volumeSnapshots).Namespace(ns)
	updateSnapshot := func(change func(*unstructured.Unstructured)) func() error {
		return func() error {
			o, err := snaps.Get(ctx, snapshot, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(o)
			_, err = snaps.Update(ctx, o, metav1.UpdateOptions{})
			return err
		}
	}
	status := func(s map[string]any) map[string]any { return map[string]any{"status": s} }
	meta := func(m map[string]any) map[string]any { return map[string]any{"metadata": m} }
	member := func(volume, snap string) map[string]any {
		return status(map[string]any{"volumeGroupSnapshotHandle": "grp_" + c.node,
			"volumeSnapshotInfoList": []any{map[string]any{"volumeHandle": volume, "snapshotHandle": snap}}})
	}
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"its own content's status handle naming another node's snapshot", patch(snapshotContents, own,
			status(map[string]any{"snapshotHandle": "victim_" + ghostNode, "readyToUse": true}), "status")},
		{"its own content's volumeSnapshotRef rewritten", patch(snapshotContents, own,
			map[string]any{"spec": map[string]any{"volumeSnapshotRef": map[string]any{"name": "stolen"}}})},
		{"its own content's label moved to another node", patch(snapshotContents, own, meta(map[string]any{"labels": map[string]any{managedBy: ghostNode}}))},
		{"a finalizer on its own content", patch(snapshotContents, own, meta(map[string]any{"finalizers": []any{"converge.csi.dev/test"}}))},
		{"the status of a content labelled for another node", patch(snapshotContents, ghosts,
			status(map[string]any{"snapshotHandle": "x_" + c.node}), "status")},
		{"the status of another driver's content labelled for its node", patch(snapshotContents, other,
			status(map[string]any{"snapshotHandle": "x_" + c.node}), "status")},
		{"its own group content's handle naming another node", patch(groupSnapshotContents, group,
			status(map[string]any{"volumeGroupSnapshotHandle": "grp_" + ghostNode}), "status")},
		{"a member's snapshot handle naming another node", patch(groupSnapshotContents, group, member("v_"+c.node, "s_"+ghostNode), "status")},
		{"a member's volume handle naming another node", patch(groupSnapshotContents, group, member("v_"+ghostNode, "s_"+c.node), "status")},
		// RBAC gives a node update of VolumeSnapshots, not patch, as
		// external-provisioner writes them.
		{"an owner on a VolumeSnapshot, which the garbage collector would follow", updateSnapshot(func(o *unstructured.Unstructured) {
			o.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "00000000-0000-0000-0000-000000000068"}})
		})},
		{"a label on a VolumeSnapshot", updateSnapshot(func(o *unstructured.Unstructured) {
			o.SetLabels(map[string]string{"converge.csi.dev/test": "stolen"})
		})},
		{"another finalizer on a VolumeSnapshot", updateSnapshot(func(o *unstructured.Unstructured) {
			o.SetFinalizers(append(o.GetFinalizers(), "converge.csi.dev/test"))
		})},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			wantRefusedBy(t, tc.do(), nodeSnapshotsPolicy)
		})
	}

	accepted := func(name string, do func() error) {
		t.Run("accepted: "+name, func(t *testing.T) {
			if err := retry.RetryOnConflict(retry.DefaultRetry, do); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		})
	}
	beingCreated := "snapshot.storage.kubernetes.io/volumesnapshot-being-created"
	accepted("csi-snapshotter's being-created mark on its own content, and off", func() error {
		if err := patch(snapshotContents, own, meta(map[string]any{"annotations": map[string]any{beingCreated: "yes"}}))(); err != nil {
			return err
		}
		return patch(snapshotContents, own, meta(map[string]any{"annotations": map[string]any{beingCreated: nil}}))()
	})
	accepted("its own content's status handle naming its node", patch(snapshotContents, own,
		status(map[string]any{"snapshotHandle": "snapown_" + c.node}), "status"))
	accepted("its own group content's handles naming its node", patch(groupSnapshotContents, group, member("v_"+c.node, "s_"+c.node), "status"))
	sourceFinalizer := "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"
	accepted("csi-provisioner's finalizer on a restore's source, and off", func() error {
		for _, add := range []bool{true, false} {
			o, err := snaps.Get(ctx, snapshot, metav1.GetOptions{})
			if err != nil {
				return err
			}
			var fs []string
			for _, f := range o.GetFinalizers() {
				if f != sourceFinalizer {
					fs = append(fs, f)
				}
			}
			if add {
				fs = append(fs, sourceFinalizer)
			}
			o.SetFinalizers(fs)
			if _, err := snaps.Update(ctx, o, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
}

// driverPodDynamic is a dynamic client with the token of node n's converge
// pod, as driverPodClient.
func driverPodDynamic(t *testing.T, n *kubeNode) dynamic.Interface {
	t.Helper()
	pod, err := n.driverPod(context.Background())
	if err != nil || pod == nil {
		t.Fatalf("%s's converge pod: %v, %v", n.node, pod, err)
	}
	return tokenDynamic(t, pod)
}

// adminNamespaced creates o in its namespace as the admin, to be deleted
// (its finalizers taken off first) when the test ends, and returns its
// name.
func adminNamespaced(t *testing.T, gvr schema.GroupVersionResource, o *unstructured.Unstructured) string {
	t.Helper()
	ctx := context.Background()
	r := c.dynamic.Resource(gvr).Namespace(o.GetNamespace())
	if _, err := r.Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s %s: %v", gvr.Resource, o.GetName(), err)
	}
	t.Cleanup(func() {
		_, err := r.Patch(ctx, o.GetName(), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err == nil {
			err = r.Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s %s: %v", gvr.Resource, o.GetName(), err)
		}
	})
	return o.GetName()
}

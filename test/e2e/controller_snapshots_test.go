package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
)

// managedBy is the label by which a node-deployed csi-snapshotter selects
// what it takes; converge-controller's snapshot labeller sets it.
const managedBy = "snapshot.storage.kubernetes.io/managed-by"

var (
	volumeSnapshots       = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	snapshotContents      = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
	groupSnapshotContents = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotcontents"}
	groupSnapshotClasses  = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotclasses"}
)

// ghostNode is a node no cluster of the run has: contents whose handle
// names it are left unlabelled by converge-controller (it warns instead),
// so that a test may label them itself.
const ghostNode = "ctrlpol-ghost-node"

// TestControllerLabelsOnlySnapshotObjects asks the API server, with the
// token of a converge-controller pod, for what root on its node could do
// with the snapshot labeller's RBAC (list, watch and patch of snapshot
// contents, group contents and group classes, any driver's): the policy
// refuses a label on another driver's content, a label naming another
// node than the content's handle, a second label, a label changed, a spec
// changed, a class's parameters or annotations changed, a label on a
// content that names no snapshot handle (RBAC refuses a create or delete
// already); it accepts the label with the handle's node on a converge
// content, group content and group member content (its group's handle),
// and setting the label of a converge group class, but no change to the
// class itself.
func TestControllerLabelsOnlySnapshotObjects(t *testing.T) {
	ctx := context.Background()
	as := controllerPodDynamic(t)
	prefix := fmt.Sprintf("ctrlsnap-%d-", time.Now().UnixNano()%100000)
	// The labeller tells of the test's contents, whose node does not
	// exist or which name no handle.
	expectWarning(t, "SnapshotNodeGone", prefix)
	expectWarning(t, "SnapshotNodeUnknown", prefix)

	handle := "snapshot-1_" + ghostNode
	other := adminObject(t, snapshotContents, contentObject(prefix+"other", "other.csi.example.com", handle))
	conv := adminObject(t, snapshotContents, contentObject(prefix+"conv", contract.DefaultDriverName, handle))
	group := adminObject(t, groupSnapshotContents, groupContentObject(prefix+"group", "groupsnapshot-1_"+ghostNode, "g-0_"+ghostNode))
	// A content that names a volume alone, and one that snapshot-controller
	// would make for a group's member (its group's handle annotated).
	volumeOnly := adminObject(t, snapshotContents, volumeContentObject(prefix+"volume", "pvc-1_"+ghostNode, ""))
	member := adminObject(t, snapshotContents, volumeContentObject(prefix+"member", "pvc-2_"+ghostNode, "groupsnapshot-1_"+ghostNode))
	class := adminObject(t, groupSnapshotClasses, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": groupSnapshotClasses.GroupVersion().String(), "kind": "VolumeGroupSnapshotClass",
		"metadata": map[string]any{"name": prefix + "class"}, "driver": contract.DefaultDriverName, "deletionPolicy": "Delete"}})
	otherClass := adminObject(t, groupSnapshotClasses, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": groupSnapshotClasses.GroupVersion().String(), "kind": "VolumeGroupSnapshotClass",
		"metadata": map[string]any{"name": prefix + "otherclass"}, "driver": "other.csi.example.com", "deletionPolicy": "Delete"}})

	patch := func(gvr schema.GroupVersionResource, name string, body map[string]any) func() error {
		return func() error {
			b, err := json.Marshal(body)
			if err != nil {
				return err
			}
			_, err = as.Resource(gvr).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{})
			return err
		}
	}
	labels := func(kv ...string) map[string]any {
		l := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return map[string]any{"metadata": map[string]any{"labels": l}}
	}
	refused := func(name string, do func() error) {
		t.Run("refused: "+name, func(t *testing.T) {
			err := do()
			if err == nil {
				t.Fatalf("%s: accepted, want the policy %s to refuse it", name, controllerPolicy)
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+controllerPolicy+"'") {
				t.Fatalf("%s: got %v, want the policy %s's refusal", name, err, controllerPolicy)
			}
			t.Logf("refused: %v", err)
		})
	}
	accepted := func(name string, do func() error) {
		t.Run("accepted: "+name, func(t *testing.T) {
			if err := do(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		})
	}

	refused("the label on another driver's content", patch(snapshotContents, other, labels(managedBy, ghostNode)))
	refused("a label naming another node than the content's handle", patch(snapshotContents, conv, labels(managedBy, c.node)))
	refused("a second label beside it", patch(snapshotContents, conv, labels(managedBy, ghostNode, "converge.csi.dev/test", "stolen")))
	refused("a change of the content's spec beside it", patch(snapshotContents, conv, map[string]any{
		"metadata": map[string]any{"labels": map[string]any{managedBy: ghostNode}}, "spec": map[string]any{"deletionPolicy": "Delete"}}))
	refused("a finalizer beside it", patch(snapshotContents, conv, map[string]any{
		"metadata": map[string]any{"labels": map[string]any{managedBy: ghostNode}, "finalizers": []string{"converge.csi.dev/test"}}}))
	// RBAC grants neither; the policy would refuse them too.
	forbidden := func(name string, do func() error) {
		t.Run("forbidden: "+name, func(t *testing.T) {
			if err := do(); !apierrors.IsForbidden(err) {
				t.Fatalf("%s: got %v, want forbidden", name, err)
			}
		})
	}
	forbidden("a create of a content", func() error {
		_, err := as.Resource(snapshotContents).Create(ctx, contentObject(prefix+"made", contract.DefaultDriverName, handle), metav1.CreateOptions{})
		return err
	})
	forbidden("a delete of a content", func() error {
		return as.Resource(snapshotContents).Delete(ctx, conv, metav1.DeleteOptions{})
	})
	refused("a group content's label naming another node than its handle", patch(groupSnapshotContents, group, labels(managedBy, c.node)))
	refused("the label on another driver's class", patch(groupSnapshotClasses, otherClass, labels(managedBy, c.node)))
	refused("a change of a converge class's parameters beside its label", patch(groupSnapshotClasses, class, map[string]any{
		"metadata": map[string]any{"labels": map[string]any{managedBy: c.node}}, "parameters": map[string]any{"converge.csi.dev/pool": "stolen"}}))
	refused("an annotation on a converge class beside its label", patch(groupSnapshotClasses, class, map[string]any{
		"metadata": map[string]any{"labels": map[string]any{managedBy: c.node}, "annotations": map[string]any{"groupsnapshot.storage.kubernetes.io/is-default-class": "true"}}}))

	refused("a label on a content that names no snapshot handle", patch(snapshotContents, volumeOnly, labels(managedBy, ghostNode)))
	refused("a member content's label naming another node than its group's handle", patch(snapshotContents, member, labels(managedBy, c.node)))

	accepted("the handle's node on a converge content", patch(snapshotContents, conv, labels(managedBy, ghostNode)))
	accepted("the group handle's node on a group's member content", patch(snapshotContents, member, labels(managedBy, ghostNode)))
	refused("the label, once set, changed", patch(snapshotContents, conv, labels(managedBy, c.node)))
	accepted("the handle's node on a converge group content", patch(groupSnapshotContents, group, labels(managedBy, ghostNode)))
	accepted("a converge class's label set", patch(groupSnapshotClasses, class, labels(managedBy, c.node)))
	accepted("a converge class handed to another node", patch(groupSnapshotClasses, class, labels(managedBy, ghostNode)))
}

// TestSnapshotLabellerTellsWhatIsWrong makes, as the admin, two
// pre-provisioned contents, as a restore of a backup makes them: one whose
// handle names a node that does not exist, which converge-controller
// leaves unlabelled with a SnapshotNodeGone warning on the content and its
// VolumeSnapshot, and one whose handle names the run's node but no
// snapshot there, which converge-controller labels and the node's
// csi-snapshotter then reports in the content's status.
func TestSnapshotLabellerTellsWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	prefix := fmt.Sprintf("snaplab-%d-", time.Now().UnixNano()%100000)
	expectWarning(t, "SnapshotNodeGone", prefix+"gone")
	expectWarning(t, "SnapshotContentCheckandUpdateFailed", prefix+"absent")
	gone := adminObject(t, snapshotContents, contentObject(prefix+"gone", contract.DefaultDriverName, "snapshot-1_"+ghostNode))
	missing := "nosuchsnapshot_" + c.node
	absent := adminObject(t, snapshotContents, contentObject(prefix+"absent", contract.DefaultDriverName, missing))

	poll(t, 2*time.Minute, "a SnapshotNodeGone warning on the content and on its VolumeSnapshot", func() (bool, string) {
		onContent, onSnapshot := "", ""
		list, err := c.client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=SnapshotNodeGone"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range list.Items {
			switch {
			case e.InvolvedObject.Kind == "VolumeSnapshotContent" && e.InvolvedObject.Name == gone:
				onContent = e.Message
			case e.InvolvedObject.Kind == "VolumeSnapshot" && e.InvolvedObject.Namespace == ns && e.InvolvedObject.Name == gone:
				onSnapshot = e.Message
			}
		}
		want := fmt.Sprintf("Node %q, named by snapshot handle %q, does not exist", ghostNode, "snapshot-1_"+ghostNode)
		if e := onContent; e != "" && e == onSnapshot && strings.Contains(e, want) {
			return true, e
		}
		return false, fmt.Sprintf("content: %q, snapshot: %q", onContent, onSnapshot)
	})
	o, err := c.dynamic.Resource(snapshotContents).Get(ctx, gone, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := o.GetLabels()[managedBy]; ok {
		t.Errorf("the content naming a node that does not exist is labelled %s=%s, want no label", managedBy, v)
	}

	poll(t, 2*time.Minute, "the content naming a missing snapshot labelled, and its status saying the snapshot is not found", func() (bool, string) {
		o, err := c.dynamic.Resource(snapshotContents).Get(ctx, absent, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		msg, _, _ := unstructured.NestedString(o.Object, "status", "error", "message")
		label := o.GetLabels()[managedBy]
		return label == c.node && strings.Contains(msg, missing), fmt.Sprintf("label %q, status.error.message %q", label, msg)
	})
}

// contentObject is a pre-provisioned VolumeSnapshotContent called name of
// driver, naming the snapshot handle and a VolumeSnapshot of its own name
// in ns that is never made, retained, so that nothing deletes a snapshot
// when it goes.
func contentObject(name, driver, handle string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": snapshotContents.GroupVersion().String(), "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"driver": driver, "deletionPolicy": "Retain",
			"source":            map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"name": name, "namespace": ns},
		},
	}}
}

// volumeContentObject is a converge VolumeSnapshotContent called name
// that names volume, as contentObject, and nothing else but, when group is
// not "", the group handle a member of a group is annotated with.
func volumeContentObject(name, volume, group string) *unstructured.Unstructured {
	o := contentObject(name, contract.DefaultDriverName, "")
	o.Object["spec"].(map[string]any)["source"] = map[string]any{"volumeHandle": volume}
	if group != "" {
		o.SetAnnotations(map[string]string{"groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle": group})
	}
	return o
}

// groupContentObject is a pre-provisioned converge
// VolumeGroupSnapshotContent called name, as contentObject.
func groupContentObject(name, handle string, members ...string) *unstructured.Unstructured {
	m := make([]any, len(members))
	for i, s := range members {
		m[i] = s
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": groupSnapshotContents.GroupVersion().String(), "kind": "VolumeGroupSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"driver": contract.DefaultDriverName, "deletionPolicy": "Retain",
			"source":                 map[string]any{"groupSnapshotHandles": map[string]any{"volumeGroupSnapshotHandle": handle, "volumeSnapshotHandles": m}},
			"volumeGroupSnapshotRef": map[string]any{"name": name, "namespace": ns},
		},
	}}
}

// adminObject creates the cluster-scoped o as the admin, to be deleted
// (its finalizers taken off first) when the test ends, and returns its
// name.
func adminObject(t *testing.T, gvr schema.GroupVersionResource, o *unstructured.Unstructured) string {
	t.Helper()
	ctx := context.Background()
	if _, err := c.dynamic.Resource(gvr).Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s %s: %v", gvr.Resource, o.GetName(), err)
	}
	t.Cleanup(func() {
		_, err := c.dynamic.Resource(gvr).Patch(ctx, o.GetName(), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err == nil {
			err = c.dynamic.Resource(gvr).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s %s: %v", gvr.Resource, o.GetName(), err)
		}
	})
	return o.GetName()
}

// controllerPodDynamic is a dynamic client with the token of a
// converge-controller pod: a TokenRequest bound to the pod, as the kubelet
// makes it.
func controllerPodDynamic(t *testing.T) dynamic.Interface {
	t.Helper()
	running := controllerPods(t)
	if len(running) == 0 {
		t.Fatal("no converge-controller pod")
	}
	return tokenDynamic(t, &running[0])
}

// tokenDynamic is a dynamic client with a token of pod's service account
// bound to pod (a TokenRequest, as the kubelet makes it).
func tokenDynamic(t *testing.T, pod *corev1.Pod) dynamic.Interface {
	t.Helper()
	tok, err := c.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(context.Background(), pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token bound to %s: %v", pod.Name, err)
	}
	admin, err := clientcmd.BuildConfigFromFlags("", c.admin)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = tok.Status.Token
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

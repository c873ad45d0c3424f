package e2e

import (
	"context"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/converge-csi/converge/test/e2e/privilege"
)

// TestPrivileges asks the API server, as each of converge's service
// accounts, every question of privilege.Table (SECURITY.md's table of
// privileges) through a SubjectAccessReview, against the RBAC the run
// installed from deploy/ with its snapshots component: each answer must be
// the documented one. The user is the one a pod's token authenticates as:
// system:serviceaccount:<namespace>:<name>, in the service accounts'
// groups.
func TestPrivileges(t *testing.T) {
	ctx := context.Background()
	for _, q := range privilege.Table {
		ns := q.Namespace
		switch ns {
		case privilege.Install:
			ns = daemonSetNamespace
		case privilege.Any:
			ns = ""
		}
		group, resource, sub := q.Parts()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + daemonSetNamespace + ":" + q.Account,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + daemonSetNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: q.Verb, Group: group, Resource: resource, Subresource: sub, Name: q.Name,
			},
		}}
		got, err := c.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != q.Allowed {
			t.Errorf("%s %s %s in %q named %q: got allowed %v (%s), want %v: %s",
				q.Account, q.Verb, q.Resource, ns, q.Name, got.Status.Allowed, got.Status.Reason, q.Allowed, q.Why)
		}
	}
}

// TestNodeAgentTokenOnlyReads takes a token bound to the first node's
// node agent pod, as the kubelet gives it the pod, and uses it: it is the
// agent's own account (converge-node-agent), not the node pod's; it lists
// the cluster's PersistentVolumes, as the agent's informer does; and the
// API server refuses it (Forbidden, before it looks for the object: the
// names are of no object) a patch of a PersistentVolume, which the node
// pod's token may make, the creation of one, and a patch of a claim's
// status. Each write is a dry run, so that nothing changes should one
// pass.
func TestNodeAgentTokenOnlyReads(t *testing.T) {
	ctx := context.Background()
	var pod *corev1.Pod
	poll(t, 2*time.Minute, "a running "+nodeAgentName+" pod on "+c.node, func() (bool, string) {
		pods, err := c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: nodeAgentLabel, FieldSelector: "spec.nodeName=" + c.node})
		if err != nil {
			return false, err.Error()
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p
				return true, ""
			}
		}
		return false, "none running"
	})
	if pod.Spec.ServiceAccountName != privilege.NodeAgent {
		t.Fatalf("pod %s runs as service account %q, want %s", pod.Name, pod.Spec.ServiceAccountName, privilege.NodeAgent)
	}
	client, _ := podTokenClient(t, pod)
	if _, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("listing PersistentVolumes with the agent's token: %v, want allowed", err)
	}
	dry := []string{metav1.DryRunAll}
	for _, tc := range []struct {
		what string
		call func() error
	}{
		{"patch a PersistentVolume", func() error {
			_, err := client.CoreV1().PersistentVolumes().Patch(ctx, "converge-agent-no-such-pv", types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"converge-agent-test":"x"}}}`), metav1.PatchOptions{DryRun: dry})
			return err
		}},
		{"create a PersistentVolume", func() error {
			_, err := client.CoreV1().PersistentVolumes().Create(ctx, convergePV("converge-agent-no-such-pv", c.node), metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"patch a claim's status", func() error {
			_, err := client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "converge-agent-no-such-claim", types.MergePatchType,
				[]byte(`{"status":{"currentVolumeAttributesClassName":"x"}}`), metav1.PatchOptions{DryRun: dry}, "status")
			return err
		}},
	} {
		if err := tc.call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s with the agent's token: got %v, want Forbidden", tc.what, err)
		}
	}
}

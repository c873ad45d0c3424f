package e2e

import (
	"context"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

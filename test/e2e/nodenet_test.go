package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestPodReachesTheAPIServer runs kubectl in-cluster in a pod of the pod
// network, as deploy/'s sidecars run: it finds the API server through the
// kubernetes Service's address that the kubelet gives it, trusts it by the
// cluster's CA and authenticates with its service account's token, and
// RBAC holds it to its role: it may list the pods of its namespace and not
// the nodes.
func TestPodReachesTheAPIServer(t *testing.T) {
	ctx := context.Background()
	const name = "api-client"
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.client.RbacV1().RoleBindings(ns).Delete(ctx, name, metav1.DeleteOptions{})
		c.client.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{})
		c.client.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
	script := `echo host=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
kubectl auth whoami -o jsonpath='user={.status.userInfo.username}{"\n"}' || echo whoami failed
kubectl get pods -o name >/dev/null && echo pods=allowed
kubectl get nodes 2>&1 | grep -q Forbidden && echo nodes=forbidden
true`
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName:            name,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{Name: "c", Image: kubectlImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script}}},
		},
	}
	if _, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePod(t, name) })
	poll(t, 2*time.Minute, "pod "+name+" done", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, string(p.Status.Phase) + podEvents(name)
	})
	out := logsOf(name, "c")
	t.Logf("in-cluster kubectl:\n%s", out)
	for _, want := range []string{"host=" + kubernetesServiceIP + ":443", "user=system:serviceaccount:" + ns + ":" + name, "pods=allowed", "nodes=forbidden"} {
		if !strings.Contains(out, want) {
			t.Errorf("in-cluster kubectl: want %q in its output", want)
		}
	}
}

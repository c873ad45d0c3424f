package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A drain of a one-node cluster (every node cordoned, so that nothing
// evicted can start again) against converge-controller's
// PodDisruptionBudget, through the Eviction API as kubectl drain uses it:
// with deploy/'s two replicas the first is evicted and the second refused
// while the first's replacement cannot start; with one replica, as
// docs/operations.md says to run on one node, the lone replica is evicted
// and the drain proceeds (minAvailable 1 would refuse it for ever).
func TestControllerDrainOneNode(t *testing.T) {
	ctx := context.Background()
	// The evicted replicas' replacements cannot be scheduled while every
	// node is cordoned: the scheduler says so, as it should.
	expectWarning(t, "FailedScheduling", "Pod/"+daemonSetNamespace+"/"+controllerName+"-")
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if _, err := c.kubectl(ctx, "uncordon", n.node); err != nil {
				t.Errorf("uncordon %s: %v", n.node, err)
			}
		}
		for _, args := range [][]string{{"scale", "deployment/" + controllerName, "--replicas=2"},
			{"rollout", "status", "deployment/" + controllerName, "--timeout=3m"}} {
			if out, err := c.kubectl(ctx, append([]string{"-n", daemonSetNamespace}, args...)...); err != nil {
				t.Errorf("kubectl %v: %v\n%s", args, err, out)
			}
		}
	})
	budget := waitBudget(t, "both replicas healthy", func(s policyv1.PodDisruptionBudgetStatus) bool {
		return s.ExpectedPods == 2 && s.CurrentHealthy == 2 && s.DisruptionsAllowed == 1
	})
	t.Logf("the budget with two replicas: %+v", budget)
	pods := controllerPods(t)
	if len(pods) != 2 {
		t.Fatalf("%d converge-controller pods, want deploy/'s two", len(pods))
	}
	for _, n := range c.nodes {
		if _, err := c.kubectl(ctx, "cordon", n.node); err != nil {
			t.Fatal(err)
		}
	}

	if err := evict(pods[0]); err != nil {
		t.Fatalf("evicting the first replica %s: %v", pods[0].Name, err)
	}
	waitBudget(t, "the first replica's replacement not started", func(s policyv1.PodDisruptionBudgetStatus) bool {
		return s.CurrentHealthy == 1 && s.DisruptionsAllowed == 0
	})
	if err := evict(pods[1]); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evicting the second replica %s while the first's replacement cannot start: got %v, want the budget's refusal", pods[1].Name, err)
	}

	if out, err := c.kubectl(ctx, "-n", daemonSetNamespace, "scale", "deployment/"+controllerName, "--replicas=1"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	budget = waitBudget(t, "one replica expected", func(s policyv1.PodDisruptionBudgetStatus) bool {
		return s.ExpectedPods == 1 && s.DisruptionsAllowed == 1
	})
	t.Logf("the budget with one replica: %+v", budget)
	if err := evict(pods[1]); err != nil {
		t.Fatalf("evicting the lone replica %s: got %v, want the drain to proceed", pods[1].Name, err)
	}
}

// controllerPods are converge-controller's pods that are not being
// deleted.
func controllerPods(t *testing.T) []corev1.Pod {
	t.Helper()
	list, err := c.client.CoreV1().Pods(daemonSetNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerName})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// evict asks the API server to evict pod, as kubectl drain does.
func evict(pod corev1.Pod) error {
	return c.client.CoreV1().Pods(pod.Namespace).EvictV1(context.Background(), &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}})
}

// waitBudget waits for converge-controller's PodDisruptionBudget's status
// to be ok, and returns it.
func waitBudget(t *testing.T, what string, ok func(policyv1.PodDisruptionBudgetStatus) bool) policyv1.PodDisruptionBudgetStatus {
	t.Helper()
	var status policyv1.PodDisruptionBudgetStatus
	poll(t, 2*time.Minute, "the budget: "+what, func() (bool, string) {
		pdb, err := c.client.PolicyV1().PodDisruptionBudgets(daemonSetNamespace).Get(context.Background(), controllerName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		status = pdb.Status
		return pdb.Status.ObservedGeneration == pdb.Generation && ok(pdb.Status), fmt.Sprintf("%+v", pdb.Status)
	})
	return status
}

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/converge-csi/converge/test/e2e/invariants"
)

// TestHung stops csi-node and converge-controller at the same time, each
// as a hung process is (SIGSTOP): each is restarted by its own liveness
// probe, in its own pod, and neither test needs the other's component
// (about a minute each, most of it the probes' threshold). The subtests
// have the tests' names (-run 'TestHung/TestDriverHungRestarted').
func TestHung(t *testing.T) {
	t.Run("TestDriverHungRestarted", func(t *testing.T) {
		t.Parallel()
		testDriverHungRestarted(t)
	})
	t.Run("TestControllerHungRestarted", func(t *testing.T) {
		t.Parallel()
		testControllerHungRestarted(t)
	})
}

// A hung driver is restarted by its liveness probe, as deploy/ installs
// it: csi-node is stopped (SIGSTOP, as a deadlock or a stuck mount would
// leave it) while a pod writes to a published volume. The kubelet's
// liveness probe (csi-node's /livez: Identity.Probe on its own socket)
// fails; the
// kubelet restarts the container within the probe's budget; the
// application goes on writing with its mounts in place; the new csi-node
// reconstructs, and a new claim mounts.
func testDriverHungRestarted(t *testing.T) {
	ctx := context.Background()
	pod, v := writerPod(t, "hung")
	mounts := v.mounts(t, pod)
	driver, err := c.driverPod(ctx)
	if err != nil || driver == nil {
		t.Fatalf("the converge pod: %v", err)
	}
	before := restartsOf(driver, "csi-node")
	written := counted(t, pod.Name)
	intendDriverRestart(driver)
	expectHung(t, driver, "csi-node")
	stopped := time.Now()
	if pid := stopProcessOf(t, driver, programNamed("csi-node"), pod.Name); pid == 0 {
		t.Fatal("no csi-node process found in the converge pod")
	}
	// deploy/'s budget: 5 failed probes 10 s apart, then the probe's
	// termination grace (1 s).
	waitContainerRestarted(t, driver, "csi-node", before, 3*time.Minute)
	t.Logf("csi-node restarted %.0f s after it was stopped", time.Since(stopped).Seconds())
	if ev := podEventsOf(t, driver); !strings.Contains(ev, "failed liveness probe") {
		t.Errorf("no event says the liveness probe restarted csi-node:\n%s", ev)
	}
	if err := c.kubeNode.waitRestarted(ctx, "csi-node", before); err != nil {
		t.Fatal(err)
	}
	afterReplacement(t, pod, v, written, mounts, "after-hung")
}

// converge-controller stopped (SIGSTOP) is restarted by its liveness
// probe, and a replica leads again.
func testControllerHungRestarted(t *testing.T) {
	ctx := context.Background()
	pods, err := c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerName})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("converge-controller's pods: %v, %v", pods, err)
	}
	var ctrl *corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Status.Phase == corev1.PodRunning && podReady(p) {
			ctrl = p
			break
		}
	}
	if ctrl == nil {
		t.Fatalf("no converge-controller pod is Ready")
	}
	before := restartsOf(ctrl, controllerName)
	intendRestart(ctrl, controllerName)
	expectHung(t, ctrl, controllerName)
	if pid := stopProcessOf(t, ctrl, programNamed(controllerName), ""); pid == 0 {
		t.Fatal("no converge-controller process found in its pod")
	}
	// Its budget: 3 failed probes 10 s apart, then the termination grace.
	waitContainerRestarted(t, ctrl, controllerName, before, 3*time.Minute)
	poll(t, 2*time.Minute, "converge-controller's pod Ready again", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ctrl.Namespace).Get(ctx, ctrl.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return podReady(p), containerStates(p)
	})
}

// restartsOf is the restart count of the named container of pod.
func restartsOf(pod *corev1.Pod, container string) int32 {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			return s.RestartCount
		}
	}
	return 0
}

// waitContainerRestarted waits for the named container of pod (the same
// pod, by UID) to have restarted more than before times.
func waitContainerRestarted(t *testing.T, pod *corev1.Pod, container string, before int32, timeout time.Duration) {
	t.Helper()
	poll(t, timeout, fmt.Sprintf("%s of %s restarted", container, pod.Name), func() (bool, string) {
		p, err := c.client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.UID != pod.UID {
			t.Fatalf("pod %s was replaced, not its container restarted", pod.Name)
		}
		return restartsOf(p, container) > before, containerStates(p)
	})
}

// podEventsOf lists the events of one of converge's pods.
func podEventsOf(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	evs, err := c.client.CoreV1().Events(pod.Namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.uid=" + string(pod.UID)})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "%s %s: %s\n", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// expectHung records the liveness failures that the named container of pod,
// stopped by the test, causes until the kubelet kills it
// (invariants.HungLiveness).
func expectHung(t *testing.T, pod *corev1.Pod, container string) {
	t.Helper()
	for _, c := range pod.Spec.Containers {
		if c.Name == container && c.LivenessProbe != nil {
			expect(invariants.HungLiveness("Pod/"+pod.Namespace+"/"+pod.Name, c.LivenessProbe.FailureThreshold, t.Name()))
			return
		}
	}
	t.Fatalf("container %s of pod %s has no liveness probe", container, pod.Name)
}

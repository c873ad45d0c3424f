package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// releaseTime is the time a NodeLossPending event of a deleted node gives
// for the end of its grace.
var releaseTime = regexp.MustCompile(`was deleted; unless it registers again by (\S+), `)

// TestTwoNodesNodeDeletedByMistake deletes the second node's Node while its
// kubelet runs, as a mistaken kubectl delete node does, with a
// StatefulSet's pod on it in a class that retains (the default) and in one
// that releases. The kubelet does not register its Node again by itself;
// the pod GC deletes the node's pods, and those the StatefulSets make again
// wait, Pending, for the node. converge-controller warns at once, once, on
// each claim and PV, what it will do when deploy/'s --deleted-node-grace
// ends and that restarting the kubelet brings the node back, and releases
// nothing meanwhile. The kubelet restarted, the node registers again and
// both pods run there again with their volumes and data, before the time
// the warning gave.
func TestTwoNodesNodeDeletedByMistake(t *testing.T) {
	b := secondNode(t)
	ctx := context.Background()
	keep := storageClass(t, "converge-retain", nil)
	drop := storageClass(t, "converge-release", map[string]string{"converge.csi.dev/on-node-loss": "release"})
	for _, class := range []string{keep, drop} {
		waitCapacities(t, class, b, func(a, bb *resource.Quantity) bool { return !a.IsZero() && !bb.IsZero() })
	}
	// The controller that warns must outlive the node: on the node, the
	// pod GC would delete it, and a new leader counts the grace anew.
	ctrls, err := c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerName})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ctrls.Items {
		if p.Spec.NodeName == b.node {
			t.Fatalf("converge-controller's pod %s runs on %s, the node this test deletes", p.Name, b.node)
		}
	}

	sets := map[string]string{"mistaken-kept": keep, "mistaken-released": drop}
	type was struct {
		pod, claim types.UID
		volume     volume
	}
	before := map[string]was{}
	for name, class := range sets {
		statefulSet(t, name, class, b.node)
	}
	for name := range sets {
		pod := waitRunning(t, name+"-0")
		if pod.Spec.NodeName != b.node {
			t.Fatalf("pod %s runs on %s, want %s", pod.Name, pod.Spec.NodeName, b.node)
		}
		mustExec(t, pod.Name, "echo "+name+" > "+dataDir+"/f && sync")
		v := boundVolume(t, "data-"+name+"-0")
		claim, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-"+name+"-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before[name] = was{pod: pod.UID, claim: claim.UID, volume: v}
		expectWarning(t, "NodeLossPending", "PersistentVolumeClaim/"+ns+"/"+claim.Name)
		expectWarning(t, "NodeLossPending", "PersistentVolume//"+v.pv)
	}
	driver, err := b.driverPod(ctx)
	if err != nil || driver == nil {
		t.Fatalf("the converge pod of %s: %v", b.node, err)
	}

	// The mistake.
	if out, err := c.kubectl(ctx, "delete", "node", b.node); err != nil {
		t.Fatalf("kubectl delete node %s: %v: %s", b.node, err, out)
	}
	t.Logf("node %s deleted; its kubelet runs on", b.node)
	returned := false
	comeBack := func() {
		returned = true
		if err := b.restartKubelet(ctx); err != nil {
			t.Fatalf("restarting %s's kubelet: %v", b.node, err)
		}
		if err := b.waitDriver(ctx); err != nil {
			t.Fatalf("node %s back: %v", b.node, err)
		}
	}
	t.Cleanup(func() {
		if !returned {
			comeBack()
		}
	})

	// At once, on each claim and volume, what comes, when, and what to do.
	var releaseAt time.Time
	for name, w := range before {
		claim := "data-" + name + "-0"
		what := "converge keeps claim " + ns + "/" + claim + " and the data on the node"
		if name == "mistaken-released" {
			what = "converge deletes claim " + ns + "/" + claim + " and its pods, and its StatefulSet makes them again on another node"
		}
		for _, obj := range []string{claim, w.volume.pv} {
			var evs []corev1.Event
			poll(t, time.Minute, "a NodeLossPending event on "+obj, func() (bool, string) {
				evs = eventList(obj, "NodeLossPending")
				got, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
				return len(evs) > 0, fmt.Sprintf("none; claim %s: %s", claim, describeClaim(got, err))
			})
			msg := evs[0].Message
			t.Logf("%s: NodeLossPending: %s", obj, msg)
			for _, want := range []string{"node " + b.node + " was deleted; unless it registers again by ", what,
				"If the machine is alive, restart its kubelet: a kubelet registers its Node only when it starts"} {
				if !strings.Contains(msg, want) {
					t.Errorf("the NodeLossPending event on %s does not say %q: %s", obj, want, msg)
				}
			}
			m := releaseTime.FindStringSubmatch(msg)
			if m == nil {
				t.Fatalf("the NodeLossPending event on %s gives no time: %s", obj, msg)
			}
			if releaseAt, err = time.Parse(time.RFC3339, m[1]); err != nil {
				t.Fatalf("the NodeLossPending event on %s: %v", obj, err)
			}
		}
	}

	// The pod GC deletes the node's pods, converge's among them; those the
	// StatefulSets make again wait, Pending, for the node.
	poll(t, 3*time.Minute, "the pod GC deleting the pods of the deleted node", func() (bool, string) {
		var left []string
		for name, w := range before {
			if p, err := c.client.CoreV1().Pods(ns).Get(ctx, name+"-0", metav1.GetOptions{}); err == nil && p.UID == w.pod {
				left = append(left, p.Name)
			}
		}
		if p, err := c.client.CoreV1().Pods(daemonSetNamespace).Get(ctx, driver.Name, metav1.GetOptions{}); err == nil && p.UID == driver.UID {
			left = append(left, p.Name)
		}
		return len(left) == 0, "left: " + strings.Join(left, ", ")
	})
	for name := range before {
		poll(t, 2*time.Minute, "pod "+name+"-0 made again, Pending for the deleted node", func() (bool, string) {
			events := podEvents(name + "-0")
			return strings.Contains(events, "didn't match PersistentVolume's node affinity"), events
		})
	}
	// The kubelet did not register the Node again, and converge released
	// nothing: each claim the same, bound to the same volume, and no
	// warning but the pending one.
	if _, err := c.client.CoreV1().Nodes().Get(ctx, b.node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node %s without a kubelet restart: %v, want it still deleted", b.node, err)
	}
	unreleased := func(when string) {
		t.Helper()
		for name, w := range before {
			claim := "data-" + name + "-0"
			got, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
			if err != nil || got.UID != w.claim || got.Spec.VolumeName != w.volume.pv || got.Status.Phase != corev1.ClaimBound {
				t.Errorf("%s: claim %s: %v; want claim %s, Bound to %s", when, claim, describeClaim(got, err), w.claim, w.volume.pv)
			}
			for _, obj := range []string{claim, w.volume.pv} {
				for _, reason := range []string{"NodeLost", "ReleaseRefused", "ClaimReleased", "VolumeReleased"} {
					if evs := eventList(obj, reason); len(evs) > 0 {
						t.Errorf("%s: a %s event on %s: %s", when, reason, obj, evs[0].Message)
					}
				}
				if evs := eventList(obj, "NodeLossPending"); len(evs) != 1 || evs[0].Count > 1 {
					t.Errorf("%s: NodeLossPending on %s given %s, want once", when, obj, describeCounts(evs))
				}
			}
		}
	}
	unreleased("within the grace, the node's pods gone")

	comeBack()
	backAt := time.Now()
	for name, w := range before {
		pod := waitRunning(t, name+"-0")
		if pod.Spec.NodeName != b.node || pod.UID == w.pod {
			t.Errorf("pod %s back: on %s (UID %s), want a new pod on %s", pod.Name, pod.Spec.NodeName, pod.UID, b.node)
		}
		if out := mustExec(t, pod.Name, "cat "+dataDir+"/f"); strings.TrimSpace(out) != name {
			t.Errorf("pod %s back: the data %q, want %q", pod.Name, out, name)
		}
	}
	unreleased("the node back")
	if !releaseAt.After(backAt) {
		t.Errorf("the node came back at %s, after the time the warning gave (%s)", backAt.UTC().Format(time.RFC3339), releaseAt.Format(time.RFC3339))
	}
}

// eventList lists the events of reason on the object called name.
func eventList(name, reason string) []corev1.Event {
	evs, err := c.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
	if err != nil {
		return nil
	}
	return evs.Items
}

// describeClaim describes a claim, or the error of getting it.
func describeClaim(pvc *corev1.PersistentVolumeClaim, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("UID %s, %s to %q", pvc.UID, pvc.Status.Phase, pvc.Spec.VolumeName)
}

// describeCounts describes how many times each event was given.
func describeCounts(evs []corev1.Event) string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("x%d", max(e.Count, 1)))
	}
	return fmt.Sprintf("%d events %v", len(evs), out)
}

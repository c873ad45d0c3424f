package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/e2e/invariants"
	"github.com/converge-csi/converge/test/e2e/runs"
)

// What must hold of the whole run, whatever its tests did (package
// invariants has the checks): TestMain records restarts from the start and
// checks everything once the tests have run, with the cluster still up.

// convergePods are the name prefixes of converge's own pods, as deploy/ and
// the chart name them. (The node agent's, converge-node-agent-, start with
// converge-node- too: named all the same, as a rename of either must not
// drop it.)
var convergePods = []string{daemonSetName + "-", nodeAgentName + "-", controllerName + "-"}

// convergeSources are parts of the names converge's components report
// events under: converge-controller, and the sidecars, which name the
// driver (the provisioner "converge.csi.dev_<node>_...", the resizer and
// the snapshotter "... converge.csi.dev").
var convergeSources = []string{controllerName, contract.DefaultDriverName}

// intent is what the tests did on purpose: the restarts they caused and the
// warnings they expect.
var intent struct {
	mu sync.Mutex
	// restarts and warnings are guarded by mu.
	restarts map[invariants.Container]int32
	warnings []invariants.Expected
}

// intendRestart records that the test restarts the named container of pod
// once more.
func intendRestart(pod *corev1.Pod, container string) {
	intent.mu.Lock()
	defer intent.mu.Unlock()
	if intent.restarts == nil {
		intent.restarts = map[invariants.Container]int32{}
	}
	intent.restarts[invariants.Container{Pod: pod.Name, UID: string(pod.UID), Name: container}]++
}

// intendDriverRestart records that the test ends csi-node in pod once
// more, and so its sidecars' connection to it: the kubernetes-csi sidecars
// exit when they lose the CSI connection (csi-lib-utils' connection
// loss handler), and the kubelet restarts each once.
func intendDriverRestart(pod *corev1.Pod) {
	for _, s := range pod.Spec.Containers {
		intendRestart(pod, s.Name)
	}
}

// expectWarning records that the test causes Warning events of reason on
// an object whose kind/namespace/name contains object.
func expectWarning(t interface{ Name() string }, reason, object string) {
	expect(invariants.Expected{Reason: reason, Object: object, Test: t.Name()})
}

// expect records a warning a test causes, as x describes it.
func expect(x invariants.Expected) {
	intent.mu.Lock()
	defer intent.mu.Unlock()
	intent.warnings = append(intent.warnings, x)
}

// restartWatch records the highest restart count seen of each container of
// converge's pods, in every namespace, deleted pods included.
type restartWatch struct {
	mu sync.Mutex
	// seen is guarded by mu.
	seen map[invariants.Container]int32
	stop context.CancelFunc
}

// watchRestarts starts recording the restarts of converge's containers.
func (c *cluster) watchRestarts() *restartWatch {
	w := &restartWatch{seen: map[invariants.Container]int32{}}
	ctx, stop := context.WithCancel(context.Background())
	w.stop = stop
	f := informers.NewSharedInformerFactory(c.client, 0)
	record := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !hasPrefix(pod.Name, convergePods) {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, s := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
			k := invariants.Container{Pod: pod.Name, UID: string(pod.UID), Name: s.Name}
			w.seen[k] = max(w.seen[k], s.RestartCount)
		}
	}
	f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			record(obj)
		},
	})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return w
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// volumeImage says whether file is a volume's or a snapshot's image in a
// node's pool, rather than the harness's own (the filesystems it makes for
// the second node's data directory and for pool fast).
func (c *cluster) volumeImage(file string) bool {
	for _, n := range c.nodes {
		for _, d := range []string{n.dataDir, n.poolsDir} {
			if strings.HasPrefix(file, d+"/") {
				return true
			}
		}
	}
	return false
}

// checkInvariants checks, once every test has run: no probe of converge's
// pods errored on any node; no container of theirs restarted that a test
// did not restart on purpose; no Warning event of converge's that no test
// expected; no volume mount or loop device left. It returns what broke.
func (c *cluster) checkInvariants(w *restartWatch) []string {
	var out []string
	for _, n := range c.nodes {
		log, err := os.ReadFile(filepath.Join(n.logs, "kubelet.log"))
		if err != nil {
			out = append(out, fmt.Sprintf("node %s: reading the kubelet's log: %v", n.node, err))
		}
		for _, l := range invariants.ProbeErrors(string(log), convergePods) {
			out = append(out, fmt.Sprintf("node %s: a probe errored: %s", n.node, l))
		}
	}

	// The last look at pods that still exist.
	pods, err := c.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		out = append(out, "listing pods: "+err.Error())
	}
	w.stop()
	w.mu.Lock()
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !hasPrefix(pod.Name, convergePods) {
			continue
		}
		for _, s := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
			k := invariants.Container{Pod: pod.Name, UID: string(pod.UID), Name: s.Name}
			w.seen[k] = max(w.seen[k], s.RestartCount)
		}
	}
	intent.mu.Lock()
	out = append(out, invariants.UnexpectedRestarts(w.seen, intent.restarts)...)
	w.mu.Unlock()
	expected := append(slices.Clone(invariants.Environment), intent.warnings...)
	intent.mu.Unlock()

	events, err := c.client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		out = append(out, "listing events: "+err.Error())
	} else {
		var flat []invariants.Event
		for _, e := range events.Items {
			src := e.Source.Component
			if src == "" {
				src = e.ReportingController
			}
			o := e.InvolvedObject
			first, last := eventTimes(e)
			flat = append(flat, invariants.Event{Type: e.Type, Reason: e.Reason, Source: src, Message: e.Message, Count: e.Count,
				Object: o.Kind + "/" + o.Namespace + "/" + o.Name, First: first, Last: last})
		}
		for _, s := range invariants.UnexpectedWarnings(flat, convergeSources, convergePods, expected) {
			out = append(out, "an unexpected warning: "+s)
			for _, e := range flat {
				if e.String() == s {
					out = append(out, c.kubeletSays(e)...)
					break
				}
			}
		}
	}

	// Volumes of pods deleted at a test's end are unmounted shortly after.
	return append(out, c.volumesLeft(2*time.Minute)...)
}

// kubeletSays is what each node's kubelet logged of the pod an event is
// about, from a minute before it was first reported to a few seconds after
// it last was: why a warning no test explains came (a probe's failure, and
// what the kubelet did with the pod's containers around it).
func (c *cluster) kubeletSays(e invariants.Event) []string {
	kind, pod, _ := strings.Cut(e.Object, "/")
	if kind != "Pod" || e.First.IsZero() {
		return nil
	}
	var out []string
	for _, n := range c.nodes {
		log, err := os.ReadFile(filepath.Join(n.logs, "kubelet.log"))
		if err != nil {
			continue
		}
		lines := invariants.KubeletLines(string(log), pod, e.First.Add(-time.Minute), e.Last.Add(5*time.Second), time.Local)
		if len(lines) > 40 {
			lines = slices.Concat(lines[:20], []string{fmt.Sprintf("... %d lines left out ...", len(lines)-40)}, lines[len(lines)-20:])
		}
		for _, l := range lines {
			out = append(out, fmt.Sprintf("  node %s's kubelet: %s", n.node, l))
		}
	}
	return out
}

// volumesLeft waits up to wait for no node to hold a volume's mount and
// no loop device a volume's or a snapshot's image, and returns what is
// left then.
func (c *cluster) volumesLeft(wait time.Duration) []string {
	var left []string
	waitFor(context.Background(), wait, nil, func() error {
		left = nil
		for _, n := range c.nodes {
			mounts, err := devices.ReadMounts(n.ns.mountinfo())
			if err != nil {
				left = append(left, fmt.Sprintf("node %s: reading its mount table: %v", n.node, err))
				continue
			}
			var points []string
			for _, m := range mounts {
				points = append(points, m.Path)
			}
			for _, m := range invariants.VolumeMounts(points, nodeKubeletDir) {
				left = append(left, fmt.Sprintf("node %s: a volume's mount is left: %s", n.node, m))
			}
		}
		for dev, file := range runs.LoopsBackedUnder(c.dir) {
			if c.volumeImage(file) {
				left = append(left, fmt.Sprintf("loop device %s is left attached to %s", dev, file))
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "; "))
		}
		return nil
	})
	return left
}

// eventTimes is when e was first and last reported: its first and last
// timestamps (core/v1 events), or its event time and its series' last
// observation (events.k8s.io's, which set neither).
func eventTimes(e corev1.Event) (first, last time.Time) {
	first, last = e.FirstTimestamp.Time, e.LastTimestamp.Time
	if first.IsZero() {
		first = e.EventTime.Time
	}
	if e.Series != nil && !e.Series.LastObservedTime.IsZero() {
		last = e.Series.LastObservedTime.Time
	}
	if last.IsZero() {
		last = first
	}
	return first, last
}

// restartCounts are the restart counts of the containers of converge's
// pods, and the restarts intended of each so far.
type restartCounts struct {
	seen, intended map[invariants.Container]int32
}

// countRestarts reads the restart counts of converge's containers now.
func countRestarts(ctx context.Context) (restartCounts, error) {
	rc := restartCounts{seen: map[invariants.Container]int32{}, intended: map[invariants.Container]int32{}}
	pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return rc, err
	}
	for _, p := range pods.Items {
		if !hasPrefix(p.Name, convergePods) {
			continue
		}
		for _, st := range p.Status.ContainerStatuses {
			rc.seen[invariants.Container{Pod: p.Name, UID: string(p.UID), Name: st.Name}] = st.RestartCount
		}
	}
	intent.mu.Lock()
	defer intent.mu.Unlock()
	maps.Copy(rc.intended, intent.restarts)
	return rc, nil
}

// intendRestartsSince records as intended every restart of converge's
// containers since before (countRestarts): a soak's, whose faults
// restart them as often as they fall, and a sidecar more than once while
// csi-node comes back.
func intendRestartsSince(ctx context.Context, before restartCounts) error {
	now, err := countRestarts(ctx)
	if err != nil {
		return err
	}
	intent.mu.Lock()
	defer intent.mu.Unlock()
	if intent.restarts == nil {
		intent.restarts = map[invariants.Container]int32{}
	}
	for ctr, n := range now.seen {
		if want := before.intended[ctr] + n - before.seen[ctr]; want > intent.restarts[ctr] {
			intent.restarts[ctr] = want
		}
	}
	return nil
}

package nodeloss

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/converge-csi/converge/test/testenv/poll"
)

// fixture is a Watcher over a fake clientset, with a clock the test
// moves and the events it records.
type fixture struct {
	t       *testing.T
	client  *fake.Clientset
	c       *Watcher
	events  *record.FakeRecorder
	metrics *Metrics
	reg     *prometheus.Registry

	mu  sync.Mutex
	now time.Time
	// podGrace holds the grace period each pod deletion asked for.
	podGrace map[string]*int64
}

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	f := &fixture{t: t, client: fake.NewClientset(objs...), events: record.NewFakeRecorder(100), reg: prometheus.NewRegistry(),
		now: t0, podGrace: map[string]*int64{}}
	f.metrics = NewMetrics(f.reg)
	f.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteActionImpl)
		f.mu.Lock()
		f.podGrace[d.Namespace+"/"+d.Name] = d.DeleteOptions.GracePeriodSeconds
		f.mu.Unlock()
		return false, nil, nil
	})
	f.c = New(Config{Client: f.client, Driver: testDriver, TopologyKey: testTopology, Grace: 30 * time.Second,
		Resync: time.Minute, Events: f.events, Metrics: f.metrics, Now: f.clock})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); f.c.factory.Shutdown() })
	if err := f.c.start(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// pass runs a pass once the caches show what ready says.
func (f *fixture) pass(ready func() bool) Decision {
	f.t.Helper()
	poll.Until(f.t, 10*time.Second, 5*time.Millisecond, "the caches showing the change", func() error {
		if !ready() {
			return errors.New("they never did")
		}
		return nil
	})
	d, err := f.c.Pass(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// drained returns the events recorded so far.
func (f *fixture) drained() []string {
	var out []string
	for {
		select {
		case e := <-f.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func always() bool { return true }

// TestReleaseAStatefulSetsVolume follows a release from the node's
// deletion to the volume's: within the grace a warning, once, of what
// comes and nothing else; then the claim and its pod (at once: its node is
// gone), then, once the claim is gone, the volume; events on each, and the
// metrics.
func TestReleaseAStatefulSetsVolume(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, node("a"), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"),
		statefulSet("ns", "db", "data"), pod("ns", "db-0", "b", "data-db-0"), pod("ns", "web", "a"))
	if d := f.pass(always); actions(d) != "pending v" || d.Next != 30*time.Second {
		t.Fatalf("first pass after the node is seen absent: %s, next in %v; want the warning alone, and a pass in 30s", actions(d), d.Next)
	}
	f.advance(29 * time.Second)
	if d := f.pass(always); actions(d) != "pending v" {
		t.Fatalf("within the grace: %s", actions(d))
	}
	events := f.drained()
	want := "Warning NodeLossPending node b was deleted; unless it registers again by 2026-11-25T12:00:30Z, converge deletes claim ns/data-db-0"
	if len(events) != 2 || !strings.HasPrefix(events[0], want) || events[0] != events[1] {
		t.Fatalf("events within the grace: %q, want one %q on the volume and one on the claim", events, want)
	}
	f.advance(time.Second)
	d := f.pass(always)
	if got := actions(d); got != "delete_claim ns/data-db-0; delete_pod ns/db-0" {
		t.Fatalf("after the grace: %s", got)
	}
	claims, pods, pvs := f.client.CoreV1().PersistentVolumeClaims("ns"), f.client.CoreV1().Pods("ns"), f.client.CoreV1().PersistentVolumes()
	if _, err := claims.Get(ctx, "data-db-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the claim: %v, want it deleted", err)
	}
	if g, asked := f.podGrace["ns/db-0"]; !asked || g != nil {
		t.Errorf("the pod on the gone node was deleted with grace %v (asked %t), want its own (nil): the pod GC force-deletes it", g, asked)
	}
	if _, err := pods.Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Errorf("a pod that does not use the claim: %v", err)
	}
	// The claim gone from the cache: the volume goes.
	d = f.pass(func() bool {
		_, err := f.c.claims.PersistentVolumeClaims("ns").Get("data-db-0")
		return apierrors.IsNotFound(err)
	})
	if got := actions(d); got != "release v" {
		t.Fatalf("once the claim is gone: %s", got)
	}
	if _, err := pvs.Get(ctx, "v", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the volume: %v, want it deleted", err)
	}
	released := strings.Join(f.drained(), "\n")
	for _, want := range []string{"Warning ClaimReleased node b was deleted", "Warning PodDeleted", "Warning VolumeReleased"} {
		if !strings.Contains(released, want) {
			t.Errorf("events do not say %q:\n%s", want, released)
		}
	}
	if got := testutil.ToFloat64(f.metrics.actions.WithLabelValues("release")); got != 1 {
		t.Errorf("releases counted: %v, want 1", got)
	}
	if d := f.pass(func() bool { _, err := f.c.volumes.Get("v"); return apierrors.IsNotFound(err) }); len(d.Actions) != 0 {
		t.Errorf("after the release: %s", actions(d))
	}
}

// TestReleaseTakesOffTheFinalizer checks that a released volume kept by
// finalizers loses the provisioner's (the PersistentVolume protection
// controller takes its own off) and keeps the others.
func TestReleaseTakesOffTheFinalizer(t *testing.T) {
	v := volume("v", "b", "rel", "ns", "")
	now := metav1.NewTime(t0)
	v.DeletionTimestamp = &now // as the API server keeps it for its finalizers
	f := newFixture(t, class("rel", "release"), v)
	f.advance(time.Hour)
	f.pass(always) // the node is seen absent
	f.advance(time.Hour)
	if got := actions(f.pass(always)); got != "release v" {
		t.Fatalf("got %s", got)
	}
	got, err := f.client.CoreV1().PersistentVolumes().Get(context.Background(), "v", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.Finalizers, ",") != "kubernetes.io/pv-protection" {
		t.Errorf("finalizers: %v, want the protection's alone", got.Finalizers)
	}
}

// TestRetainWarnsOnce checks that a retained volume's warnings are given
// once each (not at every pass), on the volume and its claim: what comes
// while the node is within its grace, then that it is lost; that a node
// that comes back ends them; and that a node deleted again is warned of
// again. A node that is there is never acted on.
func TestRetainWarnsOnce(t *testing.T) {
	f := newFixture(t, class("ret", ""), volume("v", "b", "ret", "ns", "c"), pvc("ns", "c", "v"), pod("ns", "p", "b", "c"))
	f.pass(always)
	f.pass(always)
	pending := "Warning NodeLossPending node b was deleted; unless it registers again by 2026-11-25T12:00:30Z, converge keeps claim ns/c"
	events := f.drained()
	if len(events) != 2 || !strings.HasPrefix(events[0], pending) || !strings.HasPrefix(events[1], pending) {
		t.Errorf("events within the grace: %q, want one %q on the volume and one on the claim", events, pending)
	}
	f.advance(time.Minute)
	if got := actions(f.pass(always)); got != "retained v" {
		t.Fatalf("got %s", got)
	}
	f.pass(always)
	events = f.drained()
	if len(events) != 2 || !strings.HasPrefix(events[0], "Warning NodeLost node b was deleted") {
		t.Errorf("events: %q, want one NodeLost on the volume and one on the claim", events)
	}
	if got := testutil.ToFloat64(f.metrics.lost.WithLabelValues("retain")); got != 1 {
		t.Errorf("volumes on lost nodes, retain: %v, want 1", got)
	}
	// The node comes back.
	nodes := f.client.CoreV1().Nodes()
	if _, err := nodes.Create(context.Background(), node("b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := f.pass(func() bool { _, err := f.c.nodes.Get("b"); return err == nil })
	back := "Normal NodeBack node b is back: converge releases nothing of this volume"
	if events := f.drained(); len(d.Actions) != 0 || len(events) != 2 || !strings.HasPrefix(events[0], back) || !strings.HasPrefix(events[1], back) {
		t.Errorf("the node back: %s, events %q; want no action and one %q on the volume and one on the claim", actions(d), events, back)
	}
	f.pass(always)
	if events := f.drained(); len(events) != 0 {
		t.Errorf("a second pass with the node back: events %q, want none", events)
	}
	if got := testutil.ToFloat64(f.metrics.lost.WithLabelValues("retain")); got != 0 {
		t.Errorf("volumes on lost nodes, retain, the node back: %v, want 0", got)
	}
	if _, err := f.client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "c", metav1.GetOptions{}); err != nil {
		t.Errorf("the retained claim: %v", err)
	}
	// Deleted again: warned again, of a grace that starts now.
	if err := nodes.Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.pass(func() bool { _, err := f.c.nodes.Get("b"); return apierrors.IsNotFound(err) })
	pending = "Warning NodeLossPending node b was deleted; unless it registers again by 2026-11-25T12:01:30Z, converge keeps claim ns/c"
	if events := f.drained(); len(events) != 2 || !strings.HasPrefix(events[0], pending) {
		t.Errorf("events, the node deleted again: %q, want one %q on the volume and one on the claim", events, pending)
	}
}

// TestOutOfServiceWaitsForNotReady checks that a node tainted out of
// service while it reports Ready is warned of, once, and released from
// only when it is no longer Ready.
func TestOutOfServiceWaitsForNotReady(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, withReady(node("b", OutOfServiceTaint), corev1.ConditionTrue), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"),
		pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data"), pod("ns", "db-0", "b", "data-db-0"))
	for range 2 {
		if d := f.pass(always); actions(d) != "pending v" || d.Next != 0 {
			t.Fatalf("tainted and Ready: %s, next in %v; want the warning alone, and no timer", actions(d), d.Next)
		}
	}
	want := "Warning NodeLossPending node b carries the " + OutOfServiceTaint + " taint but reports Ready; once it is not Ready, converge deletes claim ns/data-db-0"
	if events := f.drained(); len(events) != 2 || !strings.HasPrefix(events[0], want) {
		t.Errorf("events: %q, want one %q on the volume and one on the claim", events, want)
	}
	// The node lifecycle controller marks it Unknown: its kubelet stopped
	// reporting.
	n, err := f.client.CoreV1().Nodes().Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions[len(n.Status.Conditions)-1].Status = corev1.ConditionUnknown
	n.ResourceVersion = "2"
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := f.pass(func() bool {
		n, err := f.c.nodes.Get("b")
		return err == nil && n.Status.Conditions[len(n.Status.Conditions)-1].Status == corev1.ConditionUnknown
	})
	if got := actions(d); got != "delete_claim ns/data-db-0; delete_pod ns/db-0" {
		t.Fatalf("tainted and not Ready: %s", got)
	}
	if events := strings.Join(f.drained(), "\n"); !strings.Contains(events, "Warning ClaimReleased node b carries the "+OutOfServiceTaint+" taint and is not Ready") {
		t.Errorf("events do not say why the claim was released:\n%s", events)
	}
}

// TestOnlyTheDriversVolumes checks that a volume of another driver on a
// gone node is left alone.
func TestOnlyTheDriversVolumes(t *testing.T) {
	v := volume("v", "b", "rel", "ns", "data-db-0")
	v.Spec.CSI.Driver = "other.csi.dev"
	f := newFixture(t, class("rel", "release"), v, pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data"))
	f.pass(always)
	f.advance(time.Hour)
	if d := f.pass(always); len(d.Actions) != 0 {
		t.Errorf("another driver's volume: %s", actions(d))
	}
}

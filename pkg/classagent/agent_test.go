package classagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
)

// calls records the hands the node took; fail makes the next ones fail.
type calls struct {
	mu       sync.Mutex
	got      []Hand
	fail     int
	attempts int
}

func (c *calls) modify(_ context.Context, h Hand) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	if c.fail > 0 {
		c.fail--
		return errors.New("csi-node refused")
	}
	c.got = append(c.got, h)
	return nil
}

// waitFor waits until a hand of class reached the node, and returns how
// many attempts there were by then.
func (c *calls) waitFor(t *testing.T, class string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.got)
		last := Hand{}
		if n > 0 {
			last = c.got[n-1]
		}
		c.mu.Unlock()
		if n > 0 && last.Class == class {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.attempts
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Fatalf("class %s never handed; hands: %+v", class, c.got)
	return 0
}

func TestAgentHandsTheClassTheClaimNames(t *testing.T) {
	pv, claim, slow := world()
	fast := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, DriverName: driver,
		Parameters: map[string]string{"maxReadIops": "200"}}
	client := fake.NewClientset(pv, claim, slow, fast)
	c := &calls{fail: 1}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- New(Config{Client: client, Scope: scope, Modify: c.modify, Resync: time.Hour}).Run(ctx)
	}()
	// At start-up, retried after the node's refusal.
	if n := c.waitFor(t, "slow"); n != 2 {
		t.Errorf("%d hands before slow went through, want the refused one and its retry", n)
	}

	// The claim's owner switches to fast: handed at once, whatever the
	// PV says.
	claim.Spec.VolumeAttributesClassName = ptr.To("fast")
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "fast")
	c.mu.Lock()
	last := c.got[len(c.got)-1]
	c.mu.Unlock()
	if last.VolumeID != "pvc-1_b" || last.Params["maxReadIops"] != "200" {
		t.Errorf("handed %+v", last)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestAgentReturnsWhenItsCachesDoNotFill: an agent whose caches do not
// fill within SyncTimeout (its account may not list) returns, for its
// process to exit and its pod to restart, with its context still live:
// the informers it started stop with it.
func TestAgentReturnsWhenItsCachesDoNotFill(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	done := make(chan error, 1)
	go func() {
		done <- New(Config{Client: client, Scope: scope, Modify: (&calls{}).modify, Resync: time.Hour, SyncTimeout: 100 * time.Millisecond}).Run(context.Background())
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Run: got nil, want the caches' failure to fill")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still runs 10 s after its caches failed to fill within 100 ms")
	}
}

// TestAgentSaysWhenItHands: Synced is called once the caches are
// filled, before the first volume is handed (the agent's /readyz), and
// not by an agent whose caches never fill.
func TestAgentSaysWhenItHands(t *testing.T) {
	pv, claim, slow := world()
	var synced atomic.Bool
	handedBefore := atomic.Bool{}
	modify := func(context.Context, Hand) error {
		if !synced.Load() {
			handedBefore.Store(true)
		}
		return nil
	}
	c := &calls{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- New(Config{Client: fake.NewClientset(pv, claim, slow), Scope: scope, Resync: time.Hour,
			Modify: func(ctx context.Context, h Hand) error { modify(ctx, h); return c.modify(ctx, h) },
			Synced: func() {
				if synced.Swap(true) {
					t.Error("Synced called twice")
				}
			}}).Run(ctx)
	}()
	c.waitFor(t, "slow")
	cancel()
	<-done
	if !synced.Load() || handedBefore.Load() {
		t.Errorf("Synced called: %v, a volume handed before: %v; want it called before the first hand", synced.Load(), handedBefore.Load())
	}

	// An API server that never answers a list: the caches never fill.
	never := fake.NewClientset()
	never.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("no API server")
	})
	err := New(Config{Client: never, Scope: scope, Modify: c.modify, Resync: time.Hour, SyncTimeout: 100 * time.Millisecond,
		Synced: func() { t.Error("Synced called by an agent whose caches did not fill") }}).Run(context.Background())
	if err == nil {
		t.Error("Run: got nil, want the caches' failure to fill")
	}
}

// TestAgentTellsTheClaimOfARefusal: a class the volume's node keeps
// refusing is told in one Warning event on the claim, and retried.
func TestAgentTellsTheClaimOfARefusal(t *testing.T) {
	pv, claim, slow := world()
	client := fake.NewClientset(pv, claim, slow)
	c := &calls{fail: failTimes + 1}
	events := record.NewFakeRecorder(10)
	m := NewMetrics(prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go New(Config{Client: client, Scope: scope, Modify: c.modify, Resync: time.Hour, Events: events, RetryBase: 10 * time.Millisecond, Metrics: m}).Run(ctx)
	if n := c.waitFor(t, "slow"); n != failTimes+2 {
		t.Errorf("%d tries before slow went through, want %d", n, failTimes+2)
	}
	if got := testutil.ToFloat64(m.handFailures); got != failTimes+1 {
		t.Errorf("converge_node_agent_hand_failures_total: got %v, want %d", got, failTimes+1)
	}
	close(events.Events)
	var got []string
	for e := range events.Events {
		got = append(got, e)
	}
	if len(got) != 1 || !strings.Contains(got[0], "Warning "+ReasonNotApplied) || !strings.Contains(got[0], `class "slow"`) ||
		!strings.Contains(got[0], "csi-node refused") {
		t.Errorf("events: %q, want one %s quoting the refusal", got, ReasonNotApplied)
	}
}

// node is a csi-node's record of one volume's limits, merged as
// ControllerModifyVolume merges them: a key given sets, max removes, a
// key absent changes nothing.
type node struct {
	calls
	limits host.IOLimits
}

func (n *node) modify(ctx context.Context, h Hand) error {
	p, err := contract.ParseIOLimits(h.Params)
	if err != nil {
		return err
	}
	if err := n.calls.modify(ctx, h); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.limits = p.Apply(n.limits)
	return nil
}

func (n *node) held() host.IOLimits {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.limits
}

// TestAgentHoldsTheVolumeToTheClassAlone: whatever class the claim named
// before, the volume's node holds it to the limits of the one it names
// now, and to none when it names none; and a node that lost its record
// gets the whole class back.
func TestAgentHoldsTheVolumeToTheClassAlone(t *testing.T) {
	pv, claim, slow := world() // slow: maxReadIops 100
	wbps := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "wbps"}, DriverName: driver,
		Parameters: map[string]string{"maxWriteBps": "50Mi"}}
	client := fake.NewClientset(pv, claim, slow, wbps)
	n := &node{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := New(Config{Client: client, Scope: scope, Modify: n.modify, Resync: time.Hour})
	go a.Run(ctx)
	n.waitFor(t, "slow")
	if got, want := n.held(), (host.IOLimits{ReadIOPS: 100}); got != want {
		t.Errorf("limits held with class slow: got %v, want %v", got, want)
	}

	switchTo := func(class *string) {
		t.Helper()
		claim.Spec.VolumeAttributesClassName = class
		if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	switchTo(ptr.To("wbps"))
	n.waitFor(t, "wbps")
	if got, want := n.held(), (host.IOLimits{WriteBPS: 50 << 20}); got != want {
		t.Errorf("limits held after the switch from slow to wbps: got %v, want %v (slow's read limit lifted)", got, want)
	}

	// The node loses its record; the next hand (a resync's) gives the
	// whole class back.
	n.mu.Lock()
	n.limits = host.IOLimits{ReadIOPS: 7}
	n.mu.Unlock()
	a.addAll()
	for deadline := time.Now().Add(10 * time.Second); n.held() != (host.IOLimits{WriteBPS: 50 << 20}) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := n.held(), (host.IOLimits{WriteBPS: 50 << 20}); got != want {
		t.Errorf("limits held after a resync of a node that held other limits: got %v, want %v", got, want)
	}

	switchTo(nil)
	n.waitFor(t, "")
	if got := n.held(); !got.IsZero() {
		t.Errorf("limits held once the claim names no class: got %v, want none", got)
	}
}

// TestAgentLiftsNothingWhereItsNodeHoldsNoVolume: a volume of no class
// that its csi-node does not hold (NOT_FOUND: a static PV's device) has
// no limit to lift; that is no failure to retry or tell.
func TestAgentLiftsNothingWhereItsNodeHoldsNoVolume(t *testing.T) {
	pv, claim, _ := world()
	claim.Spec.VolumeAttributesClassName = nil
	client := fake.NewClientset(pv, claim)
	var mu sync.Mutex
	tries := 0
	modify := func(context.Context, Hand) error {
		mu.Lock()
		defer mu.Unlock()
		tries++
		return status.Error(codes.NotFound, "volume pvc-1_b not found on this node (b)")
	}
	events := record.NewFakeRecorder(10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go New(Config{Client: client, Scope: scope, Modify: modify, Resync: time.Hour, Events: events, RetryBase: time.Millisecond}).Run(ctx)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := tries
		mu.Unlock()
		if n > 0 {
			break
		}
	}
	// Retries, were there any, would come within milliseconds.
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if tries != 1 {
		t.Errorf("got %d tries, want 1", tries)
	}
	if len(events.Events) != 0 {
		t.Errorf("got %d events (%q), want none", len(events.Events), <-events.Events)
	}
}

// recorder records the events posted, each as "namespace/name type
// reason message" of the object it is about.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) Event(o runtime.Object, typ, reason, msg string) {
	m, err := meta.Accessor(o)
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprintf("%s/%s %s %s %s", m.GetNamespace(), m.GetName(), typ, reason, msg))
}

func (r *recorder) Eventf(o runtime.Object, typ, reason, format string, args ...any) {
	r.Event(o, typ, reason, fmt.Sprintf(format, args...))
}

func (r *recorder) AnnotatedEventf(o runtime.Object, _ map[string]string, typ, reason, format string, args ...any) {
	r.Event(o, typ, reason, fmt.Sprintf(format, args...))
}

func (r *recorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestAgentHandsNothingForAHandleTwoPVsName: a PV pinned to this node
// that names the handle of another PV's volume (made with a stolen
// node's credentials, pre-bound to a claim of the thief's class) gets its
// class neither handed nor that of the true PV's claim: the handle is
// skipped, logged once with both PVs' names, and told once in a Warning
// event on the claim each PV is bound to (the true claim's owner learns
// that its class is held back, and what to delete), until one PV goes.
func TestAgentHandsNothingForAHandleTwoPVsName(t *testing.T) {
	pv, claim, slow := world()
	forged := pv.DeepCopy()
	forged.Name = "forged"
	forged.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "evil", Name: "grab", UID: "u9"}
	grab := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "evil", Name: "grab", UID: "u9"},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: "forged", VolumeAttributesClassName: ptr.To("crawl")},
	}
	crawl := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "crawl"}, DriverName: driver,
		Parameters: map[string]string{"maxReadIops": "10", "maxWriteIops": "10"}}
	client := fake.NewClientset(pv, claim, slow, forged, grab, crawl)
	c := &calls{}
	events := &recorder{}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	a := New(Config{Client: client, Scope: scope, Modify: c.modify, Resync: time.Hour, Events: events})
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	told := func() []string {
		var told []string
		for _, e := range logs.Data() {
			if e.Verbosity == 0 && strings.HasPrefix(e.Message, "Handing nothing") {
				told = append(told, fmt.Sprint(e.Message, e.ParameterKVList))
			}
		}
		return told
	}
	for deadline := time.Now().Add(10 * time.Second); len(told()) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// Both PVs are decided again (a resync); nothing is told again.
	a.addAll()
	time.Sleep(200 * time.Millisecond)
	c.mu.Lock()
	if len(c.got) != 0 {
		t.Errorf("handed %+v, want nothing for handle pvc-1_b, which two PVs name", c.got)
	}
	c.mu.Unlock()
	if got := told(); len(got) != 1 || !strings.Contains(got[0], "pvc-1") || !strings.Contains(got[0], "forged") {
		t.Errorf("logs at level 0 about the handle: %q, want one naming pvc-1 and forged", got)
	}
	// One event on each claim, though both PVs were decided twice.
	got := events.events()
	slices.Sort(got)
	if len(got) != 2 || !strings.HasPrefix(got[0], "evil/grab Warning "+ReasonHandleShared+" ") || !strings.HasPrefix(got[1], "ns/data Warning "+ReasonHandleShared+" ") {
		t.Errorf("events: %q, want one %s on evil/grab and one on ns/data", got, ReasonHandleShared)
	}
	for _, e := range got {
		if !strings.Contains(e, "pvc-1_b") || !strings.Contains(e, "forged, pvc-1") || !strings.Contains(e, "delete the one") {
			t.Errorf("event %q, want it to name the handle pvc-1_b, both PVs, and what to delete", e)
		}
	}

	// The forged PV deleted, the true one is handed its claim's class.
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, "forged", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "slow")
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.got {
		if h.Class != "slow" {
			t.Errorf("handed %+v, want slow alone", h)
		}
	}
	if n := len(events.events()); n != 2 {
		t.Errorf("%d events once the forged PV is gone, want the 2 told before", n)
	}
}

// TestAgentTellsTheClaimAgainAtEachResync: while a class keeps failing,
// the claim is told at the failTimes-th try and again at each resync's
// hand-off that fails (an event lasts an hour), never at the backoff's
// retries in between; a success ends it, and a new failure is told anew
// at its failTimes-th try.
func TestAgentTellsTheClaimAgainAtEachResync(t *testing.T) {
	pv, claim, slow := world()
	client := fake.NewClientset(pv, claim, slow)
	c := &calls{fail: 1 << 30}
	events := record.NewFakeRecorder(100)
	ctx, cancel := context.WithCancel(context.Background())
	// A backoff of an hour does not end within the test: each retry is
	// queued here, as the end of its backoff would.
	a := New(Config{Client: client, Scope: scope, Modify: c.modify, Resync: time.Hour, Events: events, RetryBase: time.Hour})
	a.factory.Start(ctx.Done())
	defer func() {
		cancel()
		a.factory.Shutdown()
		a.queue.ShutDown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), a.synced...) {
		t.Fatal("the caches did not fill")
	}
	retry := func() {
		a.queue.Add(pv.Name)
		a.next(ctx)
	}
	resync := func() {
		a.resync()
		a.next(ctx)
	}
	told := 0
	check := func(when string, want int) {
		t.Helper()
		for len(events.Events) > 0 {
			e := <-events.Events
			if !strings.Contains(e, "Warning "+ReasonNotApplied) || !strings.Contains(e, `class "slow"`) {
				t.Errorf("event %q, want %s about class slow", e, ReasonNotApplied)
			}
			told++
		}
		if told != want {
			t.Errorf("%s: %d events, want %d", when, told, want)
		}
	}

	a.addAll() // at start-up
	a.next(ctx)
	retry()
	check("after 2 tries", 0)
	retry()
	check("after 3 tries", 1)
	for range 4 {
		retry()
	}
	check("after 4 retries more", 1)
	resync()
	check("after a resync's hand-off failed", 2)
	retry()
	retry()
	check("after the retries that followed", 2)
	resync()
	check("after the next resync's", 3)

	c.mu.Lock()
	c.fail = 0
	c.mu.Unlock()
	retry()
	c.mu.Lock()
	c.fail = 1 << 30
	c.mu.Unlock()
	resync()
	resync()
	check("after a success, then two resyncs' failures", 3)
	resync()
	check("after the third failure since", 4)
}

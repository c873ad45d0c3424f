package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/test/e2e/invariants"
	"github.com/converge-csi/converge/test/e2e/soak"
)

// Issue 71's soak (make soak): claims of several kinds on two nodes, each
// written by a pod that appends checksummed, fsync'd records and prints
// what it acknowledged, while claims are made, grown, snapshotted,
// restored, cloned and deleted, and faults fall on csi-node, its sidecars,
// converge-controller and the kubelets, all at the times of a plan drawn
// from a seed (package soak). Once the plan has run, the soak waits for the
// cluster to settle and checks that every acknowledged record is on its
// volume and nothing else is, that every claim is Bound and every pod runs,
// and that taking it all down leaves nothing behind.

var (
	soakFor  = flag.Duration("soak", 0, "TestSoak runs a soak of this length (make soak); 0: it is skipped")
	soakSeed = flag.String("soak-seed", "0", "the soak's seed; 0: a random one, which it prints; full: the seed whose plan of 2 minutes holds every kind of event; seeds joined by + run their plans at once, soaks separated by commas one after the other")
	soakOut  = flag.String("soak-out", "", "a directory the soak writes its plan and history to")
)

// soakClass is a kind of claim the soak makes.
type soakClass struct {
	class string
	block bool
}

// soakVolume is a claim of the soak and its writer pod (both named after
// it, the owner of the records its writer writes).
type soakVolume struct {
	name  string
	class soakClass
}

// size is what a new volume of v's kind asks for: an xfs's least, and
// for a raw block one room for over an hour of its writer's records.
func (v soakVolume) size() string {
	if v.class.block {
		return "256Mi"
	}
	return "320Mi"
}

// path is where the writer finds the volume's log.
func (v soakVolume) path() string {
	if v.class.block {
		return blockPath
	}
	return dataDir + "/log"
}

// soakRun is one soak.
type soakRun struct {
	ctx     context.Context
	t       *testing.T
	nodes   []*kubeNode
	classes []soakClass
	history *soak.History
	// groupClasses are the classes of the groups, one for each node.
	groupClasses []string
	// poolOf is the pool of each class.
	poolOf map[string]string
	// failpoints are the failpoints of csi-node's failpoint build.
	failpoints []string
	// began is when the soak began, and restarts the restarts of
	// converge's containers then.
	began    time.Time
	restarts restartCounts
	// tookDown says whether takeDown ran.
	tookDown bool
	// prometheus evaluates the chart's alerts, and alerts are those it
	// listed since the soak began (soak_alerts_test.go).
	prometheus *prometheus
	alerts     *soak.AlertLog

	mu sync.Mutex
	// The fields below are guarded by mu.
	volumes map[string]soakVolume
	groups  []soakGroup
	// copying counts, for each volume, its copies not yet Bound: a source
	// grown or deleted meanwhile leaves its clone refused for good
	// (external-provisioner compares the clone's request with the
	// source's, and wants the source Bound).
	copying map[string]int
	// removing holds the volumes a removal checks now: two makers of room
	// at once would otherwise both pick one, and one make none.
	removing map[string]bool
	// filling holds the pools a fault fills now ("node/pool"), and
	// spaceMade, for each CSIStorageCapacity, the version at which the
	// soak last deleted a volume to make room in its pool (makeRoom).
	filling   map[string]bool
	spaceMade map[string]string
	broken    []string // invariants that failed
	failures  []string // operations and faults that failed (not an invariant: faults make them fail)
	nodeMu    []sync.Mutex
}

func TestSoak(t *testing.T) {
	if *soakFor <= 0 {
		t.Skip("no -soak length (make soak)")
	}
	soaks, err := soak.ParseSeeds(*soakSeed, rand.Uint64)
	if err != nil {
		t.Fatalf("-soak-seed: %v", err)
	}
	env := soakSetUp(t)
	for _, seeds := range soaks {
		name := soak.SeedsString(seeds)
		out := *soakOut
		if out != "" && len(soaks) > 1 {
			out = filepath.Join(out, name)
		}
		if !t.Run("seed-"+name, func(t *testing.T) { soakOnce(t, env, seeds, out) }) {
			return
		}
	}
}

// soakEnv is what the soaks of a run share: the nodes, converge's pods
// rolled onto the failpoint build, and a Prometheus that evaluates the
// chart's alerts.
type soakEnv struct {
	nodes      []*kubeNode
	failpoints []string // the failpoint build's
	prometheus *prometheus
}

// soakSetUp joins the second node, rolls converge's pods onto the
// failpoint build and starts Prometheus, each undone when t ends.
func soakSetUp(t *testing.T) soakEnv {
	env := soakEnv{nodes: []*kubeNode{c.kubeNode, secondNode(t)}}
	ctx := context.Background()
	from := time.Now()
	names, restore, err := c.useFailpointBuild(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	expectRolloutProbes(t, from)
	env.failpoints = names
	t.Cleanup(func() {
		from := time.Now()
		if err := restore(); err != nil {
			t.Error(err)
		}
		expectRolloutProbes(t, from)
	})
	start, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if env.prometheus, err = startPrometheus(start, env.nodes); err != nil {
		t.Fatalf("Prometheus for the soak's alerts: %v", err)
	}
	t.Cleanup(env.prometheus.stop)
	return env
}

// expectRolloutProbes expects, from from until now, the warnings of
// csi-node's pods while a rollout onto the failpoint build or back
// replaces them: a csi-node that starts slowly on a loaded machine may be
// probed before it listens, and a sidecar that starts before its socket
// exists exits and backs off (each seen once beside the soak): Unhealthy
// and BackOff, and no other reason.
func expectRolloutProbes(t *testing.T, from time.Time) {
	for _, reason := range []string{"Unhealthy", "BackOff"} {
		expect(invariants.Expected{Reason: reason, Object: "Pod/" + daemonSetNamespace + "/" + daemonSetName + "-",
			From: from.Truncate(time.Second), Until: time.Now().Add(time.Second), Test: t.Name()})
	}
}

// soakOnce runs one soak of seeds in env, writing its plan and history to
// out if not "".
func soakOnce(t *testing.T, env soakEnv, seeds []uint64, out string) {
	nodes := env.nodes
	seed := soak.SeedsString(seeds)
	plan, err := soak.PlanOf(seeds, *soakFor, soak.Kinds(len(nodes)))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range plan {
		lines = append(lines, e.String())
	}
	t.Logf("soak: seed %s, %s, %d events (make soak SOAK_SEED=%s SOAK_FOR=%s replays it):\n%s", seed, *soakFor, len(plan), seed, *soakFor, strings.Join(lines, "\n"))
	s := newSoakRun(t, env)
	// A soak that ends before it settles (t.Fatal) takes its objects down
	// all the same, after save has kept what they show.
	t.Cleanup(func() {
		if !s.tookDown {
			s.takeDown()
		}
	})
	t.Cleanup(func() {
		if out != "" {
			s.save(out, seed, lines, t.Failed())
		}
	})
	s.began = time.Now()
	if s.restarts, err = countRestarts(s.ctx); err != nil {
		t.Fatal(err)
	}
	stop := s.begin()
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	for _, e := range plan {
		time.Sleep(time.Until(start.Add(e.At)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.do(e); err != nil {
				s.fail(&s.failures, "%s: %v", e, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("soak: the plan ran in %s; settling", time.Since(start).Round(time.Second))
	s.settle()
	stop() // its last read of the writers' lines may break an invariant
	s.mu.Lock()
	t.Logf("soak: %d operations or faults failed under the faults (each is retried by Kubernetes; only what does not settle counts):\n%s", len(s.failures), strings.Join(s.failures, "\n"))
	broken := slices.Clone(s.broken)
	s.mu.Unlock()
	if len(broken) > 0 {
		t.Fatalf("soak seed %s broke %d invariants:\n%s", seed, len(broken), strings.Join(broken, "\n"))
	}
}

// newSoakRun makes the soak's classes of claim on env's nodes.
func newSoakRun(t *testing.T, env soakEnv) *soakRun {
	xfs := map[string]string{"csi.storage.k8s.io/fstype": "xfs"}
	thin := storageClass(t, "soak-thin", map[string]string{"converge.csi.dev/provisioning": "thin", "csi.storage.k8s.io/fstype": "xfs"})
	thick := storageClass(t, "soak-thick", xfs)
	fast := storageClass(t, "soak-fast", map[string]string{"converge.csi.dev/pool": fastPool, "converge.csi.dev/provisioning": "thin", "csi.storage.k8s.io/fstype": "xfs"})
	s := &soakRun{ctx: context.Background(), t: t, nodes: env.nodes, history: soak.NewHistory(), volumes: map[string]soakVolume{},
		copying: map[string]int{}, removing: map[string]bool{}, nodeMu: make([]sync.Mutex, len(env.nodes)), groupClasses: []string{fast, thin},
		failpoints: env.failpoints, prometheus: env.prometheus,
		poolOf: map[string]string{thin: "default", thick: "default", fast: fastPool}, filling: map[string]bool{}, spaceMade: map[string]string{}}
	for _, cl := range []string{thin, thick, fast} {
		s.classes = append(s.classes, soakClass{cl, false}, soakClass{cl, true})
	}
	return s
}

// begin makes a volume of each kind and a group on each node (in the
// first node's pool fast, the second's default pool), and starts watching
// the alerts and reading the writers' acknowledgements; it returns what
// stops both.
func (s *soakRun) begin() (stop func()) {
	t := s.t
	for i := range s.classes {
		if err := s.create(i); err != nil {
			t.Fatal(err)
		}
	}
	for i, class := range s.groupClasses {
		if err := s.makeGroup(class, s.nodes[i].node); err != nil {
			t.Fatal(err)
		}
	}
	stopAlerts := s.watchAlerts()
	acks, stopAcks := context.WithCancel(s.ctx)
	acksDone := make(chan struct{})
	go func() { defer close(acksDone); s.readAcks(acks) }()
	return sync.OnceFunc(func() { stopAcks(); <-acksDone; stopAlerts() })
}

// fail records a failure in list (s.broken or s.failures), which the
// soak's end lists; a broken invariant is also logged at once, so that a
// soak stopped before its end still says what it found.
func (s *soakRun) fail(list *[]string, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if list == &s.broken {
		s.logf("invariant broken: %s", msg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	*list = append(*list, msg)
}

func (s *soakRun) logf(format string, args ...any) {
	s.t.Logf("soak %s: %s", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

// do runs one event of the plan.
func (s *soakRun) do(e soak.Event) error {
	s.logf("%s", e)
	switch e.Kind {
	case "create":
		return s.create(e.Target % len(s.classes))
	case "grow":
		return s.grow(e.Target)
	case "snapshot":
		return s.copyOf(e.Target, true)
	case "clone":
		return s.copyOf(e.Target, false)
	case "group-snapshot":
		return s.groupSnapshot(e.Target)
	case "delete":
		return s.remove(e.Target)
	case "kill-csi-node":
		_, err := s.nodes[e.Target].killContainer(s.ctx, s.t, "csi-node")
		return err
	case "kill-sidecar":
		_, err := s.nodes[e.Target/len(soak.Sidecars)].killContainer(s.ctx, s.t, soak.Sidecars[e.Target%len(soak.Sidecars)])
		return err
	case "stop-csi-node":
		return s.stopDriver(s.nodes[e.Target], e.Hold)
	case "kill-controller":
		return s.killController()
	case "restart-kubelet", "kubelet-down":
		// One stop of a node's kubelet at a time.
		n := s.nodes[e.Target]
		s.nodeMu[e.Target].Lock()
		defer s.nodeMu[e.Target].Unlock()
		if err := n.kubelet.stop(30 * time.Second); err != nil {
			return err
		}
		time.Sleep(e.Hold)
		return n.runKubelet()
	case "reboot":
		return s.rebootNode(e.Target, e.Hold)
	case "fill-pool":
		return s.fillPool(e.Target, e.Hold)
	case "failpoint":
		return s.armFailpoint(e.Target, e.Hold)
	case "restart-apiserver":
		if err := c.apiserver.stop(30 * time.Second); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(s.ctx, 2*time.Minute)
		defer cancel()
		return c.startAPIServer(ctx)
	}
	return fmt.Errorf("no such kind %s", e.Kind)
}

// soakMade counts the names the soaks of the run made: a name is never
// used twice, so that a soak never reads the pod logs of an earlier one's
// writer of the same name, which the kubelet removes a while after.
var soakMade atomic.Int64

// next is a new name for a claim or a snapshot.
func (s *soakRun) next(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, soakMade.Add(1))
}

// pick is one of the volumes, by draw (nil when there is none); free
// leaves out those being copied (to grow or delete one).
func (s *soakRun) pick(draw int, free bool) *soakVolume {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.volumes))
	for n := range s.volumes {
		if !free || s.copying[n] == 0 {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	v := s.volumes[names[draw%len(names)]]
	return &v
}

// create makes a claim of the class and its writer.
func (s *soakRun) create(class int) error {
	var nodes []string
	for _, n := range s.nodes {
		nodes = append(nodes, n.node)
	}
	v := soakVolume{name: s.next("soak"), class: s.classes[class]}
	if err := s.makeRoom(class, v.class.class, resource.MustParse(v.size()), nodes...); err != nil {
		return err
	}
	if err := s.history.New(v.name); err != nil {
		return err
	}
	return s.start(v, v.size(), nil, "")
}

// start creates v's claim (from source, or empty) and its writer pod, on
// node if not "".
func (s *soakRun) start(v soakVolume, size string, source *corev1.TypedObjectReference, node string) error {
	mode := fs
	if v.class.block {
		mode = corev1.PersistentVolumeBlock
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: v.name, Labels: map[string]string{"app": "soak"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{rwo},
			StorageClassName: ptr.To(v.class.class),
			VolumeMode:       &mode,
			DataSourceRef:    source,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(s.ctx, pvc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create claim %s: %w", v.name, err)
	}
	spec := podSpecOf(podSpec{name: v.name, claims: []string{v.name}, block: v.class.block, node: node})
	spec.Containers[0].Name = "w"
	spec.Containers[0].Image, spec.Containers[0].ImagePullPolicy = soakImage, corev1.PullNever
	spec.Containers[0].Command = []string{"/" + soak.WriterName, "write", v.name + "=" + v.path()}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: v.name, Labels: map[string]string{"app": "soak"}}, Spec: spec}
	if _, err := c.client.CoreV1().Pods(ns).Create(s.ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", v.name, err)
	}
	s.mu.Lock()
	s.volumes[v.name] = v
	s.mu.Unlock()
	return nil
}

// grow asks for 32 MiB more of a volume.
func (s *soakRun) grow(draw int) error {
	v := s.pick(draw, true)
	if v == nil {
		return nil
	}
	pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(s.ctx, v.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	size.Add(resource.MustParse("32Mi"))
	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size.String())
	_, err = c.client.CoreV1().PersistentVolumeClaims(ns).Patch(s.ctx, v.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// copyOf makes a volume from another: restored from a snapshot of it, or
// cloned. What the copy must hold is the source's lineage as it stood
// before the snapshot or the clone was asked for.
func (s *soakRun) copyOf(draw int, snapshot bool) error {
	src := s.pick(draw, false)
	if src == nil {
		return nil
	}
	s.mu.Lock()
	_, there := s.volumes[src.name]
	if there {
		// A removal that has not yet let it go sees the copy, and keeps
		// it; one that has is seen here.
		s.copying[src.name]++
	}
	s.mu.Unlock()
	if !there {
		return nil
	}
	defer func() {
		s.mu.Lock()
		s.copying[src.name]--
		s.mu.Unlock()
	}()
	pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(s.ctx, src.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		return nil // a copy needs a source that exists
	}
	pv, err := c.client.CoreV1().PersistentVolumes().Get(s.ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	// At least what the source asks and has (a grow may be under way).
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if have := pvc.Status.Capacity[corev1.ResourceStorage]; have.Cmp(size) > 0 {
		size = have
	}
	if err := s.makeRoom(draw, src.class.class, size, nodeOf(pv)); err != nil {
		return err
	}
	lineage, err := s.history.Lineage(src.name)
	if err != nil {
		return err
	}
	ref := &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: src.name}
	snap := ""
	if snapshot {
		snap = s.next(src.name + "-snap")
		if err := s.snapshot(snap, src.name); err != nil {
			return err
		}
		ref = &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: snap}
	}
	v := soakVolume{name: s.next(src.name + map[bool]string{true: "-r", false: "-c"}[snapshot]), class: src.class}
	if err := s.history.Restore(v.name, lineage); err != nil {
		return err
	}
	// On the source's node, where its data is, as docs/volumes.md asks.
	if err := s.start(v, size.String(), ref, nodeOf(pv)); err != nil {
		return err
	}
	// The source is held (not grown, not deleted), and the snapshot
	// kept, until the copy is made.
	if err := waitFor(s.ctx, 5*time.Minute, nil, func() error {
		pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(s.ctx, v.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("claim %s is %s", v.name, pvc.Status.Phase)
		}
		return nil
	}); err != nil {
		return err
	}
	if snap == "" {
		return nil
	}
	return c.dynamic.Resource(volumeSnapshots).Namespace(ns).Delete(s.ctx, snap, metav1.DeleteOptions{})
}

// snapshot takes a VolumeSnapshot of a claim and waits for it to be ready.
func (s *soakRun) snapshot(name, claim string) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1",
		"kind":       "VolumeSnapshot",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{"app": "soak"}},
		"spec": map[string]any{
			"volumeSnapshotClassName": "converge",
			"source":                  map[string]any{"persistentVolumeClaimName": claim},
		},
	}}
	snaps := c.dynamic.Resource(volumeSnapshots).Namespace(ns)
	if _, err := snaps.Create(s.ctx, obj, metav1.CreateOptions{}); err != nil {
		return err
	}
	return waitFor(s.ctx, 5*time.Minute, nil, func() error {
		got, err := snaps.Get(s.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse"); !ready {
			return fmt.Errorf("VolumeSnapshot %s not ready: %v", name, got.Object["status"])
		}
		return nil
	})
}

// remove checks a volume's log, then deletes its pod and claim; it keeps
// at least as many volumes as there are kinds of claim.
func (s *soakRun) remove(draw int) error {
	s.mu.Lock()
	few := len(s.volumes) <= len(s.classes)
	s.mu.Unlock()
	v := s.pick(draw, true)
	if few || v == nil {
		return nil
	}
	return s.removeVolume(*v)
}

// removeVolume checks v's log, then deletes its pod and claim, unless a
// copy of it began meanwhile, or another removal of it is under way.
func (s *soakRun) removeVolume(v soakVolume) error {
	s.mu.Lock()
	already := s.removing[v.name]
	s.removing[v.name] = true
	s.mu.Unlock()
	if already {
		return nil
	}
	return s.removeMarked(v)
}

// removeMarked is removeVolume of a volume this removal marked removing.
func (s *soakRun) removeMarked(v soakVolume) error {
	defer func() {
		s.mu.Lock()
		delete(s.removing, v.name)
		s.mu.Unlock()
	}()
	if err := s.check(v); err != nil {
		return err // not Running: it goes another time
	}
	s.mu.Lock()
	_, there := s.volumes[v.name]
	copying := s.copying[v.name] > 0
	if there && !copying {
		delete(s.volumes, v.name)
	}
	s.mu.Unlock()
	if !there || copying {
		return nil // removed meanwhile, or a copy began: it goes another time
	}
	if err := c.client.CoreV1().Pods(ns).Delete(s.ctx, v.name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return c.client.CoreV1().PersistentVolumeClaims(ns).Delete(s.ctx, v.name, metav1.DeleteOptions{})
}

// check scans a volume's log in its pod and holds it to the volume's
// lineage: what fails is an invariant broken. It returns an error when the
// log could not be read (the pod is not running).
func (s *soakRun) check(v soakVolume) error { return s.checkLog(v.name, v.name, v.path()) }

// checkLog is check of the log of volume at path in pod.
func (s *soakRun) checkLog(pod, volume, path string) error {
	// What was acknowledged before the scan begins: the writer goes on
	// meanwhile, and a record it acknowledges while the scan reads may
	// lie past what the scan read.
	lineage, err := s.history.Lineage(volume)
	if err != nil {
		return err
	}
	scanned, err := s.scan(pod, path)
	if err != nil {
		return err
	}
	problems := soak.Check(scanned.Records(), lineage)
	if scanned.Error != "" {
		problems = append(problems, scanned.Error)
	}
	for _, p := range problems {
		s.fail(&s.broken, "volume %s: %s", volume, p)
	}
	s.logf("checked %s: %d records in %d runs, lineage %v, %d problems", volume, len(scanned.Records()), len(scanned.Runs), lineage, len(problems))
	return nil
}

// scan reads the log at path in pod's writer.
func (s *soakRun) scan(pod, path string) (soak.Scanned, error) {
	var scanned soak.Scanned
	out, err := c.kubectl(s.ctx, "exec", "-n", ns, pod, "-c", "w", "--", "/"+soak.WriterName, "scan", path)
	if err != nil {
		return scanned, fmt.Errorf("scan %s in %s: %v: %s", path, pod, err, tail(out, 5))
	}
	if err := json.Unmarshal([]byte(out[max(0, strings.Index(out, "{")):]), &scanned); err != nil {
		return scanned, fmt.Errorf("scan %s in %s: %v: %s", path, pod, err, out)
	}
	return scanned, nil
}

// readAcks reads what the writers print from the nodes' pod logs, outside
// the nodes, every half second until ctx ends, and once more then: their
// acknowledgements, and the records each found when it (re)started, which
// must be all its owner's acknowledged ones.
func (s *soakRun) readAcks(ctx context.Context) {
	read := map[string]int64{} // each log file, how far it was read
	for {
		done := ctx.Err() != nil
		var files [][]soak.Line
		for _, n := range s.nodes {
			paths, _ := filepath.Glob(filepath.Join(n.dir, "pod-logs", ns+"_soak-*", "w", "*.log"))
			for _, f := range paths {
				b, err := os.ReadFile(f)
				if err != nil || int64(len(b)) <= read[f] {
					continue
				}
				// Only whole lines.
				end := int64(strings.LastIndexByte(string(b), '\n') + 1)
				if end <= read[f] {
					continue
				}
				var lines []soak.Line
				for _, l := range strings.Split(string(b[read[f]:end]), "\n") {
					if l, ok := soak.ParseLine(l); ok {
						lines = append(lines, l)
					}
				}
				files = append(files, lines)
				read[f] = end
			}
		}
		for _, lost := range s.history.Read(soak.Order(files)) {
			s.fail(&s.broken, "%s", lost)
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stopDriver stops the node's csi-node with SIGSTOP for hold, then lets it
// go on (the kubelet's liveness probe may restart it first).
func (s *soakRun) stopDriver(n *kubeNode, hold time.Duration) error {
	pod, err := n.driverPod(s.ctx)
	if err != nil || pod == nil {
		return fmt.Errorf("the converge pod of %s: %v", n.node, err)
	}
	pids := podProcesses(pod, programNamed("csi-node"))
	if len(pids) == 0 {
		return errors.New("no csi-node process")
	}
	intendDriverRestart(pod)
	expect(invariants.HungLiveness("Pod/"+pod.Namespace+"/"+pod.Name, 5, s.t.Name()))
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	time.Sleep(hold)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	return nil
}

// killController kills a running converge-controller with SIGKILL.
func (s *soakRun) killController() error {
	pods, err := c.client.CoreV1().Pods(daemonSetNamespace).List(s.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerName})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		n := c.nodeNamed(p.Spec.NodeName)
		for _, st := range p.Status.ContainerStatuses {
			if st.Name != controllerName || st.State.Running == nil || n == nil {
				continue
			}
			intendRestart(&p, controllerName)
			out, err := n.ctr("tasks", "kill", "-s", "SIGKILL", strings.TrimPrefix(st.ContainerID, "containerd://"))
			if err != nil {
				return fmt.Errorf("kill %s: %v: %s", p.Name, err, out)
			}
			return nil
		}
	}
	return errors.New("no converge-controller running")
}

// soakUnit is a pod of the soak, its claims, and the logs it writes:
// a volume's writer, or a group's.
type soakUnit struct {
	pod    string
	claims []string
	paths  []string // the log of claims[i] in the pod
}

// units are the soak's pods, sorted by name.
func (s *soakRun) units() []soakUnit {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []soakUnit
	for _, v := range s.volumes {
		out = append(out, soakUnit{pod: v.name, claims: []string{v.name}, paths: []string{v.path()}})
	}
	for _, g := range s.groups {
		u := soakUnit{pod: g.name, claims: g.members}
		for i := range g.members {
			u.paths = append(u.paths, g.path(i))
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b soakUnit) int { return strings.Compare(a.pod, b.pod) })
	return out
}

// unsettled says which of units' claims are not Bound and pods not
// running and ready.
func (s *soakRun) unsettled(units []soakUnit) []string {
	var not []string
	for _, u := range units {
		for _, cl := range u.claims {
			pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(s.ctx, cl, metav1.GetOptions{})
			if err != nil || pvc.Status.Phase != corev1.ClaimBound {
				not = append(not, "claim "+cl+" not Bound")
			}
		}
		pod, err := c.client.CoreV1().Pods(ns).Get(s.ctx, u.pod, metav1.GetOptions{})
		if err != nil || pod.Status.Phase != corev1.PodRunning || !podReady(pod) {
			not = append(not, "pod "+u.pod+" not running")
		}
	}
	return not
}

// ungrown says which of units' claims do not yet hold what they ask: a
// grow asked and not done, the volume's or its filesystem's.
func (s *soakRun) ungrown(units []soakUnit) []string {
	var not []string
	for _, u := range units {
		for _, cl := range u.claims {
			pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(s.ctx, cl, metav1.GetOptions{})
			if err != nil {
				not = append(not, fmt.Sprintf("claim %s: %v", cl, err))
				continue
			}
			want, have := pvc.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Status.Capacity[corev1.ResourceStorage]
			if have.Cmp(want) >= 0 {
				continue
			}
			var conds []string
			for _, cond := range pvc.Status.Conditions {
				conds = append(conds, string(cond.Type)+"="+string(cond.Status))
			}
			not = append(not, fmt.Sprintf("claim %s holds %s, asks %s (resize %v, conditions %v)", cl, have.String(), want.String(), pvc.Status.AllocatedResourceStatuses, conds))
		}
	}
	return not
}

// settle makes room for the claims left Pending in a full pool, as an
// operator would; waits, the faults over, for every claim to be Bound and
// grown to what it asks and every writer running; then checks every
// volume's log and that the nodes, their pools and the API agree; then it
// deletes everything and waits for the nodes and the API to hold nothing
// of it.
func (s *soakRun) settle() {
	if n, err := s.roomForPending(); err != nil {
		s.fail(&s.failures, "making room for the Pending claims: %v", err)
	} else if n > 0 {
		s.logf("deleted %d volumes to make room for the Pending claims", n)
	}
	units := s.units()
	err := waitFor(s.ctx, 5*time.Minute, nil, func() error {
		if not := s.unsettled(units); len(not) > 0 {
			return errors.New(strings.Join(not, "; "))
		}
		return nil
	})
	if err != nil {
		s.fail(&s.broken, "not settled 5 minutes after the faults: %v", err)
		s.describeUnsettled(units)
	} else if err := waitFor(s.ctx, 6*time.Minute, nil, func() error {
		// A grow refused while a pool was full is retried by csi-resizer
		// at most 5 minutes apart (its --retry-interval-max): it may come
		// that long after the pool has room again.
		if not := s.ungrown(units); len(not) > 0 {
			return errors.New(strings.Join(not, "; "))
		}
		return nil
	}); err != nil {
		s.fail(&s.broken, "a grow not done 6 minutes after the soak settled: %v", err)
	}
	s.followRunbooks(units)
	s.convergeSteady()
	settled := time.Now()
	// While the faults fell, converge's components and the kubelet warned
	// of what failed and was retried; from now on, nothing may fail.
	expect(invariants.Expected{AnyReason: true, From: s.began.Truncate(time.Second), Until: time.Now().Add(time.Second), Test: s.t.Name()})
	if err := intendRestartsSince(s.ctx, s.restarts); err != nil {
		s.fail(&s.broken, "counting the restarts of the faults: %v", err)
	}
	// Let every writer acknowledge more, after every fault.
	time.Sleep(2 * time.Second)
	for _, u := range units {
		for i, cl := range u.claims {
			if err := s.checkLog(u.pod, cl, u.paths[i]); err != nil {
				s.fail(&s.broken, "%v", err)
			}
		}
	}
	// The store and the API agree: csi-node gc, as docs/operations.md
	// runs it, finds nothing left over on any node.
	for _, n := range s.nodes {
		out, err := docsGC(s.t, n.node)
		if err != nil || !strings.Contains(out, "Nothing on this node is left over.") {
			s.fail(&s.broken, "csi-node gc on %s: %v\n%s", n.node, err, out)
		}
	}
	s.poolsAgree("settled")
	s.quiet(settled, 3*time.Minute)
	s.takeDown()
	s.poolsAgree("taken down")
}

// describeUnsettled logs what the claims and pods that did not settle
// say of it.
func (s *soakRun) describeUnsettled(units []soakUnit) {
	for _, u := range units {
		if len(s.unsettled([]soakUnit{u})) == 0 {
			continue
		}
		for _, obj := range append([]string{"pod/" + u.pod}, prefixed("pvc/", u.claims)...) {
			out, _ := c.kubectl(s.ctx, "describe", "-n", ns, obj)
			s.logf("%s, not settled:\n%s", obj, tail(out, 30))
		}
	}
}

// prefixed is each of names after prefix.
func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

// takeDown deletes the soak's pods, claims and snapshots, and checks that
// each goes, with its PV, snapshot content, mounts and loop devices.
func (s *soakRun) takeDown() {
	s.tookDown = true
	sel := metav1.ListOptions{LabelSelector: "app=soak"}
	snaps := c.dynamic.Resource(volumeSnapshots).Namespace(ns)
	for _, del := range []func() error{
		func() error { return c.client.CoreV1().Pods(ns).DeleteCollection(s.ctx, metav1.DeleteOptions{}, sel) },
		func() error {
			return c.client.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(s.ctx, metav1.DeleteOptions{}, sel)
		},
		func() error { return snaps.DeleteCollection(s.ctx, metav1.DeleteOptions{}, sel) },
		func() error {
			return c.dynamic.Resource(volumeGroupSnapshots).Namespace(ns).DeleteCollection(s.ctx, metav1.DeleteOptions{}, sel)
		},
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			s.fail(&s.broken, "taking the soak down: %v", err)
		}
	}
	// A raw block volume the kubelet forgot (its pod deleted while
	// csi-node was down) is deleted within csi-node's grace of 3 minutes
	// and one retry of csi-provisioner's, at most 5 minutes apart: see
	// docs/operations.md.
	const takeDownWait = 9 * time.Minute
	err := waitFor(s.ctx, takeDownWait, nil, func() error {
		var left []string
		pods, err := c.client.CoreV1().Pods(ns).List(s.ctx, sel)
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			left = append(left, "pod "+p.Name)
		}
		pvcs, err := c.client.CoreV1().PersistentVolumeClaims(ns).List(s.ctx, sel)
		if err != nil {
			return err
		}
		for _, p := range pvcs.Items {
			left = append(left, "claim "+p.Name)
		}
		pvs, err := c.client.CoreV1().PersistentVolumes().List(s.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, pv := range pvs.Items {
			if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == ns && strings.HasPrefix(ref.Name, "soak-") {
				left = append(left, "PV "+pv.Name+" of claim "+ref.Name+" ("+string(pv.Status.Phase)+")")
			}
		}
		contents, err := c.dynamic.Resource(snapshotContents).List(s.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, sc := range contents.Items {
			if ref, _, _ := unstructured.NestedString(sc.Object, "spec", "volumeSnapshotRef", "name"); strings.HasPrefix(ref, "soak-") {
				left = append(left, "VolumeSnapshotContent "+sc.GetName())
			}
		}
		groups, err := c.dynamic.Resource(volumeGroupSnapshotContents).List(s.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, gc := range groups.Items {
			if ref, _, _ := unstructured.NestedString(gc.Object, "spec", "volumeGroupSnapshotRef", "name"); strings.HasPrefix(ref, "soak-") {
				left = append(left, "VolumeGroupSnapshotContent "+gc.GetName())
			}
		}
		if len(left) > 0 {
			return errors.New(strings.Join(left, ", "))
		}
		return nil
	})
	if err != nil {
		s.fail(&s.broken, "%s after the soak's objects were deleted, left: %v", takeDownWait, err)
	}
	for _, l := range c.volumesLeft(2 * time.Minute) {
		s.fail(&s.broken, "%s", l)
	}
}

// save writes the plan and the history to dir, and after a failure each
// node's csi-node logs, kubelet log and csi-node's state directory (the
// store) beside them.
func (s *soakRun) save(dir, seed string, plan []string, failed bool) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.t.Errorf("soak output: %v", err)
		return
	}
	s.mu.Lock()
	var names []string
	for n := range s.volumes {
		names = append(names, n)
	}
	s.mu.Unlock()
	slices.Sort(names)
	lineages := map[string][]soak.Expect{}
	for _, n := range names {
		lineages[n], _ = s.history.Lineage(n)
	}
	b, _ := json.MarshalIndent(map[string]any{"seed": seed, "length": soakFor.String(), "lineages": lineages}, "", "  ")
	var alerts []soak.AlertSeen
	if s.alerts != nil {
		alerts = s.alerts.Entries()
	}
	a, _ := json.MarshalIndent(alerts, "", "  ")
	for name, data := range map[string][]byte{"plan.txt": []byte(strings.Join(plan, "\n") + "\n"), "history.json": b, "alerts.json": a} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			s.t.Errorf("soak output: %v", err)
		}
	}
	if failed {
		for _, n := range s.nodes {
			files := append(n.containerLogs("csi-node"), filepath.Join(n.logs, "kubelet.log"))
			state, _ := filepath.Glob(filepath.Join(n.stateDir, "*"))
			for _, f := range append(files, state...) {
				if fi, err := os.Stat(f); err != nil || !fi.Mode().IsRegular() {
					continue
				}
				name := strings.NewReplacer("/", "_").Replace(strings.TrimPrefix(f, n.dir+"/"))
				if err := copyFile(f, filepath.Join(dir, n.node, name)); err != nil {
					s.t.Errorf("soak output: %v", err)
				}
			}
		}
	}
	s.t.Logf("soak: plan and history in %s", dir)
}

// copyFile copies the file from to to, making to's directory.
func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/test/e2e/compare"
)

// Issue 72's comparison: converge's thin and thick volumes beside
// local-path-provisioner and pods with an emptyDir alone, on the e2e
// cluster. A round of a way creates N pods at once, each with a claim of
// its own (none for the emptyDir), waits for every pod to be Ready, then
// deletes pods and claims at once and waits until each volume's space is
// back. The rounds of the ways alternate, so that what drifts over a run
// (the page cache, the API server's caches, the pools' fill) falls on
// every way alike. Package compare does the arithmetic; compare_test.go
// runs it (make compare), and make test runs it once, small, as a smoke
// test of the harness.

const (
	// compareLabel marks a round's claims and pods with the round's id.
	compareLabel = "converge.csi.dev/compare"
	// comparePoll is how often a round looks at what it waits for: the
	// times themselves come from watches, except that of an image or a
	// directory gone from a node, which only a look at the node sees.
	comparePoll = 100 * time.Millisecond
	// selectedNodeAnnotation is where the scheduler puts the node it
	// chose on a WaitForFirstConsumer claim, for the provisioner.
	selectedNodeAnnotation = "volume.kubernetes.io/selected-node"
	// storageProvisionerAnnotation is where the PV controller names the
	// provisioner it hands a claim to, once its node is chosen.
	storageProvisionerAnnotation = "volume.kubernetes.io/storage-provisioner"
)

// compareWay is one of the ways: its name (compare.Ways) and the
// StorageClass of its claims ("" for the emptyDir, which has none).
type compareWay struct {
	name, class string
}

// compareSpread is the nodes a case's pods go to, in turn: pod i to
// nodes[i % len(nodes)] (a nodeSelector), so that two nodes get half each.
type compareSpread struct {
	name  string // "one node", "two nodes"
	nodes []*kubeNode
}

// comparison is a run of the comparison: every N, for every spread,
// rounds rounds of every way.
type comparison struct {
	ways    []compareWay
	ns      []int
	rounds  int
	spreads []compareSpread
	size    string // each claim's
	logf    func(format string, args ...any)
}

// run runs every round, in the order N, spread, round, way (the ways
// rotated by one each round), and returns what each measured; on an error
// it returns the rounds measured before it.
func (cmp comparison) run(ctx context.Context) ([]compare.Round, error) {
	var out []compare.Round
	for _, n := range cmp.ns {
		for _, s := range cmp.spreads {
			if why := compareTooMany(ctx, cmp.ways, n, s); why != "" {
				cmp.logf("N=%d, %s: not run: %s", n, s.name, why)
				continue
			}
			for r := range cmp.rounds {
				for i := range cmp.ways {
					way := cmp.ways[(i+r)%len(cmp.ways)]
					start := time.Now()
					round, err := runCompareRound(ctx, way, n, s, r, cmp.size)
					if err != nil {
						return out, fmt.Errorf("N=%d, %s, round %d, %s: %w", n, s.name, r, way.name, err)
					}
					cmp.logf("N=%d, %s, round %d, %s: %.1fs; ready p50 %.2fs, returned p50 %.2fs", n, s.name, r, way.name,
						time.Since(start).Seconds(), compare.Percentile(round.Samples[compare.Ready], 50),
						compare.Percentile(round.Samples[compare.Returned], 50))
					out = append(out, round)
				}
			}
		}
	}
	return out, nil
}

// compareTooMany says why n pods with a claim each cannot all run on the
// spread's nodes at once, or "": more per node than the node's csi-node
// takes (its CSINode's count, the run's --max-volumes). The case's
// rounds are then left out for every way, so that what is compared was
// measured together.
func compareTooMany(ctx context.Context, ways []compareWay, n int, s compareSpread) string {
	if !slices.ContainsFunc(ways, func(w compareWay) bool { return w.class != "" && w.name != compare.LocalPath }) {
		return ""
	}
	perNode := (n + len(s.nodes) - 1) / len(s.nodes)
	for _, node := range s.nodes {
		cn, err := c.client.StorageV1().CSINodes().Get(ctx, node.node, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		for _, d := range cn.Spec.Drivers {
			if d.Allocatable != nil && d.Allocatable.Count != nil && int(*d.Allocatable.Count) < perNode {
				return fmt.Sprintf("%d volumes on node %s, which takes %d (csi-node's --max-volumes)", perNode, node.node, *d.Allocatable.Count)
			}
		}
	}
	return ""
}

// compareWatch records, from watches, when each of a round's claims was
// given its node by the scheduler and Bound, each pod bound to its node,
// Ready and gone, and each volume (by its claim's name) made and gone.
type compareWatch struct {
	mu sync.Mutex
	// The maps are guarded by mu.
	chosen, handed, bound, podNode, ready, podGone, pvSeen, pvGone map[string]time.Time
	pvs                                                            map[string]*corev1.PersistentVolume // by claim
	nodes                                                          map[string]string                   // each pod's node
	failed                                                         map[string]string                   // pods that ended, and how
}

// watchRound starts the watches of the round id; stop ends them.
func watchRound(ctx context.Context, id string) (w *compareWatch, stop func(), err error) {
	w = &compareWatch{chosen: map[string]time.Time{}, handed: map[string]time.Time{}, bound: map[string]time.Time{}, podNode: map[string]time.Time{},
		ready: map[string]time.Time{}, podGone: map[string]time.Time{}, pvSeen: map[string]time.Time{}, pvGone: map[string]time.Time{},
		pvs: map[string]*corev1.PersistentVolume{}, nodes: map[string]string{}, failed: map[string]string{}}
	ctx, cancel := context.WithCancel(ctx)
	mine := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = compareLabel + "=" + id }))
	all := informers.NewSharedInformerFactory(c.client, 0)
	unwrap := func(obj any) any {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			return d.Obj
		}
		return obj
	}
	handlers := func(seen func(obj any), gone func(obj any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, obj any) { seen(obj) },
			DeleteFunc: func(obj any) { gone(unwrap(obj)) }}
	}
	first := func(m map[string]time.Time, k string) {
		if _, ok := m[k]; !ok {
			m[k] = time.Now()
		}
	}
	_, err = mine.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(handlers(func(obj any) {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		w.mu.Lock()
		defer w.mu.Unlock()
		if pvc.Annotations[selectedNodeAnnotation] != "" {
			first(w.chosen, pvc.Name)
		}
		if pvc.Annotations[storageProvisionerAnnotation] != "" {
			first(w.handed, pvc.Name)
		}
		if pvc.Status.Phase == corev1.ClaimBound {
			first(w.bound, pvc.Name)
		}
	}, func(any) {}))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	_, err = mine.Core().V1().Pods().Informer().AddEventHandler(handlers(func(obj any) {
		pod := obj.(*corev1.Pod)
		w.mu.Lock()
		defer w.mu.Unlock()
		if pod.Spec.NodeName != "" {
			w.nodes[pod.Name] = pod.Spec.NodeName
			first(w.podNode, pod.Name)
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			w.failed[pod.Name] = string(pod.Status.Phase) + " " + pod.Status.Message
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				first(w.ready, pod.Name)
			}
		}
	}, func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok {
			w.mu.Lock()
			first(w.podGone, pod.Name)
			w.mu.Unlock()
		}
	}))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	ofRound := func(pv *corev1.PersistentVolume) bool {
		r := pv.Spec.ClaimRef
		return r != nil && r.Namespace == ns && strings.HasPrefix(r.Name, id+"-")
	}
	_, err = all.Core().V1().PersistentVolumes().Informer().AddEventHandler(handlers(func(obj any) {
		if pv := obj.(*corev1.PersistentVolume); ofRound(pv) {
			w.mu.Lock()
			w.pvs[pv.Spec.ClaimRef.Name] = pv
			first(w.pvSeen, pv.Spec.ClaimRef.Name)
			w.mu.Unlock()
		}
	}, func(obj any) {
		if pv, ok := obj.(*corev1.PersistentVolume); ok && ofRound(pv) {
			w.mu.Lock()
			first(w.pvGone, pv.Spec.ClaimRef.Name)
			w.mu.Unlock()
		}
	}))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	mine.Start(ctx.Done())
	all.Start(ctx.Done())
	mine.WaitForCacheSync(ctx.Done())
	all.WaitForCacheSync(ctx.Done())
	return w, func() { cancel(); mine.Shutdown(); all.Shutdown() }, nil
}

// runCompareRound runs round r of way: n pods, each with a claim of size
// unless the way is the emptyDir's, on the spread's nodes.
func runCompareRound(ctx context.Context, way compareWay, n int, s compareSpread, r int, size string) (compare.Round, error) {
	id := fmt.Sprintf("cmp-%s-n%d-%d-r%d", way.name, n, len(s.nodes), r)
	round := compare.Round{Way: way.name, N: n, Spread: s.name, Index: r, Samples: map[string][]float64{}}
	w, stop, err := watchRound(ctx, id)
	if err != nil {
		return round, err
	}
	defer stop()
	// Whatever happens, nothing of the round is left for the next.
	defer cleanRound(id)
	name := func(i int) string { return fmt.Sprintf("%s-%d", id, i) }
	before, err := compareUsage(ctx, s.nodes)
	if err != nil {
		return round, err
	}

	// Create: every claim and pod at once, each pod right after its
	// claim; a pod's times count from just before its claim's creation.
	created := make([]time.Time, n)
	if err := each(n, func(i int) error {
		created[i] = time.Now()
		if way.class != "" {
			if err := createCompareClaim(ctx, name(i), id, way.class, size); err != nil {
				return err
			}
		}
		return createComparePod(ctx, name(i), id, way.class != "", s.nodes[i%len(s.nodes)].node)
	}); err != nil {
		return round, err
	}
	limit := 3*time.Minute + time.Duration(n)*2*time.Second
	if err := waitRound(ctx, limit, func() (int, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		for p, how := range w.failed {
			return -1, "pod " + p + " ended: " + how
		}
		left := 0
		for i := range n {
			_, ready := w.ready[name(i)]
			_, bound := w.bound[name(i)]
			_, seen := w.pvs[name(i)]
			if !ready || way.class != "" && !(bound && seen) {
				left++
			}
		}
		return left, "pods not Ready (or their claims not seen Bound, or their volumes not seen)"
	}); err != nil {
		return round, err
	}
	names := make([]string, n)
	for i := range n {
		names[i] = name(i)
	}
	paths, err := comparePaths(w, way, names, created, s.nodes)
	if err != nil {
		return round, err
	}
	for i, p := range paths {
		stages, err := p.Stages()
		if err != nil {
			return round, fmt.Errorf("pod %s: %w", names[i], err)
		}
		round.AddPath(stages)
	}

	// What must be gone for each pod's space to be back: its volume's
	// image or directory on its node.
	files := make([]string, n)
	if way.class != "" {
		w.mu.Lock()
		for i := range n {
			pv, node := w.pvs[name(i)], c.nodeNamed(w.nodes[name(i)])
			switch {
			case pv == nil || node == nil:
				err = fmt.Errorf("claim %s: volume %v on node %q not seen", name(i), pv != nil, w.nodes[name(i)])
			case way.name == compare.LocalPath && pv.Spec.HostPath != nil:
				files[i] = node.ns.path(pv.Spec.HostPath.Path)
			case way.name != compare.LocalPath && pv.Spec.CSI != nil:
				files[i] = node.image(pv.Spec.CSI.VolumeHandle)
			default:
				err = fmt.Errorf("claim %s: volume %s is neither local-path's hostPath nor converge's: %+v", name(i), pv.Name, pv.Spec.PersistentVolumeSource)
			}
			if err != nil {
				break
			}
			if _, serr := os.Stat(files[i]); serr != nil {
				err = fmt.Errorf("claim %s: its volume's %s is not on its node: %w", name(i), files[i], serr)
				break
			}
		}
		w.mu.Unlock()
		if err != nil {
			return round, err
		}
	}

	// Delete: every pod and claim at once.
	deleted := time.Now()
	if err := each(n, func(i int) error {
		err := c.client.CoreV1().Pods(ns).Delete(ctx, name(i), metav1.DeleteOptions{})
		if err == nil && way.class != "" {
			err = c.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name(i), metav1.DeleteOptions{})
		}
		return err
	}); err != nil {
		return round, err
	}
	returned, fileGone := make([]time.Time, n), make([]time.Time, n)
	if err := waitRound(ctx, limit, func() (int, string) {
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		left := 0
		for i := range n {
			if !returned[i].IsZero() {
				continue
			}
			if files[i] != "" && fileGone[i].IsZero() {
				// Gone since the last look, comparePoll ago at most.
				if _, err := os.Stat(files[i]); errors.Is(err, os.ErrNotExist) {
					fileGone[i] = now
				}
			}
			podGone, ok := w.podGone[name(i)]
			pvGone, ok2 := w.pvGone[name(i)]
			switch {
			case !ok:
				left++
			case way.class == "":
				returned[i] = podGone
			case !ok2 || fileGone[i].IsZero():
				left++
			default:
				returned[i] = latest(podGone, pvGone, fileGone[i])
			}
		}
		return left, "volumes whose space is not back (pod, volume or its file on the node still there)"
	}); err != nil {
		return round, err
	}
	after, err := compareUsage(ctx, s.nodes)
	if err != nil {
		return round, err
	}

	w.mu.Lock()
	for i := range n {
		if way.class != "" {
			round.Samples[compare.Bound] = append(round.Samples[compare.Bound], w.bound[name(i)].Sub(created[i]).Seconds())
		}
		round.Samples[compare.Ready] = append(round.Samples[compare.Ready], w.ready[name(i)].Sub(created[i]).Seconds())
		round.Samples[compare.Returned] = append(round.Samples[compare.Returned], returned[i].Sub(deleted).Seconds())
	}
	w.mu.Unlock()
	for _, u := range []struct {
		who      string
		cpu, rss string
	}{{"converge", compare.ConvergeCPU, compare.ConvergeRSS}, {"peer", compare.PeerCPU, compare.PeerRSS}} {
		b, ok1 := before[u.who]
		a, ok2 := after[u.who]
		if ok1 && ok2 {
			round.Samples[u.cpu] = []float64{a.cpuSeconds - b.cpuSeconds}
			round.Samples[u.rss] = []float64{float64(a.rssBytes) / (1 << 20)}
		}
	}
	return round, nil
}

// comparePaths are the paths to Ready of the pods names of a round
// (compare.Path), created at created: from the watches, and for
// converge's ways from the calls in csi-node's logs on the nodes.
func comparePaths(w *compareWatch, way compareWay, names []string, created []time.Time, nodes []*kubeNode) ([]compare.Path, error) {
	csi := way.class != "" && way.name != compare.LocalPath
	var calls []call
	if csi {
		for _, n := range nodes {
			cs, err := readCalls(n.containerLogs("csi-node"), "")
			if err != nil {
				return nil, err
			}
			calls = append(calls, cs...)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]compare.Path, len(names))
	for i, name := range names {
		p := compare.Path{Created: created[i], PodNode: w.podNode[name], Ready: w.ready[name]}
		if way.class != "" {
			p.NodeChosen, p.Handed, p.PVSeen, p.Bound = w.chosen[name], w.handed[name], w.pvSeen[name], w.bound[name]
		}
		if csi {
			pv := w.pvs[name]
			if pv == nil || pv.Spec.CSI == nil {
				return nil, fmt.Errorf("claim %s: no volume of converge's seen", name)
			}
			var publishStart time.Time
			p.CreateStart, p.CreateEnd = callSpan(calls, "CreateVolume", pv.Name)
			p.StageStart, p.StageEnd = callSpan(calls, "NodeStageVolume", pv.Spec.CSI.VolumeHandle)
			publishStart, p.PublishEnd = callSpan(calls, "NodePublishVolume", pv.Spec.CSI.VolumeHandle)
			if p.CreateEnd.IsZero() || p.StageEnd.IsZero() || publishStart.IsZero() || p.PublishEnd.IsZero() {
				return nil, fmt.Errorf("claim %s: csi-node's log on node %s lacks a successful CreateVolume, NodeStageVolume or NodePublishVolume of %s (%s)",
					name, w.nodes[name], pv.Name, pv.Spec.CSI.VolumeHandle)
			}
		}
		out[i] = p
	}
	return out, nil
}

// callSpan is when the first call of method about volume began, and when
// the first of them that succeeded ended; zero times for none.
func callSpan(calls []call, method, volume string) (start, end time.Time) {
	for _, c := range calls {
		if c.method != method || c.volume != volume || c.end.IsZero() {
			continue
		}
		if start.IsZero() {
			start = c.start()
		}
		if c.code == "OK" {
			return start, c.end
		}
	}
	return start, end
}

// each runs f(0) to f(n-1) at once and returns their errors joined.
func each(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitRound looks every comparePoll until left says nothing is left, for
// up to limit; a negative count is a failure that waiting cannot mend.
func waitRound(ctx context.Context, limit time.Duration, left func() (int, string)) error {
	deadline := time.Now().Add(limit)
	for {
		n, what := left()
		switch {
		case n == 0:
			return nil
		case n < 0:
			return errors.New(what)
		case time.Now().After(deadline):
			return fmt.Errorf("after %s: %d %s", limit, n, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(comparePoll):
		}
	}
}

// createCompareClaim creates a filesystem claim of the round.
func createCompareClaim(ctx context.Context, name, id, class, size string) error {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{compareLabel: id}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(class),
			VolumeMode:       ptr.To(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(size),
			}},
		},
	}
	_, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	return err
}

// createComparePod creates a pod of the round on node: the suite's
// busybox image asleep until it is deleted (a sleep it waits on, so that
// a SIGTERM ends it at once and a hundred pods cost no CPU), with the
// claim of its own name mounted at dataDir, or an emptyDir there.
func createComparePod(ctx context.Context, name, id string, claim bool, node string) error {
	vol := corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	if claim {
		vol.VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{compareLabel: id}},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			NodeSelector:                  map[string]string{hostnameLabel: node},
			Containers: []corev1.Container{{
				Name: "c", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", `trap "exit 0" TERM; sleep 1000000 & wait`},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: dataDir}},
			}},
			Volumes: []corev1.Volume{vol},
		},
	}
	_, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// cleanRound deletes whatever of round id is left (after a failure) and
// waits, up to two minutes, for its pods and claims to be gone.
func cleanRound(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: compareLabel + "=" + id}
	pods, claims := c.client.CoreV1().Pods(ns), c.client.CoreV1().PersistentVolumeClaims(ns)
	pods.DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	claims.DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	waitFor(ctx, 2*time.Minute, nil, func() error {
		p, err := pods.List(ctx, sel)
		if err != nil {
			return err
		}
		cl, err := claims.List(ctx, sel)
		if err != nil {
			return err
		}
		if len(p.Items)+len(cl.Items) > 0 {
			return fmt.Errorf("%d pods and %d claims of %s left", len(p.Items), len(cl.Items), id)
		}
		return nil
	})
}

// usage is a pod's CPU time so far and its resident memory now.
type usage struct {
	cpuSeconds float64
	rssBytes   int64
}

// compareUsage is the usage of converge, its node pods on nodes
// together, and of its peer, local-path-provisioner's pod when it runs
// ("converge", "peer"). Each is read from the pod's cgroup (v1, the
// kubelet's cgroupfs layout below its node's cgroup root): the CPU time
// of every process that ran in it (cpuacct.usage: csi-node, the
// sidecars beside it, among them the node's csi-provisioner, and what
// csi-node runs, mkfs, losetup...), and its resident memory
// (memory.stat's total_rss, without the page cache). Neither counts
// converge-controller, nor local-path's helper pods, which make and
// remove its directories: each lives seconds in a cgroup of its own.
func compareUsage(ctx context.Context, nodes []*kubeNode) (map[string]usage, error) {
	out := map[string]usage{}
	add := func(who string, n *kubeNode, pod *corev1.Pod) error {
		u, err := podUsage(n, pod)
		if err != nil {
			return err
		}
		t := out[who]
		t.cpuSeconds += u.cpuSeconds
		t.rssBytes += u.rssBytes
		out[who] = t
		return nil
	}
	for _, n := range nodes {
		pod, err := n.driverPod(ctx)
		if err != nil || pod == nil {
			return nil, fmt.Errorf("converge's pod on %s: %v", n.node, err)
		}
		if err := add("converge", n, pod); err != nil {
			return nil, err
		}
	}
	peers, err := c.client.CoreV1().Pods(localPathNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=local-path-provisioner"})
	if err != nil {
		return nil, err
	}
	for i := range peers.Items {
		p := &peers.Items[i]
		if n := c.nodeNamed(p.Spec.NodeName); n != nil && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			if err := add("peer", n, p); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// podUsage reads the usage of pod on node n from its cgroups.
func podUsage(n *kubeNode, pod *corev1.Pod) (usage, error) {
	dir := func(hierarchy string) (string, error) {
		base := filepath.Join("/sys/fs/cgroup", hierarchy, n.cgroupRoot, "kubepods")
		var dirs []string
		for _, pattern := range []string{"pod" + string(pod.UID), "*/pod" + string(pod.UID)} {
			m, _ := filepath.Glob(filepath.Join(base, pattern))
			dirs = append(dirs, m...)
		}
		if len(dirs) != 1 {
			return "", fmt.Errorf("cgroups of pod %s below %s: %v, want one", pod.Name, base, dirs)
		}
		return dirs[0], nil
	}
	var u usage
	d, err := dir("cpuacct")
	if err != nil {
		return u, err
	}
	b, err := os.ReadFile(filepath.Join(d, "cpuacct.usage"))
	if err != nil {
		return u, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return u, fmt.Errorf("%s/cpuacct.usage: %w", d, err)
	}
	u.cpuSeconds = float64(ns) / 1e9
	if d, err = dir("memory"); err != nil {
		return u, err
	}
	if b, err = os.ReadFile(filepath.Join(d, "memory.stat")); err != nil {
		return u, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "total_rss "); ok {
			u.rssBytes, err = strconv.ParseInt(v, 10, 64)
			return u, err
		}
	}
	return u, fmt.Errorf("%s/memory.stat has no total_rss", d)
}

// latest is the latest of ts.
func latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/nodeloss"
	"github.com/converge-csi/converge/test/testenv"
)

// sizingSteps are the volume counts at which BenchmarkSizing measures the
// idle plugin, in order; between two steps the volumes added are staged
// and published at once. CONVERGE_BENCH_SIZING_STEPS (e.g. "0,50,200")
// replaces them for a shorter run.
var sizingSteps = []int{0, 100, 1000}

// sizingWindow is how long each idle measurement lasts: /proc counts CPU
// time in 10 ms ticks, so a 30 s window reads an idle plugin's CPU to about
// 0.03 % of a core. CONVERGE_BENCH_SIZING_WINDOW (e.g. "5s") replaces it.
const sizingWindow = 30 * time.Second

// BenchmarkSizing measures what csi-node costs a node, for the Sizing
// section of docs/operations.md: the plugin run as deploy/ runs it (-v=2),
// its volumes 16 MiB thick ext4 images as BenchmarkThousandVolumes' are.
//
//   - Per volume: the plugin's resident memory (VmRSS) and CPU, idle, with
//     each count of sizingSteps staged and published, over sizingWindow
//     at the default resync period; the slope between the first and the
//     last step is what a volume costs.
//   - Per request: each step's volumes staged and published at once (one
//     NodeStageVolume and one NodePublishVolume each, as the kubelet asks),
//     and at the end all of them torn down at once: the plugin's own CPU
//     time per request (utime+stime of /proc/<pid>/stat), that of the
//     commands it ran (mkfs: the waited-for children's cutime+cstime),
//     which count in the container's cgroup too, and the peak memory while
//     the requests wait: the plugin's VmHWM (reset before each burst
//     through /proc/<pid>/clear_refs) and the peak sum of the resident
//     memory of the plugin and the commands it runs (sampled every 10 ms;
//     a command shorter than that may be missed). The page cache the
//     images' writes leave is charged to the container's cgroup as well,
//     and is reclaimed under its limit: it is not counted here.
func BenchmarkSizing(b *testing.B) {
	steps := sizingSteps
	if v := os.Getenv("CONVERGE_BENCH_SIZING_STEPS"); v != "" {
		steps = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				b.Fatalf("CONVERGE_BENCH_SIZING_STEPS=%q: %v", v, err)
			}
			steps = append(steps, n)
		}
	}
	window := sizingWindow
	if v := os.Getenv("CONVERGE_BENCH_SIZING_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("CONVERGE_BENCH_SIZING_WINDOW=%q: %v", v, err)
		}
		window = d
	}
	p := start(b)
	var vols []vol
	type idleFigure struct {
		volumes          int
		rssMiB, cpuPct   float64
		heapMiB, threads float64
	}
	var idles []idleFigure
	for b.Loop() {
		measureIdle := func(n int) {
			time.Sleep(2 * time.Second) // the last burst's passes end
			cpu0, _ := procStat(b, p.PID())
			time.Sleep(window)
			cpu1, rss := procStat(b, p.PID())
			heap, threads := goFigures(b, p)
			f := idleFigure{volumes: n, rssMiB: float64(rss) / 1024, cpuPct: 100 * float64(cpu1-cpu0) / float64(window),
				heapMiB: heap / (1 << 20), threads: threads}
			idles = append(idles, f)
			b.ReportMetric(f.rssMiB, fmt.Sprintf("idle-%d-rss-MiB", n))
			b.ReportMetric(f.cpuPct, fmt.Sprintf("idle-%d-cpu-%%", n))
			absolute(fmt.Sprintf("sizing, %d volumes idle: resident memory", n), "MiB", f.rssMiB, 0)
			absolute(fmt.Sprintf("sizing, %d volumes idle: CPU, %% of a core", n), "%", f.cpuPct, 0)
			note(fmt.Sprintf("sizing, %d volumes idle: Go heap in use %.1f MiB, %.0f OS threads", n, f.heapMiB, f.threads))
		}
		for i, n := range steps {
			if i > 0 {
				added := make([]vol, 0, n-len(vols))
				for j := len(vols); j < n; j++ {
					v := p.vol(p.createSized(b, fmt.Sprintf("size-%05d", j), thousandVolSize))
					v.dirs(b)
					added = append(added, v)
				}
				c := measureBurst(b, p, added, func(v vol) error {
					if err := p.stage(v); err != nil {
						return err
					}
					return p.publish(v)
				})
				c.report(b, fmt.Sprintf("%d-to-%d", len(vols), n), fmt.Sprintf("%d volumes staged and published at once (%d to %d)", len(added), len(vols), n), 2)
				vols = append(vols, added...)
			}
			measureIdle(n)
		}
		if len(vols) > 0 {
			c := measureBurst(b, p, vols, p.teardown)
			c.report(b, "teardown", fmt.Sprintf("%d volumes torn down at once", len(vols)), 2)
		}
	}
	if first, last := idles[0], idles[len(idles)-1]; last.volumes > first.volumes {
		n := float64(last.volumes - first.volumes)
		perVolKiB := 1024 * (last.rssMiB - first.rssMiB) / n
		perThousandCPU := 1000 * (last.cpuPct - first.cpuPct) / n
		b.ReportMetric(perVolKiB, "rss-KiB-per-volume")
		b.ReportMetric(perThousandCPU, "idle-cpu-%-per-1000-volumes")
		absolute("sizing: resident memory per volume staged and published (slope)", "KiB", perVolKiB, 0)
		absolute("sizing: idle CPU per 1000 volumes (slope), % of a core", "%", perThousandCPU, 0)
	}
}

// burstCost is what a burst of requests cost the plugin.
type burstCost struct {
	volumes, requests int
	wall              time.Duration
	// cpu is the plugin's own CPU time, children that of the commands it
	// ran and waited for.
	cpu, children time.Duration
	// beforeKiB is the plugin's resident memory before the burst;
	// peakKiB its VmHWM during it; treeKiB the peak sum of the plugin's
	// and its commands' resident memory.
	beforeKiB, peakKiB, treeKiB int
}

// measureBurst runs f for every volume at once (burst) and returns what
// it cost the plugin.
func measureBurst(b *testing.B, p plugin, vols []vol, f func(vol) error) burstCost {
	pid := p.PID()
	resetPeak(b, pid)
	_, before := procStat(b, pid)
	cpu0, child0 := cpuTimes(b, pid)
	stop := make(chan struct{})
	var tree int
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			tree = max(tree, treeRSS(pid))
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	wall, _ := burst(b, vols, f)
	close(stop)
	wg.Wait()
	cpu1, child1 := cpuTimes(b, pid)
	return burstCost{volumes: len(vols), wall: wall, cpu: cpu1 - cpu0, children: child1 - child0,
		beforeKiB: before, peakKiB: peakRSS(pid), treeKiB: tree}
}

// report records the burst's figures under key (in the metrics' names)
// and what (in the table); perVolume is how many requests each volume
// made.
func (c burstCost) report(b *testing.B, key, what string, perVolume int) {
	requests := float64(c.volumes * perVolume)
	perReqCPU := ms(c.cpu) / requests
	perVolChildren := ms(c.children) / float64(c.volumes)
	// A volume's requests come one after the other: at most one of each
	// volume waits at a time.
	perReqKiB := float64(c.peakKiB-c.beforeKiB) / float64(c.volumes)
	b.ReportMetric(c.wall.Seconds(), key+"-wall-s")
	b.ReportMetric(perReqCPU, key+"-cpu-ms-per-request")
	b.ReportMetric(perVolChildren, key+"-commands-cpu-ms-per-volume")
	b.ReportMetric(float64(c.peakKiB)/1024, key+"-peak-rss-MiB")
	b.ReportMetric(float64(c.treeKiB)/1024, key+"-peak-tree-rss-MiB")
	b.ReportMetric(perReqKiB, key+"-peak-KiB-per-waiting-request")
	absolute("sizing, "+what+": wall", "s", c.wall.Seconds(), 0)
	absolute("sizing, "+what+": the plugin's CPU per request", "ms", perReqCPU, 0)
	absolute("sizing, "+what+": its commands' CPU per volume", "ms", perVolChildren, 0)
	absolute("sizing, "+what+": the plugin's peak resident memory", "MiB", float64(c.peakKiB)/1024, 0)
	absolute("sizing, "+what+": peak of the plugin and its commands", "MiB", float64(c.treeKiB)/1024, 0)
	note(fmt.Sprintf("sizing, %s: %.0f requests, up to %d waiting at once; the plugin resident %.1f MiB before, %.1f MiB at its peak: "+
		"%.1f KiB more per request waiting; CPU %.0f ms the plugin's, %.0f ms its commands'", what, requests, c.volumes,
		float64(c.beforeKiB)/1024, float64(c.peakKiB)/1024, perReqKiB, ms(c.cpu), ms(c.children)))
}

// cpuTimes reads a process's own CPU time (utime+stime) and that of its
// children it waited for (cutime+cstime), from /proc/<pid>/stat.
func cpuTimes(b *testing.B, pid int) (own, children time.Duration) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses: state
	// is field 3, utime 14, stime 15, cutime 16, cstime 17.
	f := strings.Fields(string(raw[bytesLastIndex(raw, ')')+2:]))
	if len(f) < 15 {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	tick := func(i int) time.Duration {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat field %d: %v", pid, i+3, err)
		}
		return time.Duration(n) * time.Second / 100
	}
	return tick(11) + tick(12), tick(13) + tick(14)
}

// resetPeak sets the process's VmHWM to its current resident memory
// (proc(5), clear_refs).
func resetPeak(b *testing.B, pid int) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		b.Fatalf("resetting the peak resident memory: %v", err)
	}
}

// peakRSS reads the process's VmHWM in KiB.
func peakRSS(pid int) int { return statusKiB(pid, "VmHWM") }

// statusKiB reads a "<field>: <n> kB" line of /proc/<pid>/status; 0 when
// the process is gone (a command that ended meanwhile).
func statusKiB(pid int, field string) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range splitLines(string(raw)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return n
		}
	}
	return 0
}

// treeRSS is the resident memory of the process and of every process it
// started (through each of its threads), and theirs, in KiB.
func treeRSS(pid int) int {
	total := statusKiB(pid, "VmRSS")
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, c := range strings.Fields(string(raw)) {
			if child, err := strconv.Atoi(c); err == nil {
				total += treeRSS(child)
			}
		}
	}
	return total
}

// goFigures reads the Go heap in use (bytes) and the OS threads from the
// plugin's metrics.
func goFigures(b *testing.B, p plugin) (heap, threads float64) {
	v := metricValues(p, "go_memstats_heap_inuse_bytes", "go_threads")
	return v[0], v[1]
}

// The cluster BenchmarkControllerSizing gives converge-controller's
// node-loss watcher: controllerVolumes converge volumes (a PV and its
// claim, each used by a StatefulSet's pod), on controllerNodes nodes,
// among controllerPods pods in all.
const (
	controllerNodes   = 100
	controllerVolumes = 1000
	controllerPods    = 10000
)

// BenchmarkControllerSizing measures converge-controller for the Sizing
// section of docs/operations.md, without a cluster:
//
//   - the real binary (cmd/converge-controller), started with a kubeconfig
//     whose API server does not answer, so that it caches nothing and
//     retries its election: its resident memory after 5 s, what the Go
//     runtime, client-go and the process itself take;
//   - in this process, its node-loss watcher (pkg/nodeloss, what the
//     leader runs) over a fake clientset holding controllerNodes nodes,
//     controllerVolumes volumes and their pods, then the same among
//     controllerPods pods: the Go heap its caches hold once filled (after
//     a garbage collection; pods are kept slimmed to what a pass reads,
//     everything else whole), and how long one pass over them takes (it
//     reads the caches and decides; with every node there it acts on
//     nothing), on one CPU: its CPU time.
//
// The snapshot labeller's caches (the driver's snapshot contents) are not
// in it.
func BenchmarkControllerSizing(b *testing.B) {
	for b.Loop() {
		rss := controllerBaseline(b)
		b.ReportMetric(float64(rss)/1024, "controller-idle-rss-MiB")
		absolute("sizing: converge-controller with nothing cached, resident memory", "MiB", float64(rss)/1024, 0)

		// The volumes' own pods alone, then among controllerPods: the
		// difference is what the other pods cost.
		var caches []float64
		for _, pods := range []int{controllerVolumes, controllerPods} {
			mib, pass := controllerWatcher(b, pods)
			caches = append(caches, mib)
			b.ReportMetric(mib, fmt.Sprintf("controller-caches-%d-pods-MiB", pods))
			b.ReportMetric(pass, fmt.Sprintf("controller-pass-%d-pods-ms", pods))
			absolute(fmt.Sprintf("sizing: converge-controller's caches of %d nodes, %d volumes (PV and claim) and %d pods", controllerNodes, controllerVolumes, pods), "MiB", mib, 0)
			absolute(fmt.Sprintf("sizing: converge-controller's pass over them (read the caches, decide), median of 20, %d pods", pods), "ms", pass, 0)
		}
		perPod := 1024 * (caches[1] - caches[0]) / float64(controllerPods-controllerVolumes)
		b.ReportMetric(perPod, "controller-KiB-per-pod")
		absolute("sizing: converge-controller's cache per pod (slimmed)", "KiB", perPod, 0)
	}
}

// controllerWatcher runs the node-loss watcher over a fake clientset
// holding BenchmarkControllerSizing's cluster with pods pods, and returns
// the Go heap (MiB) its caches hold once filled, and the median time of
// a pass over them (ms).
func controllerWatcher(b *testing.B, pods int) (cachesMiB, passMs float64) {
	client := fake.NewClientset(controllerCluster(pods)...)
	heap0 := liveHeap()
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watcher := nodeloss.New(nodeloss.Config{Client: client, Driver: contract.DefaultDriverName, TopologyKey: contract.TopologyKey,
		Grace: 10 * time.Minute, Resync: time.Hour, Events: record.NewFakeRecorder(1000), Metrics: nodeloss.NewMetrics(reg)})
	done := make(chan struct{})
	go func() {
		defer close(done)
		watcher.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	// Its first pass comes once every cache is filled.
	for deadline := time.Now().Add(time.Minute); counter(b, reg, "converge_controller_passes_total") < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the node-loss watcher made no pass in a minute")
		}
	}
	heap1 := liveHeap()
	// The passes the caches' filling asked for are over by now; with
	// every node there, a pass changes nothing, so these run beside the
	// watcher's idle loop safely.
	time.Sleep(time.Second)
	var took []time.Duration
	for range 20 {
		d, err := timed(func() error {
			_, err := watcher.Pass(ctx)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		took = append(took, d)
	}
	runtime.KeepAlive(client)
	return float64(heap1-heap0) / (1 << 20), ms(quantile(took, 0.5))
}

// controllerBaseline builds converge-controller and runs it against an API
// server that does not answer, and returns its resident memory (KiB) after
// 5 s.
func controllerBaseline(b *testing.B) int {
	dir := b.TempDir()
	bin := filepath.Join(dir, "converge-controller")
	build := exec.Command("go", "build", "-o", bin, "./cmd/converge-controller")
	build.Dir = testenv.Root()
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building converge-controller: %v\n%s", err, out)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// Port 1 of the loopback address: nothing listens, every request is
	// refused at once.
	stub := `apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`
	if err := os.WriteFile(kubeconfig, []byte(stub), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--http-address=", "--leader-election-namespace=default", "--identity=bench")
	log, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	time.Sleep(5 * time.Second)
	rss := statusKiB(cmd.Process.Pid, "VmRSS")
	if rss == 0 {
		b.Fatalf("converge-controller ended early; its log is %s", log.Name())
	}
	return rss
}

// liveHeap is the Go heap in use after a garbage collection, in bytes.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// counter reads a counter's value from reg (0 when it has none).
func counter(b *testing.B, reg *prometheus.Registry, name string) float64 {
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// controllerCluster makes the objects of BenchmarkControllerSizing's
// cluster with pods pods (the first controllerVolumes of them use the
// volumes), as a cluster's API server holds them (a node with its status,
// images and conditions; a pod with two containers, their environment and
// status).
func controllerCluster(pods int) []k8sruntime.Object {
	var objs []k8sruntime.Object
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "converge", UID: "class"}, Provisioner: contract.DefaultDriverName,
		Parameters: map[string]string{contract.ProvisioningKey: "thick"}}
	objs = append(objs, class)
	for i := range controllerNodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%03d", i), UID: types.UID(fmt.Sprintf("node-%d", i)),
			Labels: map[string]string{"kubernetes.io/hostname": fmt.Sprintf("node-%03d", i), contract.TopologyKey: fmt.Sprintf("node-%03d", i),
				"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m5.xlarge"}},
			Status: corev1.NodeStatus{
				Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")},
				Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3800m"), corev1.ResourceMemory: resource.MustParse("15Gi")},
				Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250)}, {Type: corev1.NodeHostName, Address: fmt.Sprintf("node-%03d", i)}},
				NodeInfo:    corev1.NodeSystemInfo{KernelVersion: "6.18.0", OSImage: "Debian GNU/Linux 13", ContainerRuntimeVersion: "containerd://2.1.0", KubeletVersion: "v1.37.2"},
			}}
		for _, t := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeReady} {
			status := corev1.ConditionFalse
			if t == corev1.NodeReady {
				status = corev1.ConditionTrue
			}
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: t, Status: status, Reason: "Kubelet" + string(t), Message: "kubelet reports " + string(t)})
		}
		for j := range 20 {
			n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{fmt.Sprintf("registry.example/team/image-%02d@sha256:%064d", j, j), fmt.Sprintf("registry.example/team/image-%02d:v1.%d", j, j)}, SizeBytes: 50 << 20})
		}
		objs = append(objs, n)
	}
	sets := controllerVolumes / 10
	for i := range sets {
		s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("db-%03d", i), Namespace: "apps", UID: types.UID(fmt.Sprintf("set-%d", i))},
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](10), VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}}}}
		objs = append(objs, s)
	}
	for i := range pods {
		node := fmt.Sprintf("node-%03d", i%controllerNodes)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%05d", i), Namespace: "apps", UID: types.UID(fmt.Sprintf("pod-%d", i)),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%50), "pod-template-hash": "5d4f8c7b9"}},
			Spec: corev1.PodSpec{NodeName: node}}
		for c := range 2 {
			ctr := corev1.Container{Name: fmt.Sprintf("c%d", c), Image: fmt.Sprintf("registry.example/team/image-%02d:v1.%d", i%20, i%20),
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}}
			for e := range 10 {
				ctr.Env = append(ctr.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", e), Value: fmt.Sprintf("value-%d-%d", i, e)})
			}
			pod.Spec.Containers = append(pod.Spec.Containers, ctr)
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: ctr.Name, Image: ctr.Image, Ready: true,
				ImageID: fmt.Sprintf("registry.example/team/image@sha256:%064d", i%20), ContainerID: fmt.Sprintf("containerd://%064d", i*2+c)})
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}})
		if i < controllerVolumes {
			set, ordinal := i/10, i%10
			pod.Name = fmt.Sprintf("db-%03d-%d", set, ordinal)
			claimName := fmt.Sprintf("data-db-%03d-%d", set, ordinal)
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: fmt.Sprintf("db-%03d", set), UID: types.UID(fmt.Sprintf("set-%d", set)), Controller: ptr.To(true)}}
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}})
			pvName := fmt.Sprintf("pvc-%08d", i)
			handle := pvName + "_" + node
			claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: "apps", UID: types.UID("claim-" + pvName),
				Annotations: map[string]string{"volume.kubernetes.io/selected-node": node, "volume.kubernetes.io/storage-provisioner": contract.DefaultDriverName,
					"pv.kubernetes.io/bind-completed": "yes"}, Finalizers: []string{"kubernetes.io/pvc-protection"}},
				Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("converge"), VolumeName: pvName, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}},
				Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}}
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName, UID: types.UID("pv-" + pvName),
				Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": contract.DefaultDriverName}, Finalizers: []string{"kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"}},
				Spec: corev1.PersistentVolumeSpec{StorageClassName: "converge", Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
					ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "apps", Name: claimName, UID: claim.UID},
					PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: contract.DefaultDriverName, VolumeHandle: handle, FSType: "ext4",
						VolumeAttributes: map[string]string{contract.OnNodeLossKey: "retain", "storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-1234-converge.csi.dev"}}},
					NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: contract.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}},
				Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
			objs = append(objs, claim, pv)
		}
		pod.Status.Phase = corev1.PodRunning
		for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue})
		}
		objs = append(objs, pod)
	}
	return objs
}

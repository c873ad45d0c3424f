package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/test/e2e/invariants"
	"github.com/converge-csi/converge/test/e2e/standin"
)

// converge runs on every node as deploy/'s DaemonSet, installed as a user
// installs it: kubectl apply -k of a kustomization of the run's own that
// names deploy/ as shipped and its snapshots component, and changes only
//   - the images (images:): csi-node's is the one built from the
//     Dockerfile (csiimage.go); node-driver-registrar's is its stand-in's
//     (package standin); csi-provisioner, csi-resizer and csi-snapshotter
//     keep deploy/'s names, under which the run's images hold the releases
//     built from their modules (sidecars.go), and take those releases'
//     tags, so that an older deploy/ (TestUpgradeAndRollback's) runs them
//     too;
//   - csi-node's arguments, five appended (installArgs).
// The DaemonSet controller puts a pod on each node as it joins; the
// kubelet runs its containers in the node's containerd, and registers
// the driver through the registrar's socket.

const (
	daemonSetName      = "converge-node"
	daemonSetNamespace = "kube-system"
	daemonSetLabel     = "app.kubernetes.io/name=" + daemonSetName
	// nodeAgentName is deploy/'s DaemonSet of the node agent, beside
	// converge-node on every node in a pod of its own (its own, read-only
	// account): its one container is nodeAgentContainer.
	nodeAgentName      = "converge-node-agent"
	nodeAgentLabel     = "app.kubernetes.io/name=" + nodeAgentName
	nodeAgentContainer = "node-agent"
	// maxVolumesPerNode is csi-node's --max-volumes: the storage suite's
	// volumeLimits tests read it from every CSINode. Far more than the
	// suite's parallel tests use on a node at once.
	maxVolumesPerNode = 32
	// fastPool is the storage pool that only the first node has (an xfs
	// that clones by reflink, cluster.go), of fastPoolSize bytes, of
	// which it promises thin volumes fastPoolRatio times over (the storage
	// suite's snapshot tests in the pool make many volumes at once, and
	// write little to them).
	fastPool      = "fast"
	fastPoolSize  = 4 << 30
	fastPoolRatio = 4
)

// testPoolGuard is the guard of the run's default pool. Its nodes' kubelet
// and state directories lie on the test machine's own disk, where the
// default guard there (20%, to keep a real kubelet from evicting pods)
// would refuse the suite's volumes whenever the machine's disk is more
// than four-fifths full with things of its own; the run's kubelets never
// evict (their thresholds are off).
const testPoolGuard = "5%"

// installArgs are the arguments the run adds to csi-node's in deploy/:
// every call logged (-v=4: the suite reads the kubelet's calls from
// csi-node's log, calls.go), a volume's health for the kubelet in both of
// its forms (VolumeHealth for the v1.37 kubelet, VolumeCondition for
// older ones; TestVolumeConditionReachesThePod), a volume limit, the pool fast,
// which only the first node has (TestTwoNodesPoolSteersScheduling), and
// the default pool's guard (testPoolGuard). ModifyVolume, on by default,
// is left as deploy/ leaves it.
var installArgs = []string{"-v=4", "--feature-gates=VolumeCondition=true,VolumeHealth=true", "--max-volumes=" + strconv.Itoa(maxVolumesPerNode),
	"--pool-guard=" + testPoolGuard,
	"--pool=" + fastPool + "=" + nodePoolsDir + "/" + fastPool + ",ratio=" + strconv.Itoa(fastPoolRatio)}

// installArgsFor is installArgs for csi-node's image of tag. A run of
// make compare, which puts a hundred claims on a node and runs no storage
// suite, lifts the volume limit.
func installArgsFor(tag string) []string {
	args := slices.Clone(installArgs)
	for i, a := range args {
		if *compareFull && strings.HasPrefix(a, "--max-volumes=") {
			args[i] = "--max-volumes=0"
		}
	}
	return args
}

// controllerName is deploy/'s converge-controller Deployment. The run
// keeps its arguments as deploy/ gives them: TestTwoNodesNodeDeletedByMistake
// brings a deleted node back within deploy/'s --deleted-node-grace, and
// TestTwoNodesNodeLoss releases through the out-of-service taint, which
// waits for no grace.
const controllerName = "converge-controller"

// installPoolsRoot is what the run adds to deploy/'s DaemonSet for its
// pools, as deploy/'s commented example says: the pools' root mounted into
// csi-node's container.
var installPoolsRoot = []struct{ path, value string }{
	{"/spec/template/spec/containers/0/volumeMounts/-", `{"name": "pools", "mountPath": "` + nodePoolsDir + `", "mountPropagation": "HostToContainer"}`},
	{"/spec/template/spec/volumes/-", `{"name": "pools", "hostPath": {"path": "` + nodePoolsDir + `", "type": "DirectoryOrCreate"}}`},
}

// installKustomizations are the run's kustomizations of deploy/, which
// lies at fromBase relative to base and at fromTop relative to top: base
// changes csi-node's arguments (deploy/'s first container, which the
// patch checks by name), and top,
// which names base, adds the snapshots component and sets the images, as
// a user's overlay would, csi-node's image the one built here.
func installKustomizations(fromBase, fromTop string) (base, top string) {
	return installKustomizationsOf(fromBase, fromTop, csiNodeImageTag)
}

// installKustomizationsOf is installKustomizations with csi-node's image
// of tag (a previous release's, upgrade_test.go).
func installKustomizationsOf(fromBase, fromTop, tag string) (base, top string) {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
patches:
  - target:
      kind: DaemonSet
      name: %s
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/name
        value: csi-node
`, fromBase, daemonSetName)
	for _, a := range installArgsFor(tag) {
		fmt.Fprintf(&b, "      - op: add\n        path: /spec/template/spec/containers/0/args/-\n        value: %q\n", a)
	}
	for _, op := range installPoolsRoot {
		fmt.Fprintf(&b, "      - op: add\n        path: %s\n        value: %s\n", op.path, op.value)
	}
	base = b.String()
	b.Reset()
	fmt.Fprintf(&b, `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - base
components:
  - %s/components/snapshots
images:
  - name: ghcr.io/converge-csi/csi-node
    newName: %s
    newTag: %s
`, fromTop, csiNodeImageName, tag)
	for _, s := range standin.Releases {
		name, _, _ := strings.Cut(standInImage(s), ":")
		fmt.Fprintf(&b, "  - name: %s\n    newName: %s\n", s.Image, name)
	}
	for _, s := range sidecars {
		fmt.Fprintf(&b, "  - name: %s\n    newTag: %s\n", sidecarRepo+s.name, s.version)
	}
	return base, b.String()
}

// installDriver applies the run's kustomizations of deploy/ and waits for
// the first node's pods: converge's and its node agent's.
func (c *cluster) installDriver(ctx context.Context) error {
	if err := c.applyDeploy(ctx, filepath.Join(c.dir, "install"), filepath.Join(c.repo, "deploy"), csiNodeImageTag); err != nil {
		return err
	}
	if err := c.kubeNode.waitDriver(ctx); err != nil {
		return err
	}
	return c.kubeNode.waitAgent(ctx)
}

// applyDeploy writes the run's kustomizations (installKustomizationsOf) of
// the deploy/ directory deploy, with csi-node's image of tag, into dir
// and applies them, without waiting for the pods.
func (c *cluster) applyDeploy(ctx context.Context, dir, deploy, tag string) error {
	if err := os.MkdirAll(filepath.Join(dir, "base"), 0o755); err != nil {
		return err
	}
	fromBase, err := filepath.Rel(filepath.Join(dir, "base"), deploy)
	if err != nil {
		return err
	}
	fromTop, err := filepath.Rel(dir, deploy)
	if err != nil {
		return err
	}
	base, top := installKustomizationsOf(fromBase, fromTop, tag)
	if err := os.WriteFile(filepath.Join(dir, "base", "kustomization.yaml"), []byte(base), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(top), 0o644); err != nil {
		return err
	}
	_, err = c.kubectl(ctx, "apply", "-k", dir)
	return err
}

// driverPod is the node's converge pod that is not being deleted, or nil.
func (n *kubeNode) driverPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := n.c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: daemonSetLabel, FieldSelector: "spec.nodeName=" + n.node})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, nil
}

// waitDriver waits for the node's converge pod to be Ready, with every
// container, and for the node's CSINode to list the driver.
func (n *kubeNode) waitDriver(ctx context.Context) error {
	return waitFor(ctx, 2*time.Minute, n.kubelet, func() error {
		pod, err := n.driverPod(ctx)
		if err != nil {
			return err
		}
		if pod == nil {
			return fmt.Errorf("no %s pod on %s yet", daemonSetName, n.node)
		}
		if !podReady(pod) {
			return fmt.Errorf("pod %s not Ready: %s", pod.Name, containerStates(pod))
		}
		if !n.driverRegistered() {
			return fmt.Errorf("CSINode %s does not list %s", n.node, contract.DefaultDriverName)
		}
		return nil
	})
}

// waitAgent waits for the node's node agent pod (DaemonSet nodeAgentName,
// beside the converge pod) to be Ready: a test that switches a claim's
// class on a node that just joined needs its agent. Only deploy/ of the
// code under test has the agent (a previous release's has none).
func (n *kubeNode) waitAgent(ctx context.Context) error {
	return waitFor(ctx, 2*time.Minute, n.kubelet, func() error {
		pods, err := n.c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: nodeAgentLabel, FieldSelector: "spec.nodeName=" + n.node})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.DeletionTimestamp == nil && podReady(p) {
				return nil
			}
		}
		if len(pods.Items) == 0 {
			return fmt.Errorf("no %s pod on %s yet", nodeAgentName, n.node)
		}
		return fmt.Errorf("pod %s not Ready: %s", pods.Items[0].Name, containerStates(&pods.Items[0]))
	})
}

// podReady reports whether the pod's Ready condition is true.
func podReady(pod *corev1.Pod) bool {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containerStates describes each container of pod, to explain a wait.
func containerStates(pod *corev1.Pod) string {
	var out []string
	for _, s := range pod.Status.ContainerStatuses {
		state := "waiting"
		switch {
		case s.State.Running != nil:
			state = "running"
		case s.State.Terminated != nil:
			state = fmt.Sprintf("terminated (%s, exit %d)", s.State.Terminated.Reason, s.State.Terminated.ExitCode)
		case s.State.Waiting != nil:
			state = fmt.Sprintf("waiting (%s: %s)", s.State.Waiting.Reason, s.State.Waiting.Message)
		}
		out = append(out, fmt.Sprintf("%s %s ready=%v restarts=%d", s.Name, state, s.Ready, s.RestartCount))
	}
	return strings.Join(out, "; ")
}

// containerLogs are the log files of the named container of the node's
// converge pods (the node agent's, for nodeAgentContainer), oldest
// first: the kubelet keeps one per run of the container (<restarts>.log)
// while its pod exists.
func (n *kubeNode) containerLogs(container string) []string {
	// <namespace>_<pod>_<uid>: the node pods' names start with
	// converge-node-, as the agent's do (converge-node-agent-), but hold
	// no container of the agent's name, nor the agent's pods any other.
	prefix := daemonSetName
	if container == nodeAgentContainer {
		prefix = nodeAgentName
	}
	dirs, _ := filepath.Glob(filepath.Join(n.dir, "pod-logs", daemonSetNamespace+"_"+prefix+"-*", container))
	type file struct {
		path    string
		created time.Time
		run     int
	}
	var files []file
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil {
			continue
		}
		logs, _ := filepath.Glob(filepath.Join(d, "*.log"))
		for _, l := range logs {
			run, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(l), ".log"))
			if err == nil {
				files = append(files, file{l, fi.ModTime(), run})
			}
		}
	}
	slices.SortFunc(files, func(a, b file) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		return a.run - b.run
	})
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.path
	}
	return out
}

// containerLogTail is the end of the named container's logs on the node.
func (n *kubeNode) containerLogTail(container string, lines int) string {
	logs := n.containerLogs(container)
	if len(logs) == 0 {
		return "(no log of " + container + ")"
	}
	return tailFile(logs[len(logs)-1], lines)
}

// killContainer kills the named container of the node's converge pod with
// SIGKILL, as when it crashes, and returns its restart count before. The
// kill of a container whose liveness probe is an HTTP GET (csi-node's) may
// meet one probe before the kubelet sees the container end
// (invariants.KilledLiveness).
func (n *kubeNode) killContainer(ctx context.Context, t interface{ Name() string }, container string) (int32, error) {
	pod, err := n.driverPod(ctx)
	if err != nil || pod == nil {
		return 0, fmt.Errorf("the converge pod of %s: %v", n.node, err)
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name != container {
			continue
		}
		id := strings.TrimPrefix(s.ContainerID, "containerd://")
		if container == "csi-node" {
			intendDriverRestart(pod)
		} else {
			intendRestart(pod, container)
		}
		if port, ok := livenessPort(pod, container); ok {
			expect(invariants.KilledLiveness("Pod/"+pod.Namespace+"/"+pod.Name, port, t.Name()))
		}
		if out, err := n.ctr("tasks", "kill", "-s", "SIGKILL", id); err != nil {
			return 0, fmt.Errorf("kill %s: %v: %s", container, err, out)
		}
		return s.RestartCount, nil
	}
	return 0, fmt.Errorf("pod %s has no container %s", pod.Name, container)
}

// livenessPort is the port of the named container's liveness probe, when
// it is an HTTP GET: a number, or the name of one of the container's ports.
func livenessPort(pod *corev1.Pod, container string) (int32, bool) {
	for _, c := range pod.Spec.Containers {
		if c.Name != container || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil {
			continue
		}
		port := c.LivenessProbe.HTTPGet.Port
		if port.Type == intstr.Int {
			return port.IntVal, true
		}
		for _, p := range c.Ports {
			if p.Name == port.StrVal {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// waitRestarted waits for the named container of the node's converge pod
// to have restarted more than before times, and for the pod to be Ready
// and the driver registered again.
func (n *kubeNode) waitRestarted(ctx context.Context, container string, before int32) error {
	return waitFor(ctx, 2*time.Minute, nil, func() error {
		pod, err := n.driverPod(ctx)
		if err != nil || pod == nil {
			return fmt.Errorf("the converge pod of %s: %v", n.node, err)
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.Name == container && s.RestartCount <= before {
				return fmt.Errorf("%s restarted %d times, want more than %d", container, s.RestartCount, before)
			}
		}
		if !podReady(pod) || !n.driverRegistered() {
			return fmt.Errorf("pod %s: ready %v, registered %v: %s", pod.Name, podReady(pod), n.driverRegistered(), containerStates(pod))
		}
		return nil
	})
}

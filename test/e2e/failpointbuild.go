package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/test/e2e/invariants"
	"github.com/converge-csi/converge/test/testenv/failpoints"
)

// The soak's failpoints (issue 71): converge's node DaemonSet, as deploy/
// installed it, rolled onto a csi-node built with the source's failpoints
// made code (package test/testenv/failpoints), whose gofail endpoint the
// test process arms on each node (armFailpoint), and rolled back.
//   - The binary, static as the image's own, is copied into the run's
//     directory, which every node's mount namespace sees (a copy of the
//     host's, nodens.go, taken once the run's directory existed: a file
//     written there later is seen too, a mount made later would not be),
//     and mounted read-only into csi-node's container from there by a
//     hostPath volume at failpointMount. The container's command is that
//     binary, its arguments deploy/'s and the run's as they were.
//   - The image's csi-node stays where it was: what a test runs in the
//     container (kubectl exec ... csi-node gc, docs/operations.md) runs
//     that one, which links no gofail runtime. A second process of the
//     failpoint build would inherit GOFAIL_HTTP and, finding its port
//     taken, exit at once.
//   - GOFAIL_HTTP is :failpointPort in the pod's own network: deploy/'s pod
//     is not hostNetwork. The test process dials the pod's IP from the
//     node's network namespace, as the kubelet's probes do (each pod has
//     the node's route back, ./cni).

const (
	// failpointPort is gofail's HTTP endpoint in the converge pod's
	// network, beside csi-node's (9810) and node-driver-registrar's
	// (9809), which nothing else in the pod uses.
	failpointPort = 9811
	// failpointMount is where csi-node's container finds the failpoint
	// build, and failpointVolume the pod's volume that holds it.
	failpointMount  = "/converge-failpoints"
	failpointVolume = "converge-failpoints"
	// failpointTags are the build tags of the failpoint build: testenv's
	// BuildTags (lockorder), so that the soak checks csi-node's lock
	// order too, as the fault tests' csi-node does, and the two share one
	// cached build.
	failpointTags = "lockorder"
)

// useFailpointBuild rolls the converge DaemonSet onto a csi-node built
// with its failpoints (built and cached first, failpoints.Build), waits
// for every node's pod to be replaced and Ready with the driver
// registered, and returns the build's failpoints' names and restore, which puts the DaemonSet's pod
// template back as it was and waits the same way. A rollout replaces
// pods and restarts no container of theirs (the new pods' restart counts
// start at 0, under new UIDs), as TestDriverRollingUpdate does under the
// run's invariants: the restarts to mark as intended are the crashes the
// failpoints cause, which armFailpoint marks. If the DaemonSet already
// runs the failpoint build, it is an error.
func (c *cluster) useFailpointBuild(ctx context.Context, t *testing.T) (names []string, restore func() error, err error) {
	bin, fps, err := failpoints.Build(c.repo, failpointTags)
	if err != nil {
		return nil, nil, err
	}
	for _, fp := range fps {
		names = append(names, fp.Name)
	}
	dir := filepath.Join(c.dir, "failpoints")
	if err := installExecutable(bin, filepath.Join(dir, "csi-node")); err != nil {
		return nil, nil, err
	}
	var orig *corev1.PodTemplateSpec
	err = c.rollDriver(ctx, func(ds *appsv1.DaemonSet) error {
		orig = ds.Spec.Template.DeepCopy()
		return withFailpoints(&ds.Spec.Template, dir)
	})
	if err != nil {
		// The rollout may have begun: the tests after this one must not
		// run on the failpoint build.
		if orig != nil {
			if back := c.rollDriver(ctx, func(ds *appsv1.DaemonSet) error { ds.Spec.Template = *orig.DeepCopy(); return nil }); back != nil {
				err = fmt.Errorf("%w; rolling back: %v", err, back)
			}
		}
		return nil, nil, fmt.Errorf("rolling %s onto the failpoint build: %w", daemonSetName, err)
	}
	t.Logf("converge's pods run csi-node with %d failpoints (%s), gofail on each pod's port %d", len(fps), bin, failpointPort)
	return names, func() error {
		err := c.rollDriver(ctx, func(ds *appsv1.DaemonSet) error {
			ds.Spec.Template = *orig.DeepCopy()
			return nil
		})
		if err != nil {
			return fmt.Errorf("rolling %s back from the failpoint build: %w", daemonSetName, err)
		}
		return nil
	}, nil
}

// withFailpoints points the csi-node container of tmpl at the failpoint
// build in the host directory dir, with gofail's endpoint on
// failpointPort. A template without a csi-node container, or already
// pointed there, is an error.
func withFailpoints(tmpl *corev1.PodTemplateSpec, dir string) error {
	spec := &tmpl.Spec
	i := slices.IndexFunc(spec.Containers, func(ctr corev1.Container) bool { return ctr.Name == "csi-node" })
	if i < 0 {
		return fmt.Errorf("the pod template has no csi-node container")
	}
	if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == failpointVolume }) {
		return fmt.Errorf("the pod template already runs the failpoint build")
	}
	ctr := &spec.Containers[i]
	ctr.Command = []string{failpointMount + "/csi-node"}
	ctr.Env = append(ctr.Env, corev1.EnvVar{Name: "GOFAIL_HTTP", Value: ":" + strconv.Itoa(failpointPort)})
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: failpointVolume, MountPath: failpointMount, ReadOnly: true})
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: failpointVolume, VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectory)}}})
	return nil
}

// rollDriver changes the converge DaemonSet with change (retried on a
// conflict with another writer) and waits for its rollout: every node's
// converge pod of before replaced by a new one, Ready, the driver
// registered again.
func (c *cluster) rollDriver(ctx context.Context, change func(*appsv1.DaemonSet) error) error {
	olds, err := c.driverPodUIDs(ctx)
	if err != nil {
		return err
	}
	dss := c.client.AppsV1().DaemonSets(daemonSetNamespace)
	var generation int64
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds, err := dss.Get(ctx, daemonSetName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := change(ds); err != nil {
			return err
		}
		ds, err = dss.Update(ctx, ds, metav1.UpdateOptions{})
		if err == nil {
			generation = ds.Generation
		}
		return err
	})
	if err != nil {
		return err
	}
	return c.waitRolledOut(ctx, generation, olds)
}

// driverPodUIDs are the UIDs of the nodes' converge pods, by node; a node
// without one is left out.
func (c *cluster) driverPodUIDs(ctx context.Context) (map[string]types.UID, error) {
	olds := map[string]types.UID{}
	for _, n := range c.nodes {
		p, err := n.driverPod(ctx)
		if err != nil {
			return nil, fmt.Errorf("the converge pod of %s: %w", n.node, err)
		}
		if p != nil {
			olds[n.node] = p.UID
		}
	}
	return olds, nil
}

// waitRolledOut waits for the converge DaemonSet to have rolled out its
// generation, and for each node of olds to run a converge pod other than
// its old one, Ready, with the driver registered. The DaemonSet replaces
// one pod at a time (deploy/'s maxUnavailable 1): two minutes a node.
func (c *cluster) waitRolledOut(ctx context.Context, generation int64, olds map[string]types.UID) error {
	return waitFor(ctx, time.Duration(len(olds)+1)*2*time.Minute, nil, func() error {
		ds, err := c.client.AppsV1().DaemonSets(daemonSetNamespace).Get(ctx, daemonSetName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberAvailable != st.DesiredNumberScheduled {
			return fmt.Errorf("%s generation %d: observed %d, %d of %d pods updated, %d available", daemonSetName, generation,
				st.ObservedGeneration, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable)
		}
		for _, n := range c.nodes {
			old, ok := olds[n.node]
			if !ok {
				continue
			}
			p, err := n.driverPod(ctx)
			switch {
			case err != nil:
				return err
			case p == nil || p.UID == old:
				return fmt.Errorf("the converge pod of %s not replaced yet", n.node)
			case !podReady(p):
				return fmt.Errorf("pod %s not Ready: %s", p.Name, containerStates(p))
			case !n.driverRegistered():
				return fmt.Errorf("pod %s Ready, the driver not registered on %s", p.Name, n.node)
			}
		}
		return nil
	})
}

// installExecutable copies the file from to to, mode 0755, making to's
// directory. The copy is written beside to and renamed over it: a
// process that runs an earlier copy keeps running it.
func installExecutable(from, to string) error {
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(to), "."+filepath.Base(to)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), to)
}

// armFailpoint sets the failpoint name of the node's csi-node to term
// (gofail's terms: `1*panic("soak")` panics the first time the failpoint
// is reached, `1*sleep(1000)` sleeps there a second, once), through
// gofail's endpoint; a failpoint already armed takes the new term. A
// term that panics may crash csi-node (where no recover() of converge's
// contains it, as the gRPC handlers' and the reconciler's actions' do),
// so its pod's restarts, csi-node's and its sidecars', are marked as
// intended, and the refused liveness probe a crash may meet expected. The
// error of a refused connection (csi-node restarting, on this or on an
// earlier failpoint) wraps syscall.ECONNREFUSED, which a caller may
// ignore: the new csi-node has no failpoint armed.
func (n *kubeNode) armFailpoint(name, term string) error {
	pod, err := n.failpointPod()
	if err != nil {
		return err
	}
	if strings.Contains(term, "panic") {
		intendDriverRestart(pod)
		if port, ok := livenessPort(pod, "csi-node"); ok {
			expect(invariants.KilledLiveness("Pod/"+pod.Namespace+"/"+pod.Name, port, "a failpoint's panic"))
		}
	}
	_, err = n.gofail(pod, http.MethodPut, name, term)
	return err
}

// disarmFailpoint clears the failpoint name of the node's csi-node. A
// failpoint that is not armed (never armed, or armed in a csi-node that
// has restarted since) is left so, and that is no error; a refused
// connection is as armFailpoint's.
func (n *kubeNode) disarmFailpoint(name string) error {
	pod, err := n.failpointPod()
	if err != nil {
		return err
	}
	_, err = n.gofail(pod, http.MethodDelete, name, "")
	if errors.Is(err, errFailpointDisabled) {
		return nil
	}
	return err
}

// failpointCount is how many times the node's csi-node has reached the
// failpoint name, armed, since it was armed with its term: a caller that
// wants a crash where a panic would be contained (most of converge's
// failpoints lie in a gRPC handler or a reconciler action, whose panics
// fail the call or the action instead) arms a long sleep, waits for a
// count of 1, and kills csi-node there (killContainer), as the fault
// tests' walk does. A failpoint not armed is errFailpointDisabled.
func (n *kubeNode) failpointCount(name string) (int, error) {
	pod, err := n.failpointPod()
	if err != nil {
		return 0, err
	}
	out, err := n.gofail(pod, http.MethodGet, name+"/count", "")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(out))
}

// errFailpointDisabled is gofail's answer about a failpoint that is not
// armed: to a DELETE a 400, to a GET of its count a 500, each with a body
// that says "failpoint is disabled" (gofail's runtime.ErrDisabled).
var errFailpointDisabled = errors.New("failpoint is disabled")

// failpointPod is the node's converge pod, if it runs the failpoint build
// (useFailpointBuild) and has its IP.
func (n *kubeNode) failpointPod() (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := n.driverPod(ctx)
	if err != nil || pod == nil {
		return nil, fmt.Errorf("the converge pod of %s: %v", n.node, err)
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == failpointVolume }) {
		return nil, fmt.Errorf("pod %s does not run the failpoint build (useFailpointBuild)", pod.Name)
	}
	if pod.Status.PodIP == "" {
		return nil, fmt.Errorf("pod %s has no IP yet", pod.Name)
	}
	return pod, nil
}

// gofail sends method on /name, with body, to gofail's endpoint in pod, a
// converge pod of the node, from the node's network namespace, and
// returns the answer's body. An answer other than 2xx is an error that
// quotes it (errFailpointDisabled for a failpoint not armed).
func (n *kubeNode) gofail(pod *corev1.Pod, method, name, body string) (string, error) {
	addr := net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(failpointPort))
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		// The node's namespaces as they are now: a reboot replaces them
		// under the soak's other events.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			netns, err := liveNodeNetns(n.kubeletDir)
			if err != nil {
				return nil, err
			}
			return dialContextIn(ctx, netns, network, addr)
		},
	}}
	req, err := http.NewRequest(method, "http://"+addr+"/"+name, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("gofail of %s on %s: %w", pod.Name, n.node, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		err := fmt.Errorf("gofail of %s on %s: %s /%s: %s: %s", pod.Name, n.node, method, name, resp.Status, bytes.TrimSpace(b))
		if bytes.Contains(b, []byte(errFailpointDisabled.Error())) {
			err = fmt.Errorf("%w: %v", errFailpointDisabled, err)
		}
		return "", err
	}
	return string(b), nil
}

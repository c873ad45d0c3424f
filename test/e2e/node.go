package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/test/e2e/runs"
)

// The node's side of the cluster: containerd and the kubelet, which runs
// the node's pod of converge's DaemonSet (daemonset.go).

// kubeNode is one node of the cluster, as a machine of its own would be:
// its mount, PID and network namespaces, containerd, kubelet (with its own
// root directory, ports, identity and cgroup root), and
// csi-node's state and data directories, which its pod of the DaemonSet
// mounts.
type kubeNode struct {
	c          *cluster
	node       string // the node's name; resolves to 127.0.0.1
	dir        string // the node's directory
	logs       string // directory of its daemons' logs
	kubeletDir string // the kubelet's root directory, as the test process sees it (nodeKubeletDir on the node)
	stateDir   string // csi-node's state directory, as the test process sees it (nodeStateDir on the node)
	dataDir    string // csi-node's data directory: <stateDir>/volumes
	// poolsDir holds the node's storage pools, a filesystem mounted at
	// <poolsDir>/<name> for each pool the node has (nodePoolsDir on the
	// node).
	poolsDir   string
	identity   string // the kubelet's name in the cluster's PKI
	cgroupRoot string // the kubelet's cgroupRoot: the run's own (runs.CgroupRoot)
	ports      map[string]int
	// kubeletVersion is the release of the node's kubelet: the cluster's
	// (kubernetesVersion) or one of olderKubelets.
	kubeletVersion string

	ns         *nodeNS // the node's mount, PID and network namespaces
	links      *nodeLinks
	address    string // the node's own address in its network (nodenet.go)
	containerd string // containerd's socket

	containerdProc, kubelet *proc
}

// newNode makes the directories of a node called name under dir and the
// cgroup root of its kubelet (of release kubeletVersion, known to the PKI
// as identity), and picks its ports.
func (c *cluster) newNode(name, dir, logs, identity, kubeletVersion string) (*kubeNode, error) {
	if addrs, err := net.LookupHost(name); err != nil || !slices.Contains(addrs, "127.0.0.1") {
		return nil, fmt.Errorf("node name %q must resolve to 127.0.0.1 (the apiserver reaches the kubelet by it), got %v %v", name, addrs, err)
	}
	n := &kubeNode{c: c, node: name, dir: dir, logs: logs, identity: identity, cgroupRoot: runs.CgroupRoot(c.dir, name), kubeletVersion: kubeletVersion,
		kubeletDir: filepath.Join(dir, "kubelet"), stateDir: filepath.Join(dir, "converge"), poolsDir: filepath.Join(dir, "pools")}
	n.dataDir = filepath.Join(n.stateDir, "volumes")
	for _, d := range []string{logs, n.kubeletDir, filepath.Join(n.kubeletDir, "plugins_registry"), n.stateDir, n.poolsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := makeCgroupRoot(n.cgroupRoot); err != nil {
		return nil, err
	}
	n.ports = map[string]int{}
	for _, p := range []string{"kubelet", "kubelet-healthz"} {
		// The kernel may hand a port it just gave back out again.
		for n.ports[p] == 0 || c.portTaken(n.ports[p]) {
			var err error
			if n.ports[p], err = freePort(); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

// image is where the node's csi-node keeps the image of volume handle
// (in the default pool).
func (n *kubeNode) image(handle string) string {
	return filepath.Join(n.dataDir, handle+".img")
}

// makeCgroupRoot makes the cgroup root of a kubelet in every cgroup v1
// hierarchy (the kubelet refuses a root that does not exist). A new cpuset
// cgroup has no CPUs nor memory nodes until it is given its parent's. A
// root that exists is kept.
func makeCgroupRoot(root string) error {
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hierarchies {
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			continue // not a hierarchy
		}
		if filepath.Base(h) == "unified" {
			continue
		}
		d := filepath.Join(h, root)
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(d, f), err)
				}
			}
		}
	}
	return nil
}

// portTaken reports whether a daemon of the cluster was given port.
func (c *cluster) portTaken(port int) bool {
	for _, p := range c.ports {
		if p == port {
			return true
		}
	}
	for _, n := range c.nodes {
		for _, p := range n.ports {
			if p == port {
				return true
			}
		}
	}
	return false
}

// upSteps are the steps that bring the node up, in order, once the
// control plane runs; then the DaemonSet puts converge's pod on it.
func (n *kubeNode) upSteps() []struct {
	name string
	run  func(context.Context) error
} {
	return []struct {
		name string
		run  func(context.Context) error
	}{
		{"node namespaces", n.startNodeNS},
		{"containerd and images", n.startContainerd},
		{"kubelet", n.startKubelet},
	}
}

// installCrictl gives the node a crictl that reaches its containerd, as a
// real node has: the storage suite runs "crictl" on the node through
// HostExec pods (nsenter into the node's mount namespace, with the
// container's PATH), which finds /usr/local/sbin first. A tmpfs there, in
// the node's mount namespace only, holds a crictl that names the node's
// containerd socket; the host's empty /usr/local/sbin is left as it is.
func (n *kubeNode) installCrictl() error {
	if out, err := n.ns.run("mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "converge-e2e-bin", "/usr/local/sbin"); err != nil {
		return fmt.Errorf("mount the node's /usr/local/sbin: %v: %s", err, out)
	}
	wrapper := fmt.Sprintf("#!/bin/sh\nexec %q --runtime-endpoint %q \"$@\"\n", n.c.crictl, "unix://"+n.containerd)
	if err := os.WriteFile(n.ns.path("/usr/local/sbin/crictl"), []byte(wrapper), 0o755); err != nil {
		return err
	}
	if out, err := n.ns.run("/usr/local/sbin/crictl", "version"); err != nil {
		return fmt.Errorf("the node's crictl: %v: %s", err, out)
	}
	return nil
}

// refusedRegistry is where every registry resolves: a loopback port nothing
// listens on, so that a pull of an image that is not here fails at once and
// no request ever leaves the machine.
const refusedRegistry = "http://127.0.0.1:9"

// registries are the registries named explicitly (besides _default, which
// containerd reads for any other): the suite's images come from
// registry.k8s.io, and the others are the ones an image name most often
// names.
var registries = []string{"_default", "registry.k8s.io", "docker.io", "gcr.io", "k8s.gcr.io", "quay.io", "ghcr.io", "mcr.microsoft.com", "public.ecr.aws"}

// startContainerd runs a containerd of the run's own (its own root, state,
// socket, CNI configuration and registry hosts) and imports the locally
// built images.
func (n *kubeNode) startContainerd(ctx context.Context) error {
	if err := n.configureContainerd(ctx); err != nil {
		return err
	}
	if err := n.runContainerd(ctx); err != nil {
		return err
	}
	return n.importImages()
}

// containerdDir is the directory of the node's containerd: its
// configuration, socket, root (which persists, as a machine's
// /var/lib/containerd does), state and runc's state (which a node's
// reboot empties, as a machine's /run).
func (n *kubeNode) containerdDir() string { return filepath.Join(n.dir, "containerd") }

// configureContainerd writes the node's containerd configuration, its CNI
// plugin and configuration, and its registry hosts. Once per node: the
// link to the loopback plugin it makes must not exist yet (a node's
// reboot starts containerd again with runContainerd alone).
func (n *kubeNode) configureContainerd(ctx context.Context) error {
	base := n.containerdDir()
	cni := filepath.Join(n.dir, "cni")
	cniBin := filepath.Join(n.dir, "cni-bin")
	hosts := filepath.Join(n.dir, "registry-hosts")
	for _, d := range []string{base, cni, cniBin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := n.installCNI(ctx, cni, cniBin); err != nil {
		return err
	}
	if err := writeRegistryHosts(hosts); err != nil {
		return err
	}
	n.containerd = filepath.Join(base, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # No CAP_SYS_RESOURCE here: runc cannot lower a sandbox's oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
`, filepath.Join(base, "root"), filepath.Join(base, "state"), n.containerd, filepath.Join(base, "opt"),
		pauseImage, filepath.Join(base, "runc"), cniBin, cni, hosts)
	return os.WriteFile(filepath.Join(base, "config.toml"), []byte(config), 0o644)
}

// installCNI builds the pod network's plugin into cniBin and writes its
// configuration into cni: an eth0 per pod that reaches nothing and adds
// nothing to the host (see ./cni). containerd sets up loopback itself,
// with the loopback plugin of the same directory.
func (n *kubeNode) installCNI(ctx context.Context, cni, cniBin string) error {
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(cniBin, "converge-e2e"), "./cni")
	build.Dir = filepath.Join(n.c.repo, "test", "e2e")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the CNI plugin: %v: %s", err, out)
	}
	if err := os.Symlink("/usr/lib/cni/loopback", filepath.Join(cniBin, "loopback")); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cni, "10-e2e.conflist"),
		[]byte(`{"cniVersion": "1.0.0", "name": "e2e", "plugins": [{"type": "converge-e2e"}]}`+"\n"), 0o644)
}

// writeRegistryHosts writes a hosts.toml for each of registries into
// hosts that sends every pull to refusedRegistry.
func writeRegistryHosts(hosts string) error {
	// containerd 1.6 takes a hosts.toml only with a [host] table; the
	// server is the fallback after the hosts, so both refuse.
	for _, r := range registries {
		if err := os.MkdirAll(filepath.Join(hosts, r), 0o755); err != nil {
			return err
		}
		toml := fmt.Sprintf("server = %q\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", refusedRegistry, refusedRegistry)
		if err := os.WriteFile(filepath.Join(hosts, r, "hosts.toml"), []byte(toml), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// runContainerd starts the node's containerd with the configuration
// configureContainerd wrote, waits until it answers, and gives the node
// its crictl (a tmpfs of the node's mount namespace, made anew in each).
// A node's reboot calls it again: containerd finds its images in its
// root.
func (n *kubeNode) runContainerd(ctx context.Context) error {
	var err error
	n.containerdProc, err = n.ns.start(n.logs, "containerd", "containerd", "--config", filepath.Join(n.containerdDir(), "config.toml"))
	if err != nil {
		return err
	}
	if err := waitFor(ctx, 30*time.Second, n.containerdProc, func() error {
		return exec.Command("ctr", "--address", n.containerd, "version").Run()
	}); err != nil {
		return err
	}
	return n.installCrictl()
}

// importImages builds the suite's images into the node's containerd and
// imports the csi-node image, tagged as the update tests want it too.
func (n *kubeNode) importImages() error {
	images := filepath.Join(n.dir, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return err
	}
	if err := buildImages(images, n.containerd, filepath.Join(n.c.bin, "agnhost"), filepath.Join(n.c.bin, "kubectl"), n.c.sidecarBin); err != nil {
		return err
	}
	if _, err := n.ctr("images", "import", n.c.csiImage); err != nil {
		return fmt.Errorf("importing the csi-node image: %w", err)
	}
	if out, err := n.ctr("images", "tag", "--force", csiNodeImageName+":"+csiNodeImageTag, csiNodeImageName+":"+csiNodeUpdateTag); err != nil {
		return fmt.Errorf("tagging the csi-node image: %v: %s", err, out)
	}
	return nil
}

func (n *kubeNode) startKubelet(ctx context.Context) error {
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
# cgroup v1 and no systemd as PID 1 on this machine kind.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# Otherwise the kubelet adds firewall chains to the host.
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
volumePluginDir: %s
# csi-node logs every call (-v=4), which the tests read from its container's
# log: no rotation during a run.
containerLogMaxSize: 1Gi
# The images are built here and cannot be pulled again.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1%%"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
registerNode: true
nodeStatusUpdateFrequency: 2s
# The kubelet grows a mounted volume's filesystem (NodeExpandVolume) only
# when it next syncs the pod, and nothing but this period brings that sync
# after a claim grows: with the default of 1m, every online expansion test
# waited 60-90 s for it.
syncFrequency: 10s
# How the kubelet learns a volume's health: v1.37 calls NodeGetVolumeHealth
# (csi-node's VolumeHealth feature) every volumeStatsAggPeriod (1m by
# default) and writes the answer into the pod's status.volumeHealth (the
# API server needs the gate too, cluster.go); up to v1.36 it read the
# condition in NodeGetVolumeStats (VolumeCondition) and raised an event.
featureGates:
  CSIVolumeHealth: true
volumeStatsAggPeriod: 10s
`, n.ports["kubelet"], n.ports["kubelet-healthz"], n.containerd,
		filepath.Join(n.dir, "pod-logs"), filepath.Join(n.dir, "volume-plugins"), n.c.pki.path("ca.crt"))
	// The pods' cgroups (<root>/kubepods/...) apart from every other
	// kubelet's on this kernel, another run's or the machine's own (at
	// /kubepods): a kubelet removes the pod cgroups it does not know under
	// its own, and the run's clean-up finds its cgroups by their name.
	config += fmt.Sprintf("cgroupRoot: %s\n", n.cgroupRoot)
	path := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return err
	}
	if err := n.runKubelet(); err != nil {
		return err
	}
	if err := n.waitReady(ctx, 60*time.Second, time.Time{}); err != nil {
		return err
	}
	// The binary run is the release asked for, as it tells the cluster.
	obj, err := n.c.client.CoreV1().Nodes().Get(ctx, n.node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got := obj.Status.NodeInfo.KubeletVersion; got != n.kubeletVersion {
		return fmt.Errorf("node %s reports kubelet %s, want %s", n.node, got, n.kubeletVersion)
	}
	return nil
}

// waitReady waits, up to timeout, until the node's Ready condition is
// true as its kubelet reported it at since or later (a zero since: at any
// time); a kubelet just started reports its status at once. The
// condition a kubelet posted before it stopped stays until the node
// lifecycle controller misses it (40 s), and says nothing of the kubelet
// that runs now.
func (n *kubeNode) waitReady(ctx context.Context, timeout time.Duration, since time.Time) error {
	// The API keeps the heartbeat's time to the second.
	since = since.Truncate(time.Second)
	want := "Ready"
	if !since.IsZero() {
		want += " since " + since.Format(time.TimeOnly)
	}
	return waitFor(ctx, timeout, n.kubelet, func() error {
		obj, err := n.c.client.CoreV1().Nodes().Get(ctx, n.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range obj.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(since) {
				return nil
			}
		}
		return fmt.Errorf("node %s not %s: %v", n.node, want, obj.Status.Conditions)
	})
}

// runKubelet starts the kubelet process with the configuration startKubelet
// wrote; restartKubelet calls it again.
func (n *kubeNode) runKubelet() error {
	bin, err := n.c.kubeletBinary(n.kubeletVersion)
	if err != nil {
		return err
	}
	n.kubelet, err = n.ns.start(n.logs, "kubelet", bin,
		"--config="+filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig="+n.c.pki.path(n.identity+".kubeconfig"),
		"--root-dir="+nodeKubeletDir,
		"--cert-dir="+filepath.Join(n.dir, "kubelet-pki"),
		"--hostname-override="+n.node,
		"--node-ip="+n.address,
		"-v=2",
	)
	return err
}

// startNodeNS sets up the node's namespaces (see nodens.go).
func (n *kubeNode) startNodeNS(context.Context) error {
	var err error
	if n.ns, err = startNodeNS(n.logs, n.kubeletDir, n.stateDir, n.poolsDir); err != nil {
		return err
	}
	n.address = fmt.Sprintf(nodeAddressFormat, slices.Index(n.c.nodes, n)+1)
	if out, err := n.ns.run("ip", "addr", "add", n.address+"/32", "dev", "lo"); err != nil {
		return fmt.Errorf("the node's address: %v: %s", err, out)
	}
	n.links, err = link(n.ns.netns(), n.ports["kubelet"], fmt.Sprintf("127.0.0.1:%d", n.c.ports["apiserver"]))
	return err
}

// driverRegistered reports whether the node's CSINode object lists the
// driver, as the kubelet keeps it while the driver is registered.
func (n *kubeNode) driverRegistered() bool {
	cn, err := n.c.client.StorageV1().CSINodes().Get(context.Background(), n.node, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, d := range cn.Spec.Drivers {
		if d.Name == contract.DefaultDriverName {
			return true
		}
	}
	return false
}

// ctr runs containerd's ctr on the run's containerd, in the kubelet's
// namespace.
func (n *kubeNode) ctr(args ...string) (string, error) {
	out, err := exec.Command("ctr", append([]string{"--address", n.containerd, "-n", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

// restartKubelet stops the kubelet with SIGTERM and starts it again.
func (n *kubeNode) restartKubelet(ctx context.Context) error {
	if err := n.kubelet.stop(30 * time.Second); err != nil {
		return err
	}
	return n.runKubelet()
}

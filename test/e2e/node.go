package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The node's side of the cluster: containerd, the kubelet, and csi-node
// with its registration.

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
func (c *cluster) startContainerd(ctx context.Context) error {
	base := filepath.Join(c.dir, "containerd")
	cni := filepath.Join(c.dir, "cni")
	cniBin := filepath.Join(c.dir, "cni-bin")
	hosts := filepath.Join(c.dir, "registry-hosts")
	for _, d := range []string{base, cni, cniBin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The pod network: an eth0 per pod that reaches nothing and adds
	// nothing to the host (see ./cni). containerd sets up loopback itself,
	// with the loopback plugin of the same directory.
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(cniBin, "converge-e2e"), "./cni")
	build.Dir = filepath.Join(c.repo, "test", "e2e")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the CNI plugin: %v: %s", err, out)
	}
	if err := os.Symlink("/usr/lib/cni/loopback", filepath.Join(cniBin, "loopback")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cni, "10-e2e.conflist"),
		[]byte(`{"cniVersion": "1.0.0", "name": "e2e", "plugins": [{"type": "converge-e2e"}]}`+"\n"), 0o644); err != nil {
		return err
	}
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
	c.containerd = filepath.Join(base, "containerd.sock")
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
`, filepath.Join(base, "root"), filepath.Join(base, "state"), c.containerd, filepath.Join(base, "opt"),
		pauseImage, filepath.Join(base, "runc"), cniBin, cni, hosts)
	cfgPath := filepath.Join(base, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return err
	}
	var err error
	c.containerdProc, err = c.ns.start(c.logs, "containerd", "containerd", "--config", cfgPath)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, 30*time.Second, c.containerdProc, func() error {
		return exec.Command("ctr", "--address", c.containerd, "version").Run()
	}); err != nil {
		return err
	}
	images := filepath.Join(c.dir, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return err
	}
	return buildImages(images, c.containerd, filepath.Join(c.bin, "agnhost"))
}

func (c *cluster) startKubelet(ctx context.Context) error {
	if err := c.saveSysctls(); err != nil {
		return err
	}
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
`, c.ports["kubelet"], c.ports["kubelet-healthz"], c.containerd,
		filepath.Join(c.dir, "pod-logs"), filepath.Join(c.dir, "volume-plugins"), c.pki.path("ca.crt"))
	path := filepath.Join(c.dir, "kubelet.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return err
	}
	if err := c.runKubelet(); err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, c.kubelet, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready: %v", c.node, n.Status.Conditions)
	})
}

// runKubelet starts the kubelet process with the configuration startKubelet
// wrote; restartKubelet calls it again.
func (c *cluster) runKubelet() error {
	var err error
	c.kubelet, err = c.ns.start(c.logs, "kubelet", filepath.Join(c.bin, "kubelet"),
		"--config="+filepath.Join(c.dir, "kubelet.yaml"),
		"--kubeconfig="+c.pki.path("kubelet.kubeconfig"),
		"--root-dir="+nodeKubeletDir,
		"--cert-dir="+filepath.Join(c.dir, "kubelet-pki"),
		"--hostname-override="+c.node,
		"-v=2",
	)
	return err
}

// startCSINode runs csi-node as a host process on the socket the kubelet
// expects and registers it, as node-driver-registrar does.
func (c *cluster) startCSINode(ctx context.Context) error {
	c.csiSock = filepath.Join(c.kubeletDir, "plugins", driverName, "csi.sock")
	if err := os.MkdirAll(filepath.Dir(c.csiSock), 0o755); err != nil {
		return err
	}
	before := 0
	if c.registrar != nil {
		before = c.registrar.registered()
	}
	if err := c.runCSINode(ctx); err != nil {
		return err
	}
	if c.registrar == nil {
		r, err := startRegistrar(c.kubeletDir, driverName, c.nodeCSISock())
		if err != nil {
			return err
		}
		c.registrar = r
	}
	return c.waitRegistered(ctx, before)
}

// nodeCSISock is csi-node's CSI socket as the node sees it.
func (c *cluster) nodeCSISock() string {
	return filepath.Join(nodeKubeletDir, "plugins", driverName, "csi.sock")
}

// startNodeNS sets up the node's namespaces (see nodens.go).
func (c *cluster) startNodeNS(context.Context) error {
	var err error
	c.ns, err = startNodeNS(c.logs, c.kubeletDir)
	return err
}

// runCSINode starts csi-node and waits for its socket to answer.
func (c *cluster) runCSINode(ctx context.Context) error {
	var err error
	c.csiNode, err = c.ns.start(c.logs, "csi-node", c.csiBinary,
		"--endpoint=unix://"+c.nodeCSISock(),
		"--node-id="+c.node,
		"--state-dir="+c.stateDir,
		"--kubelet-dir="+nodeKubeletDir,
		// Every call is logged at -v 4: the suite reads the kubelet's calls
		// from the log.
		"-v=4",
	)
	if err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, c.csiNode, func() error {
		conn, err := net.DialTimeout("unix", c.csiSock, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// waitRegistered waits for the kubelet to register the driver once more
// than before, and for the node's CSINode object to list it.
func (c *cluster) waitRegistered(ctx context.Context, before int) error {
	return waitFor(ctx, 60*time.Second, c.csiNode, func() error {
		if n := c.registrar.registered(); n <= before {
			return fmt.Errorf("registered %d times, want more than %d", n, before)
		}
		if !c.driverRegistered() {
			return fmt.Errorf("CSINode %s does not list %s", c.node, driverName)
		}
		return nil
	})
}

// driverRegistered reports whether the node's CSINode object lists the
// driver, as the kubelet keeps it while the driver is registered.
func (c *cluster) driverRegistered() bool {
	cn, err := c.client.StorageV1().CSINodes().Get(context.Background(), c.node, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, d := range cn.Spec.Drivers {
		if d.Name == driverName {
			return true
		}
	}
	return false
}

// ctr runs containerd's ctr on the run's containerd, in the kubelet's
// namespace.
func (c *cluster) ctr(args ...string) (string, error) {
	out, err := exec.Command("ctr", append([]string{"--address", c.containerd, "-n", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

// restartKubelet stops the kubelet with SIGTERM and starts it again.
func (c *cluster) restartKubelet(ctx context.Context) error {
	if err := c.kubelet.stop(30 * time.Second); err != nil {
		return err
	}
	return c.runKubelet()
}

// killCSINode kills csi-node and its registration with SIGKILL, as when
// the DaemonSet's pod dies: the kubelet loses the driver until it is back.
func (c *cluster) killCSINode() {
	c.csiNode.kill()
	c.registrar.stop()
	c.registrar = nil
}

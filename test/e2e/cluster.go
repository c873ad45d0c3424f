package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/converge-csi/converge/test/e2e/runs"
	polling "github.com/converge-csi/converge/test/testenv/poll"
)

// kubernetesVersion is the release the suite runs; test/e2e/k8s/go.mod pins
// the same one.
const kubernetesVersion = "v1.37.2"

// cluster is a Kubernetes cluster on 127.0.0.1 with converge as its CSI
// driver: one control plane and one node (its embedded kubeNode, whose
// fields and methods the single-node tests use as the cluster's), to which
// the two-node tests join a second (addNode). Everything it writes lives
// under dir, except the Kubernetes binaries, which are cached across runs
// (see kubeBinaries).
type cluster struct {
	*kubeNode
	dir  string // the run's directory; removed by down
	repo string // converge's repository root
	bin  string // directory of the Kubernetes binaries
	logs string // directory of every daemon's log

	pki     *pki
	admin   string // the admin kubeconfig
	client  kubernetes.Interface
	dynamic dynamic.Interface
	// csiImage is the OCI archive of the csi-node image (csiimage.go).
	csiImage string
	// release is the run's release, built in the background
	// (releasefiles.go).
	release *releaseBuild

	etcd, apiserver, controllerManager, scheduler *proc
	// snapshotController is the cluster's.
	snapshotController *proc
	// sidecarDirs are the directories of the sidecars' builds, by name
	// (buildSidecars); guarded by builtMu.
	sidecarDirs map[string]string
	// crictl is the crictl every node has (node.go installCrictl).
	crictl string
	// localPath is local-path-provisioner, while tests use it
	// (localpath.go).
	localPath localPathInstall

	// nodes are the cluster's nodes, the first one first.
	nodes []*kubeNode

	ports    map[string]int
	upPhases []string // how long each phase of up took, for the log
	// built names what the cluster built rather than found in the cache
	// (buildAll's summary); guarded by builtMu.
	built   []string
	builtMu sync.Mutex
	// olderKubelets are the kubelets of olderKubeletsToRun found or built
	// so far, by version (kubeletBinary); guarded by olderKubeletsMu.
	olderKubelets   map[string]string
	olderKubeletsMu sync.Mutex

	// atDownMu guards atDown: the stops of what tests started beside the
	// cluster's daemons (a Prometheus, prometheus.go), which down calls
	// first, the newest first.
	atDownMu sync.Mutex
	atDown   []func()
}

// repoRoot is converge's repository root, found from this file.
func repoRoot() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..")
}

// up brings the cluster up. On error the caller must still call down.
func (c *cluster) up(ctx context.Context) error {
	c.repo = repoRoot()
	// Two runs on one machine share its mount table, loop devices, host
	// paths and kernel tunables, and each one's clean-up undoes the
	// other's: a second run waits its turn instead of breaking the first.
	if others := runs.Live(); len(others) > 0 {
		return fmt.Errorf("another e2e run is in progress on this machine (%s); wait for it to end: runs share the host's mounts, loop devices and paths", strings.Join(others, ", "))
	}
	for _, note := range runs.CleanStale() {
		fmt.Printf("e2e: an earlier run did not take itself down: %s\n", note)
	}
	dir, err := runs.New()
	if err != nil {
		return err
	}
	c.dir = dir
	c.logs = filepath.Join(dir, "logs")
	if err := os.MkdirAll(c.logs, 0o755); err != nil {
		return err
	}
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	// The first node keeps the run's directory as its own, as when the
	// cluster had one node.
	first, err := c.newNode(strings.ToLower(host), dir, c.logs, "kubelet", kubernetesVersion)
	if err != nil {
		return err
	}
	c.kubeNode = first
	c.nodes = []*kubeNode{first}
	// The first node alone has storage pool fast, an xfs that clones by
	// reflink: mounted before its namespaces exist, so that they start
	// with it; the run's clean-up unmounts it and detaches its device.
	if err := smallFilesystemOf(filepath.Join(dir, "pool-fast.img"), filepath.Join(first.poolsDir, fastPool), fastPoolSize,
		"xfs", "-q", "-f", "-m", "reflink=1"); err != nil {
		return err
	}
	c.ports = map[string]int{}
	for _, name := range []string{"etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler"} {
		if c.ports[name], err = freePort(); err != nil {
			return err
		}
	}

	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"kubernetes binaries", c.kubeBinaries},
		{"crictl", c.buildCrictl},
		{"sidecars", c.buildSidecars},
		{"csi-node image", c.buildCSINodeImage},
		{"certificates", c.makePKI},
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"controller-manager and scheduler", c.startControllers},
		{"snapshot CRDs and controller", c.startSnapshots},
	}
	steps = append(steps, first.upSteps()...)
	steps = append(steps, []struct {
		name string
		run  func(context.Context) error
	}{
		{"control plane's role", c.labelControlPlane},
		{"converge DaemonSet", c.installDriver},
		{"default service account", c.waitServiceAccount},
		{"release's files (in the background)", c.startRelease},
	}...)
	for _, s := range steps {
		start := time.Now()
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		c.upPhases = append(c.upPhases, fmt.Sprintf("%s %.1fs", s.name, time.Since(start).Seconds()))
	}
	return nil
}

// labelControlPlane gives the first node the control plane's role, as
// kubeadm and kind give theirs: converge-controller runs only there. The
// role is the admin's to give (NodeRestriction refuses it to a kubelet),
// so it is given once the node has registered.
func (c *cluster) labelControlPlane(ctx context.Context) error {
	out, err := c.kubectl(ctx, "label", "node", c.node, controlPlaneRole+"=", "--overwrite")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// controlPlaneRole is the label of the nodes converge-controller may run on.
const controlPlaneRole = "node-role.kubernetes.io/control-plane"

// kubeBinaries builds the Kubernetes binaries of test/e2e/k8s into the
// user's cache directory, keyed by version, or reuses the ones built there
// before with the same flags: a cold build takes minutes, a warm one
// nothing.
func (c *cluster) kubeBinaries(ctx context.Context) error {
	// The tools of test/e2e/k8s/go.mod: the Kubernetes binaries, agnhost and
	// the ginkgo runner.
	var err error
	c.bin, err = c.buildTools(ctx, "kubernetes-"+kubernetesVersion, "k8s", "kubernetes, agnhost, ginkgo", "-s -w "+versionLDFlags(kubernetesVersion))
	return err
}

// crictlVersion is the cri-tools release every node has; test/e2e/crictl
// pins the same one.
const crictlVersion = "v1.37.0"

// buildCrictl builds the nodes' crictl (test/e2e/crictl).
func (c *cluster) buildCrictl(ctx context.Context) error {
	bin, err := c.buildTools(ctx, "cri-tools-"+crictlVersion, "crictl", "crictl", "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version="+crictlVersion)
	c.crictl = filepath.Join(bin, "crictl")
	return err
}

// buildTools builds the tools of the module test/e2e/<module> ("go build
// tool"; what they are, for the stamp) into the user's cache directory
// under name, with env added to go's environment, or reuses what was built
// there before with the same flags and environment, and returns the
// directory.
func (c *cluster) buildTools(ctx context.Context, name, module, what, ldflags string, env ...string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "converge-e2e", name)
	args := []string{"build", "-trimpath", "-ldflags", ldflags}
	// The stamp holds what decides the build: its flags, and the module's
	// go.mod and go.sum, which pin every version it builds.
	sum, err := hashFiles(filepath.Join(c.repo, "test", "e2e", module), "go.mod", "go.sum")
	if err != nil {
		return "", err
	}
	stamp := strings.Join(args, " ") + " tool (" + what + ") of module " + sum + "\n"
	if len(env) > 0 {
		stamp = strings.Join(env, " ") + " go " + stamp
	}
	built := func() bool {
		b, err := os.ReadFile(filepath.Join(bin, "built-with"))
		return err == nil && string(b) == stamp
	}
	if built() {
		return bin, nil
	}
	// One build of name at a time on the machine: make test's kubelets
	// step builds the older kubelets while the run's first tests go on,
	// and a test that needs one first waits for it.
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(ctx, bin+".lock", "the build of "+what)
	if err != nil {
		return "", err
	}
	defer unlock()
	if built() {
		return bin, nil
	}
	c.builtMu.Lock()
	c.built = append(c.built, name)
	c.builtMu.Unlock()
	tmp := bin + ".partial"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "-o", tmp+"/", "tool")...)
	cmd.Dir = filepath.Join(c.repo, "test", "e2e", module)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build tool: %v\n%s", err, tail(string(out), 40))
	}
	if err := os.WriteFile(filepath.Join(tmp, "built-with"), []byte(stamp), 0o644); err != nil {
		return "", err
	}
	os.RemoveAll(bin)
	return bin, os.Rename(tmp, bin)
}

func (c *cluster) makePKI(context.Context) error {
	p, err := newPKI(filepath.Join(c.dir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	ids := []struct {
		name, cn string
		orgs     []string
		hosts    []string
	}{
		{"apiserver", "kube-apiserver", nil, []string{"127.0.0.1", kubernetesServiceIP, "localhost", c.node, "kubernetes", "kubernetes.default", "kubernetes.default.svc"}},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil},
		{"admin", "converge-e2e-admin", []string{"system:masters"}, nil},
		{"controller-manager", "system:kube-controller-manager", nil, nil},
		{"scheduler", "system:kube-scheduler", nil, nil},
	}
	for _, id := range ids {
		if err := c.issue(id.name, id.cn, id.orgs, id.hosts...); err != nil {
			return err
		}
	}
	c.admin = p.path("admin.kubeconfig")
	return c.issue(c.kubeNode.identity, "system:node:"+c.node, []string{"system:nodes"})
}

// issue issues an identity of the cluster's CA and writes its kubeconfig
// for the API server.
func (c *cluster) issue(name, cn string, orgs []string, hosts ...string) error {
	if err := c.pki.issue(name, cn, orgs, hosts...); err != nil {
		return err
	}
	_, err := c.pki.kubeconfig(name, fmt.Sprintf("https://127.0.0.1:%d", c.ports["apiserver"]))
	return err
}

func (c *cluster) startEtcd(ctx context.Context) error {
	client := fmt.Sprintf("http://127.0.0.1:%d", c.ports["etcd"])
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.ports["etcd-peer"])
	var err error
	c.etcd, err = startProc(c.logs, "etcd", "etcd",
		"--name=e2e", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=e2e="+peer, "--listen-metrics-urls=")
	if err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, c.etcd, func() error {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(client, "http://"), time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

func (c *cluster) startAPIServer(ctx context.Context) error {
	p := c.pki.path
	var err error
	c.apiserver, err = startProc(c.logs, "kube-apiserver", filepath.Join(c.bin, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.ports["etcd"]),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports["apiserver"]),
		// A loopback address is invalid in the kubernetes Service's
		// Endpoints; nothing here needs them.
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=10.96.0.0/24",
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		// The node's host name resolves to 127.0.0.1, so kubectl exec and
		// logs reach the kubelet.
		"--kubelet-preferred-address-types=Hostname",
		"--allow-privileged=true",
		// Pods' status.volumeHealth, which the kubelet writes with the
		// same alpha gate (node.go); without it the API server drops
		// the field.
		"--feature-gates=CSIVolumeHealth=true",
	)
	if err != nil {
		return err
	}
	// The clients are made once: a restart of the API server (the soak's)
	// keeps the address and the credentials, and the clients dial again,
	// while tests, informers and watchers read them concurrently.
	if c.client == nil {
		cfg, err := clientcmd.BuildConfigFromFlags("", c.admin)
		if err != nil {
			return err
		}
		cfg.QPS, cfg.Burst = 100, 200
		if c.client, err = kubernetes.NewForConfig(cfg); err != nil {
			return err
		}
		if c.dynamic, err = dynamic.NewForConfig(cfg); err != nil {
			return err
		}
	}
	return waitFor(ctx, 60*time.Second, c.apiserver, func() error {
		body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("readyz: %v %s", err, body)
		}
		return nil
	})
}

// controllerManagerQPS is kube-controller-manager's --kube-api-qps, its
// burst twice that; 0 leaves both at the release's (20 and 30). Each
// controller writes under a limit of its own: the PV controller's is where
// a hundred claims made at once wait (make compare's breakdown).
var controllerManagerQPS = flag.Int("controller-manager-qps", 0, "kube-controller-manager's --kube-api-qps (burst twice that); 0: its default")

func (c *cluster) startControllers(ctx context.Context) error {
	var err error
	var qps []string
	if q := *controllerManagerQPS; q > 0 {
		qps = []string{fmt.Sprintf("--kube-api-qps=%d", q), fmt.Sprintf("--kube-api-burst=%d", 2*q)}
	}
	c.controllerManager, err = startProc(c.logs, "kube-controller-manager", filepath.Join(c.bin, "kube-controller-manager"), append([]string{
		"--kubeconfig=" + c.pki.path("controller-manager.kubeconfig"),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", c.ports["controller-manager"]),
		"--leader-elect=false",
		"--service-account-private-key-file=" + c.pki.path("sa.key"),
		"--root-ca-file=" + c.pki.path("ca.crt"),
		"--flex-volume-plugin-dir=" + filepath.Join(c.dir, "flexvolume"),
		// Each controller acts as its own service account, with the
		// system:controller:* roles; the controller-manager's own identity
		// has only the rights to start them.
		"--use-service-account-credentials=true",
	}, qps...)...)
	if err != nil {
		return err
	}
	c.scheduler, err = startProc(c.logs, "kube-scheduler", filepath.Join(c.bin, "kube-scheduler"),
		"--kubeconfig="+c.pki.path("scheduler.kubeconfig"),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", c.ports["scheduler"]),
		"--leader-elect=false",
	)
	if err != nil {
		return err
	}
	// Both serve once they run: a daemon that died at start (a port it
	// could not bind) fails the set-up, rather than every pod after it.
	for _, d := range []struct {
		p    *proc
		port int
	}{{c.controllerManager, c.ports["controller-manager"]}, {c.scheduler, c.ports["scheduler"]}} {
		if err := waitFor(ctx, 30*time.Second, d.p, func() error {
			conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", d.port))
			if err == nil {
				conn.Close()
			}
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) waitServiceAccount(ctx context.Context) error {
	return waitFor(ctx, 60*time.Second, c.controllerManager, func() error {
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// kubectl runs the cluster's kubectl as the admin and returns its output.
func (c *cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "kubectl"), append([]string{"--kubeconfig", c.admin}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// waitFor polls check every 100 ms until it succeeds, timeout passes, ctx
// ends or p (when not nil) exits; the error then names the last failure and
// the tail of p's log.
func waitFor(ctx context.Context, timeout time.Duration, p *proc, check func() error) error {
	err := polling.Wait(ctx, timeout, 100*time.Millisecond, func() error {
		last := check()
		if last != nil && p != nil && p.exited() {
			return polling.Stop(fmt.Errorf("%s exited (%v): %v", p.name, p.err, last))
		}
		return last
	})
	if err != nil && p != nil {
		err = fmt.Errorf("%w\n%s", err, tailFile(p.log, 30))
	}
	return err
}

// freePort returns a port on 127.0.0.1 that nothing listens on, below the
// kernel's range of ephemeral ports: a port the kernel hands out (port 0)
// is in that range, and may be taken as the source port of an outgoing
// connection (the apiserver's to etcd, say) before the daemon it was
// picked for binds it, which then fails with "address already in use"
// (a scheduler did so in a run here).
func freePort() (int, error) {
	low := 32768 // Linux's default start of the ephemeral range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const base = 10000
	if low <= base+100 {
		return 0, fmt.Errorf("the ephemeral port range starts at %d: no room below it", low)
	}
	for range 1000 {
		port := base + rand.IntN(low-base)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port from %d to %d", base, low)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), n)
}

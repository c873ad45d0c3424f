package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/test/e2e/runs"

	polling "github.com/converge-csi/converge/test/testenv/poll"
)

// The node's daemons (containerd with its containers, the kubelet,
// csi-node) run in a mount, PID and network namespace of the node's own, as
// on a machine of their own:
//   - its PID 1 is ours, so that what enters "the host" through
//     /proc/1/ns/mnt, as the storage suite's HostExec pods do
//     (nsenter --mount=/rootfs/proc/1/ns/mnt), enters the node's mount
//     namespace; on this machine kind nobody may open the real PID 1's;
//   - the kubelet's root directory is /var/lib/kubelet there, the path the
//     suite's tests look in and deploy/'s DaemonSet mounts, bound from the
//     run's directory and shared (rshared), as on a host whose init makes
//     every mount shared: csi-node's mounts there (Bidirectional) reach the
//     kubelet and the pods;
//   - csi-node's state directory is /var/lib/converge there, deploy/'s
//     hostPath, bound (with the filesystem of a node's data directory
//     that is one) from the node's directory; its storage pools' root is
//     /var/lib/converge-pools, bound with the pools' filesystems the node
//     has (the first node's pool fast, cluster.go);
//   - every mount the node makes stays in it and goes with it: the test
//     process sees them through /proc/<init>/root and /proc/<init>/mountinfo
//     (nodePath, nodeMounts);
//   - its pods' network joins it, and it reaches the control plane through
//     the test process (nodenet.go).
//
// The namespaces' PID 1 is this test binary, started again as nodeInitName:
// it mounts the namespace's /proc and the kubelet directory, then only reaps
// orphans. It dies with the test process (Pdeathsig), and the kernel then
// kills everything in the namespace.

// nodeInitName is the name (argv[0]) under which the test binary runs as
// the node's init; its arguments are the node's kubelet, state and pools
// directories.
const nodeInitName = "converge-e2e-node-init"

const (
	// nodeKubeletDir is the kubelet's root directory as the node sees it.
	nodeKubeletDir = "/var/lib/kubelet"
	// nodeStateDir is csi-node's state directory as the node sees it:
	// deploy/'s hostPath.
	nodeStateDir = "/var/lib/converge"
	// nodePoolsDir is the root of csi-node's storage pools as the node
	// sees it: the chart's poolsRoot.
	nodePoolsDir = "/var/lib/converge-pools"
)

// runNodeInit is the node's init: TestMain runs it instead of the tests when
// the binary is started as nodeInitName. It never returns.
func runNodeInit(kubeletDir, stateDir, poolsDir string) {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", nodeInitName, err)
		os.Exit(1)
	}
	// Nothing of the node's propagates to the host's mounts, nor back.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fail(fmt.Errorf("make / private: %w", err))
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		fail(fmt.Errorf("mount the namespace's /proc: %w", err))
	}
	for _, b := range []struct{ from, at string }{{kubeletDir, nodeKubeletDir}, {stateDir, nodeStateDir}, {poolsDir, nodePoolsDir}} {
		if err := os.MkdirAll(b.at, 0o755); err != nil {
			fail(err)
		}
		if err := unix.Mount(b.from, b.at, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			fail(fmt.Errorf("bind %s at %s: %w", b.from, b.at, err))
		}
	}
	// Shared, as on a host whose init makes every mount shared: csi-node's
	// mounts under the kubelet's directory reach the pods (Bidirectional),
	// and the pools' root may be mounted HostToContainer.
	for _, d := range []string{nodeKubeletDir, nodePoolsDir} {
		if err := unix.Mount("", d, "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
			fail(fmt.Errorf("make %s shared: %w", d, err))
		}
	}
	if err := dropForeignLoopMounts(kubeletDir, stateDir, poolsDir); err != nil {
		fail(err)
	}
	// The node's network (nodenet.go): its loopback and the kubernetes
	// Service's address; the harness adds the node's own.
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", kubernetesServiceIP + "/32", "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			fail(fmt.Errorf("ip %v: %v: %s", args, err, out))
		}
	}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	fmt.Println("ready")
	for {
		// Orphans of the namespace (a shim's parent, a daemon nsenter
		// no longer waits for) become this process's children.
		for {
			pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		<-chld
	}
}

// nodeNS is the node's namespaces, held by their init.
type nodeNS struct {
	init *proc
}

// startNodeNS starts the node's init and waits until it has set the
// namespaces up.
func startNodeNS(logDir, kubeletDir, stateDir, poolsDir string) (*nodeNS, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	log := filepath.Join(logDir, "node-init.log")
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := &exec.Cmd{Path: self, Args: []string{nodeInitName, kubeletDir, stateDir, poolsDir}, Stdout: w, Stderr: f}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET,
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("start the node's init: %w", err)
	}
	p := &proc{name: "node-init", log: log, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if line != "ready\n" {
		p.kill()
		return nil, fmt.Errorf("the node's init did not come up (%v): %s", p.err, tailFile(log, 10))
	}
	return &nodeNS{init: p}, nil
}

// pid is the init's PID as the test process sees it.
func (n *nodeNS) pid() int { return n.init.cmd.Process.Pid }

// path is where the test process reaches path of the node's mount
// namespace.
func (n *nodeNS) path(path string) string {
	return fmt.Sprintf("/proc/%d/root%s", n.pid(), path)
}

// netns is the path of the node's network namespace.
func (n *nodeNS) netns() string {
	return fmt.Sprintf("/proc/%d/ns/net", n.pid())
}

// liveNodeNetns is the path of the network namespace of the node whose
// kubelet directory (as the test process sees it) is kubeletDir, found
// among the processes, not in the node's nodeNS: a reboot
// (nodereboot.go) gives the node new namespaces while a reader elsewhere
// (a proxy into the node, nodeproxy.go) goes on. While the node is down
// it has none, and that is the error.
func liveNodeNetns(kubeletDir string) (string, error) {
	for _, pid := range runs.ProcessesMentioning(kubeletDir) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(string(b), "\x00")
		if len(args) >= 2 && args[0] == nodeInitName && args[1] == kubeletDir {
			return fmt.Sprintf("/proc/%d/ns/net", pid), nil
		}
	}
	return "", fmt.Errorf("the node of %s has no init running: it is down", kubeletDir)
}

// mountinfo is the node's mount table.
func (n *nodeNS) mountinfo() string {
	return fmt.Sprintf("/proc/%d/mountinfo", n.pid())
}

// run runs a command in the node's mount, PID and network namespaces, as
// on the node (its /proc is the node's), and returns its output.
func (n *nodeNS) run(bin string, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--target", strconv.Itoa(n.pid()), "--mount", "--pid", "--net", "--", bin}, args...)...).CombinedOutput()
	return string(out), err
}

// start starts a daemon in the node's namespaces. nsenter runs it as its
// child and ends with it, but forwards no signal: the returned proc signals
// the daemon itself.
func (n *nodeNS) start(logDir, name, bin string, args ...string) (*proc, error) {
	p, err := startProc(logDir, name, "nsenter", append([]string{"--target", strconv.Itoa(n.pid()), "--mount", "--pid", "--net", "--", bin}, args...)...)
	if err != nil {
		return nil, err
	}
	children := fmt.Sprintf("/proc/%d/task/%d/children", p.cmd.Process.Pid, p.cmd.Process.Pid)
	err = polling.Wait(context.Background(), 10*time.Second, time.Millisecond, func() error {
		b, _ := os.ReadFile(children)
		if f := strings.Fields(string(b)); len(f) == 1 {
			pid, _ := strconv.Atoi(f[0])
			d, err := os.FindProcess(pid) // a pidfd: a recycled PID is never hit
			// Still nsenter's child once the pidfd is held: it is the daemon.
			if b, _ := os.ReadFile(children); err == nil && strings.TrimSpace(string(b)) == f[0] {
				p.target = d
				return nil
			}
		}
		if p.exited() {
			return polling.Stop(errors.New("exited"))
		}
		return errors.New("no single child")
	})
	if err != nil {
		p.kill()
		return nil, fmt.Errorf("start %s in the node's namespaces (%v): %s", name, p.err, tailFile(p.log, 10))
	}
	return p, nil
}

// dropForeignLoopMounts detaches, in the node's new mount namespace, every
// copy it took of a loop-backed mount that is not the node's own (below its
// kubelet, state or pools directory, at the host's path or the node's, or
// holding one). The namespace is private: a copy would keep its loop device open for as long
// as the node lives, whatever its owner unmounts on the host, and a test
// running beside the cluster (test/fault's, whose volume was staged when
// the node started) could then never detach that device.
func dropForeignLoopMounts(own ...string) error {
	mounts, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	own = append(own, nodeKubeletDir, nodeStateDir, nodePoolsDir)
	// Deepest first: a mount below another goes before it.
	slices.SortFunc(mounts, func(a, b host.Mount) int { return len(b.Path) - len(a.Path) })
	for _, m := range mounts {
		// A mount the node's directories are in (a loop-backed /tmp) is
		// the node's too: detaching it would take them with it.
		mine := func(d string) bool { return within(m.Path, d) || within(d, m.Path) }
		if m.Dev.Major != loopMajor || slices.ContainsFunc(own, mine) {
			continue
		}
		if err := unix.Unmount(m.Path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detach the copy of %s at %s: %w", m.Source, m.Path, err)
		}
	}
	return nil
}

// loopMajor is the loop driver's block major number.
const loopMajor = 7

// within says whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/converge-csi/converge/pkg/devices"
)

// down takes the cluster apart in reverse and leaves the machine as it
// was: no process, mount, loop device, cgroup or file of the run's remains
// (the cached Kubernetes binaries aside). It returns what it had to clean
// by force, or failed to.
func (c *cluster) down() []string {
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	for i := len(c.nodes) - 1; i >= 0; i-- {
		c.nodes[i].down()
	}
	for _, p := range []*proc{c.snapshotController, c.scheduler, c.controllerManager, c.apiserver, c.etcd} {
		if p != nil {
			p.stop(20 * time.Second)
		}
	}
	if c.dir != "" {
		cleanRun(c.dir, note)
	}
	return notes
}

// down stops the node's daemons: the kubelet, its containers (converge's
// pod among them) and containerd, and then everything else in its
// namespaces, whose mounts go with them.
func (n *kubeNode) down() {
	if n.kubelet != nil {
		n.kubelet.stop(30 * time.Second)
	}
	defer n.links.close()
	if n.containerdProc != nil && !n.containerdProc.exited() {
		// Containers outlive containerd in their shims: end them first.
		out, _ := n.ctr("tasks", "ls", "-q")
		for _, id := range strings.Fields(out) {
			n.ctr("tasks", "kill", "-s", "SIGKILL", id)
			n.ctr("tasks", "delete", "-f", id)
		}
		out, _ = n.ctr("containers", "ls", "-q")
		for _, id := range strings.Fields(out) {
			n.ctr("containers", "delete", id)
		}
		n.containerdProc.stop(20 * time.Second)
	}
	killShims(n.containerd)
	if n.ns != nil {
		n.ns.init.kill()
	}
}

// cleanRun removes what a run leaves on the machine once its daemons are
// gone: mounts under dir (the kubelet's bind mount of its root among them),
// loop devices of images under dir, the sysctls the kubelet changed, the
// kubepods cgroups, the kubelet's log links, and dir itself.
func cleanRun(dir string, note func(string, ...any)) {
	for _, m := range mountsUnder(dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			note("unmount %s: %v", m, err)
		}
	}
	for dev, file := range loopsBackedUnder(dir) {
		if err := devices.DetachLoop(dev); err != nil {
			note("detach %s (%s): %v", dev, file, err)
		}
	}
	restoreSysctls(dir, note)
	removeLogLinks(dir) // before the host paths: they live in one
	removeHostPaths(dir, note)
	removeCgroups(note)
	if err := os.RemoveAll(dir); err != nil {
		note("remove %s: %v", dir, err)
	}
}

// cleanStaleRuns cleans up after earlier runs that were killed before they
// could take themselves down (a test binary's timeout ends it with a
// panic): it kills their processes, including the containers of their
// kubelet, and then cleans as down does.
func cleanStaleRuns() []string {
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), runPrefix+"*"))
	for _, dir := range dirs {
		if ownerAlive(dir) {
			continue // another suite's, running now
		}
		note("%s", dir)
		var killed []int
		for _, pid := range processesMentioning(dir) {
			syscall.Kill(pid, syscall.SIGKILL)
			killed = append(killed, pid)
		}
		// Only this suite's kubelets make kubepods cgroups on a test
		// machine: what runs in them are its containers.
		var procs []string
		for _, pattern := range []string{"/sys/fs/cgroup/pids/kubepods/*/*/*/cgroup.procs", "/sys/fs/cgroup/pids/kubepods/*/*/cgroup.procs",
			"/sys/fs/cgroup/pids/" + cgroupRootPrefix + "*/kubepods/*/*/*/cgroup.procs", "/sys/fs/cgroup/pids/" + cgroupRootPrefix + "*/kubepods/*/*/cgroup.procs"} {
			more, _ := filepath.Glob(pattern)
			procs = append(procs, more...)
		}
		for _, f := range procs {
			b, _ := os.ReadFile(f)
			for _, field := range strings.Fields(string(b)) {
				var pid int
				if _, err := fmt.Sscan(field, &pid); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
					killed = append(killed, pid)
				}
			}
		}
		// The mounts and cgroups go only once their processes have.
		waitFor(context.Background(), 10*time.Second, nil, func() error {
			for _, pid := range killed {
				if syscall.Kill(pid, 0) == nil {
					return fmt.Errorf("process %d still there", pid)
				}
			}
			return nil
		})
		cleanRun(dir, note)
	}
	return notes
}

// liveRuns lists the run directories whose owner still runs.
func liveRuns() []string {
	var out []string
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), runPrefix+"*"))
	for _, dir := range dirs {
		if ownerAlive(dir) {
			b, _ := os.ReadFile(filepath.Join(dir, "owner"))
			out = append(out, fmt.Sprintf("%s, process %s", dir, strings.Fields(string(b))[0]))
		}
	}
	return out
}

// writeOwner records in the run's directory which process runs it: its
// PID and the start time that makes the PID unambiguous.
func writeOwner(dir string) error {
	return os.WriteFile(filepath.Join(dir, "owner"), []byte(processIdentity(os.Getpid())), 0o644)
}

// ownerAlive reports whether the process that made the run directory still
// runs. A directory without an owner file was made before the suite wrote
// one, or by a run killed before it could: stale.
func ownerAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "owner"))
	if err != nil {
		return false
	}
	var pid int
	if _, err := fmt.Sscanf(string(b), "%d", &pid); err != nil {
		return false
	}
	return processIdentity(pid) == string(b)
}

// processIdentity is "<pid> <start time>" of a running process, or "" when
// none has that PID.
func processIdentity(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The fields after the command name, which is in parentheses; the
	// start time is the 22nd field of the line, the 20th after it.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
	fields := strings.Fields(rest)
	if len(fields) < 20 {
		return ""
	}
	return fmt.Sprintf("%d %s", pid, fields[19])
}

// processesMentioning lists the processes whose command line contains s.
func processesMentioning(s string) []int {
	var out []int
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil && pid != os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}

// kernelTunables are the sysctls the kubelet sets at start.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// saveSysctls records the kernel tunables in the run's directory before
// the kubelet changes them, so that down, or the next run after a crash,
// puts them back.
func (c *cluster) saveSysctls(context.Context) error {
	var b strings.Builder
	for _, s := range kernelTunables {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", s)); err == nil {
			fmt.Fprintf(&b, "%s=%s\n", s, strings.TrimSpace(string(v)))
		}
	}
	return os.WriteFile(filepath.Join(c.dir, "sysctls"), []byte(b.String()), 0o644)
}

func restoreSysctls(dir string, note func(string, ...any)) {
	b, err := os.ReadFile(filepath.Join(dir, "sysctls"))
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		s, v, ok := strings.Cut(line, "=")
		if !ok || !slices.Contains(kernelTunables, s) {
			continue
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(v), 0o644); err != nil {
			note("restore sysctl %s=%s: %v", s, v, err)
		}
	}
}

// hostPaths are directories outside the run's own that the daemons make
// at fixed paths whatever they are told: the kubelet's device-plugin socket
// and container log links, containerd's shim sockets and runc state, and
// the flex-volume directory of the controller-manager's probe; and the
// mount points of the nodes' kubelet and state directories (nodens.go).
var hostPaths = []string{"/var/lib/kubelet", "/var/lib/converge", "/var/log/containers", "/run/containerd", "/opt/containerd", "/usr/libexec/kubernetes"}

// recordHostPaths notes which of hostPaths do not exist before the run, so
// that cleanRun removes what the run made of them.
func recordHostPaths(dir string) error {
	var absent []string
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			absent = append(absent, p)
		}
	}
	return os.WriteFile(filepath.Join(dir, "host-paths-absent"), []byte(strings.Join(absent, "\n")), 0o644)
}

// removeHostPaths removes, of the host paths that did not exist before the
// run, the empty directories and the sockets: nothing that holds data.
func removeHostPaths(dir string, note func(string, ...any)) {
	b, err := os.ReadFile(filepath.Join(dir, "host-paths-absent"))
	if err != nil {
		return
	}
	for _, root := range strings.Fields(string(b)) {
		if !slices.Contains(hostPaths, root) {
			continue
		}
		removeDeepestFirst(root, func(d os.DirEntry) bool { return d.IsDir() || d.Type()&os.ModeSocket != 0 }, note)
	}
}

// removeDeepestFirst removes the entries under root (root included) that
// match, children before their parents. A directory that still holds
// something it does not match stays, and is noted.
func removeDeepestFirst(root string, match func(os.DirEntry) bool, note func(string, ...any)) {
	var paths []string
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && match(d) {
			paths = append(paths, path)
		}
		return nil
	})
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			note("remove %s (made by the run): %v", p, err)
		}
	}
}

// killShims ends containerd-shim processes serving the run's containerd:
// with their tasks gone they exit by themselves, so one left is stuck.
func killShims(address string) {
	if address == "" {
		return
	}
	for _, pid := range processesMentioning(address) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// removeCgroups removes the kubepods cgroups the kubelets made and the
// cgroup roots the suite made for its further nodes, deepest first. The
// kubelet makes them afresh at its next start.
func removeCgroups(note func(string, ...any)) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	more, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupRootPrefix + "*")
	roots = append(roots, more...)
	for _, root := range roots {
		// A cgroup directory is removed with rmdir, empty of processes.
		removeDeepestFirst(root, os.DirEntry.IsDir, note)
	}
}

// removeLogLinks removes the links the kubelet makes in /var/log/containers
// (a fixed path) to the run's container logs.
func removeLogLinks(dir string) {
	links, _ := filepath.Glob("/var/log/containers/*.log")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, dir+"/") {
			os.Remove(l)
		}
	}
}

// mountsUnder lists the mount points under dir (dir included), deepest
// first, as converge's own device layer reads them.
func mountsUnder(dir string) []string {
	return mountsIn("/proc/self/mountinfo", dir)
}

// mountsIn lists the mount points of a mount table (a mountinfo file) at
// or under dir, deepest first.
func mountsIn(mountinfo, dir string) []string {
	mounts, err := devices.ReadMounts(mountinfo)
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range mounts {
		if m.Path == dir || strings.HasPrefix(m.Path, dir+"/") {
			out = append(out, m.Path)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// loopsBackedUnder maps each attached loop device whose backing file lies
// under dir to that file.
//
// csi-node attaches images in its container, through its hostPath of the
// node's state directory: the kernel names such a file by its path in the
// container (/var/lib/converge/volumes/...) or, once the container has
// ended, beneath the hostPath (/volumes/...). Those are found in the
// state directories of the run's nodes by their device and inode numbers.
func loopsBackedUnder(dir string) map[string]string {
	out := map[string]string{}
	loops, _ := devices.ListLoops("/sys/block")
	states, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "converge"))
	states = append(states, filepath.Join(dir, "converge"))
	for _, l := range loops {
		if strings.HasPrefix(l.BackingFile, dir+"/") {
			out[l.Device] = l.BackingFile
			continue
		}
		for _, s := range states {
			if path, ok := devices.ResolveBacking(l, s); ok {
				out[l.Device] = path
				break
			}
		}
	}
	return out
}

// leftovers lists what of the run's remains on the machine after down: its
// directory, mounts under it, loop devices backed by files under it, and
// processes started from its binaries.
func leftovers(dir string) []string {
	if dir == "" {
		return nil
	}
	var out []string
	if _, err := os.Stat(dir); err == nil {
		out = append(out, "directory "+dir)
	}
	for _, m := range mountsUnder(dir) {
		out = append(out, "mount "+m)
	}
	for dev, file := range loopsBackedUnder(dir) {
		out = append(out, fmt.Sprintf("loop device %s (%s)", dev, file))
	}
	for _, pid := range processesMentioning(dir) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(b), "\x00", " ")))
	}
	return out
}

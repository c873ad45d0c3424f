package runs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// What the test makes on the machine, as a killed run leaves it, and its
// own clean-up of it, which does not rely on the code under test: a
// failing test leaves nothing mounted, attached, frozen or running.

// made records what the test made, for cleanUp.
type made struct {
	children []*child
	cgroups  []string          // relative to each v1 hierarchy's root, parents first
	mounts   []string          // mount points, in the order mounted
	loops    map[string]string // device to backing file
	dirs     []string
}

// child is a process the test started; done is closed once it is reaped.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// newMade returns an empty record whose clean-up runs when t ends.
func newMade(t *testing.T) *made {
	m := &made{loops: map[string]string{}}
	t.Cleanup(func() { m.cleanUp(t) })
	return m
}

// needMachine skips t unless it runs as root on a machine with a cgroup v1
// freezer, loop devices, mkfs.ext4 and unshare, and no e2e run in progress
// (whose kernel tunables and host paths the test's runs would record and
// put back under it).
func needMachine(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes cgroups, loop devices and mounts")
	}
	if freezerHierarchy() == "" {
		t.Skip("needs the cgroup v1 freezer, mounted under " + cgroupFS)
	}
	for _, tool := range []string{"mkfs.ext4", "unshare", "sleep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
	if live := Live(); len(live) > 0 {
		t.Skipf("an e2e run is in progress on this machine (%s)", strings.Join(live, "; "))
	}
}

// v1Hierarchies lists the cgroup v1 hierarchies.
func v1Hierarchies() []string {
	var out []string
	for _, h := range hierarchies() {
		var st unix.Statfs_t
		if unix.Statfs(h, &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC {
			out = append(out, h)
		}
	}
	return out
}

// freezerHierarchy is the mount point of the cgroup v1 hierarchy of the
// freezer controller, or "".
func freezerHierarchy() string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		mount, super, _ := strings.Cut(line, " - ")
		f, g := strings.Fields(mount), strings.Fields(super)
		if len(f) > 4 && len(g) > 2 && g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), "freezer") {
			return f[4]
		}
	}
	return ""
}

// run makes a run directory as New does; owner, when not "", replaces its
// owner's identity.
func (m *made) run(t *testing.T, owner string) string {
	t.Helper()
	dir, err := New()
	if err != nil {
		t.Fatal(err)
	}
	m.dirs = append(m.dirs, dir)
	if owner != "" {
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(owner), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// deadOwner is the identity of a process that has ended.
func deadOwner(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	id := processIdentity(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	if id == "" {
		t.Fatal("no identity for a process that ran")
	}
	return id
}

// loop attaches a new sparse file of size bytes to a loop device.
func (m *made) loop(t *testing.T, file string, size int64) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dev, err := devices.AttachLoop(file, false)
	if err != nil {
		t.Fatal(err)
	}
	m.loops[dev] = file
	return dev
}

// filesystem makes an ext4 in a new sparse image, attached to a loop
// device, mounts it at dir, and returns the device.
func (m *made) filesystem(t *testing.T, image, dir string) string {
	t.Helper()
	dev := m.loop(t, image, 32<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", dev, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dev, dir, "ext4", 0, ""); err != nil {
		t.Fatalf("mount %s at %s: %v", dev, dir, err)
	}
	m.mounts = append(m.mounts, dir)
	return dev
}

// cgroup makes the cgroup path (a/b/c), and each of its parents, in every
// v1 hierarchy; a new cpuset cgroup has no CPUs nor memory nodes until it
// is given its parent's.
func (m *made) cgroup(t *testing.T, path string) {
	t.Helper()
	parts := strings.Split(path, "/")
	for i := range parts {
		rel := filepath.Join(parts[:i+1]...)
		if !slices.Contains(m.cgroups, rel) {
			m.cgroups = append(m.cgroups, rel)
		}
		for _, h := range v1Hierarchies() {
			d := filepath.Join(h, rel)
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if b, err := os.ReadFile(filepath.Join(filepath.Dir(d), f)); err == nil {
					if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
						t.Fatalf("%s: %v", filepath.Join(d, f), err)
					}
				}
			}
		}
	}
}

// pod starts a process in the cgroup path of every v1 hierarchy, as a
// container runs: a sleep in a mount namespace of its own, which holds a
// private copy of the test's runs' mounts there are now (a mount the host
// then unmounts stays mounted there, its loop device open, while the
// process lives). It first lets go of its copies of every other
// loop-backed mount but those the runs are in: a test running beside this
// one (test/fault's) must be able to detach its devices while this frozen
// process lives.
func (m *made) pod(t *testing.T, cgroup string) *child {
	t.Helper()
	const script = `findmnt -rn -o MAJ:MIN,TARGET | while read -r dev target; do
	case $dev in 7:*) ;; *) continue ;; esac
	keep=
	# A mount the runs are in (a loop-backed /tmp) is theirs too.
	for d in "$@"; do case $target in / | "$d" | "$d"/*) keep=1 ;; esac; case $d in "$target"/*) keep=1 ;; esac; done
	[ -n "$keep" ] || umount -l "$target" 2>/dev/null || true
done
exec sleep 1000`
	return m.spawn(t, exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-ec", script, "sh"}, m.dirs...)...), cgroup)
}

// process starts a sleep in the cgroup path of every v1 hierarchy, in the
// test's mount namespace.
func (m *made) process(t *testing.T, cgroup string) *child {
	t.Helper()
	return m.spawn(t, exec.Command("sleep", "1000"), cgroup)
}

// daemon starts a sleep whose command line names argv0, as a daemon
// started from a run's binaries does, in the test's own cgroups.
func (m *made) daemon(t *testing.T, argv0 string) *child {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	cmd.Args[0] = argv0
	return m.spawn(t, cmd, "")
}

// spawn starts cmd, which ends up running sleep, moves it into the cgroup
// path of every v1 hierarchy unless that is "", and returns once it sleeps.
func (m *made) spawn(t *testing.T, cmd *exec.Cmd, cgroup string) *child {
	t.Helper()
	c := m.start(t, cmd, cgroup)
	pid := strconv.Itoa(cmd.Process.Pid)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "process "+pid+" sleeping", func() error {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return err
		}
		if name := string(b[strings.IndexByte(string(b), '(')+1 : strings.LastIndexByte(string(b), ')')]); name != "sleep" {
			return fmt.Errorf("it runs %s", name)
		}
		return nil
	})
	return c
}

// start starts cmd and moves it into the cgroup path of every v1
// hierarchy unless that is "".
func (m *made) start(t *testing.T, cmd *exec.Cmd, cgroup string) *child {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(c.done) }()
	m.children = append(m.children, c)
	pid := strconv.Itoa(cmd.Process.Pid)
	if cgroup != "" {
		for _, h := range v1Hierarchies() {
			if err := os.WriteFile(filepath.Join(h, cgroup, "cgroup.procs"), []byte(pid), 0o644); err != nil {
				t.Fatalf("moving %s into %s: %v", pid, filepath.Join(h, cgroup), err)
			}
		}
	}
	return c
}

// freeze freezes the cgroup path in the freezer hierarchy and waits until
// its state reads FROZEN.
func (m *made) freeze(t *testing.T, path string) {
	t.Helper()
	state := filepath.Join(freezerHierarchy(), path, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0o644); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, path+" frozen", func() error {
		if got := freezerState(path); got != "FROZEN" {
			return fmt.Errorf("got %s, want FROZEN", got)
		}
		return nil
	})
}

// freezerState is the state of the cgroup path in the freezer hierarchy,
// or the error reading it.
func freezerState(path string) string {
	b, err := os.ReadFile(filepath.Join(freezerHierarchy(), path, "freezer.state"))
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

// cleanUp takes down what the test made and is left: it thaws the
// cgroups, parents first, kills and reaps the processes, unmounts, detaches
// the loop devices still attached to the test's files, removes the
// cgroups, deepest first, and the directories.
func (m *made) cleanUp(t *testing.T) {
	for _, cg := range m.cgroups {
		os.WriteFile(filepath.Join(freezerHierarchy(), cg, "freezer.state"), []byte("THAWED"), 0o644)
	}
	for _, c := range m.children {
		c.cmd.Process.Kill()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Errorf("clean-up: process %d does not end", c.cmd.Process.Pid)
		}
	}
	for i := len(m.mounts) - 1; i >= 0; i-- {
		syscall.Unmount(m.mounts[i], syscall.MNT_DETACH)
	}
	loops, _ := devices.ListLoops("/sys/block")
	for _, l := range loops {
		if file, ok := m.loops[l.Device]; ok && file == l.BackingFile {
			if err := devices.DetachLoop(l.Device); err != nil {
				t.Errorf("clean-up: %v", err)
			}
		}
	}
	for i := len(m.cgroups) - 1; i >= 0; i-- {
		for _, h := range hierarchies() {
			if err := os.Remove(filepath.Join(h, m.cgroups[i])); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("clean-up: %v", err)
			}
		}
	}
	for _, d := range m.dirs {
		os.RemoveAll(d)
	}
}

// ended checks that c ends within timeout, killed by SIGKILL, and is
// reaped.
func (c *child) ended(t *testing.T, what string) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Errorf("%s (process %d) still runs, state %s", what, c.cmd.Process.Pid, processState(c.cmd.Process.Pid))
		return
	}
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("%s (process %d) ended with %v, want killed by SIGKILL", what, c.cmd.Process.Pid, c.cmd.ProcessState)
	}
}

// runs checks that c still runs.
func (c *child) runs(t *testing.T, what string) {
	t.Helper()
	select {
	case <-c.done:
		t.Errorf("%s (process %d) ended (%v), want it running", what, c.cmd.Process.Pid, c.cmd.ProcessState)
	default:
	}
}

// processState is the state letter /proc gives the process pid (D for a
// frozen one), or the error reading it.
func processState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return err.Error()
	}
	return string(b[strings.LastIndexByte(string(b), ')')+2])
}

package runs

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// The node's directories in the tables below, as a run lays them out: the
// first node's in the run's directory, the second's under nodes/.
const (
	aRun       = "/tmp/converge-e2e-1"
	firstData  = aRun + "/converge/volumes"
	firstPools = aRun + "/pools"
	secondDir  = aRun + "/nodes/b"
	secondData = secondDir + "/converge/volumes"
	secondPool = secondDir + "/pools"
	// poolFS is the device number of the first node's pool fast, a
	// filesystem of its own; otherFS is the run directory's.
	poolFS  = 7<<8 | 0
	otherFS = 8<<8 | 1
)

// TestPickLoops checks which loop devices a node's reboot detaches: its
// images' and their holders', and never its disks' (the images of its
// pools' filesystems), another node's or the machine's.
func TestPickLoops(t *testing.T) {
	firstDirs := []string{firstData, firstPools}
	tests := []struct {
		name  string
		loops []loopFile
		dirs  []string
		fss   []uint64
		want  map[string]string
	}{
		{
			name:  "none",
			dirs:  firstDirs,
			loops: nil,
			want:  map[string]string{},
		},
		{
			name: "the node's images, in its data directory and its pool",
			dirs: firstDirs,
			loops: []loopFile{
				{device: "/dev/loop1", file: firstData + "/pvc-1.img", fs: otherFS},
				{device: "/dev/loop2", file: firstPools + "/fast/pvc-2.img", fs: poolFS},
			},
			want: map[string]string{"/dev/loop1": firstData + "/pvc-1.img", "/dev/loop2": firstPools + "/fast/pvc-2.img"},
		},
		{
			name: "the node's disks are not its images",
			dirs: firstDirs,
			fss:  []uint64{poolFS},
			loops: []loopFile{
				{device: "/dev/loop0", file: aRun + "/pool-fast.img", fs: otherFS},
				{device: "/dev/loop3", file: secondDir + "/data.img", fs: otherFS},
				{device: "/dev/loop4", file: firstData + "/pvc-4.img", fs: otherFS},
			},
			want: map[string]string{"/dev/loop4": firstData + "/pvc-4.img"},
		},
		{
			name: "the second node's disk is not its image",
			dirs: []string{secondData, secondPool},
			fss:  []uint64{9<<8 | 0},
			loops: []loopFile{
				{device: "/dev/loop3", file: secondDir + "/data.img", fs: otherFS},
				{device: "/dev/loop5", file: secondData + "/pvc-5.img", fs: 9<<8 | 0},
				{device: "/dev/loop6", file: firstData + "/pvc-6.img", fs: otherFS},
			},
			want: map[string]string{"/dev/loop5": secondData + "/pvc-5.img"},
		},
		{
			name: "another node's images and the machine's are not the node's",
			dirs: firstDirs,
			loops: []loopFile{
				{device: "/dev/loop5", file: secondData + "/pvc-5.img", fs: otherFS},
				{device: "/dev/loop6", file: "/var/lib/snapd/snaps/core.snap", fs: otherFS},
				{device: "/dev/loop7", file: firstData + "-old/pvc-7.img", fs: otherFS},
				{device: "/dev/loop8", file: aRun + "/converge/store.img", fs: otherFS},
			},
			want: map[string]string{},
		},
		{
			name: "an image deleted on the node's own filesystem, which no name finds",
			dirs: firstDirs,
			fss:  []uint64{poolFS},
			loops: []loopFile{
				{device: "/dev/loop2", file: "/pvc-2.img (deleted)", fs: poolFS},
				{device: "/dev/loop9", file: "/pvc-9.img", fs: otherFS},
			},
			want: map[string]string{"/dev/loop2": "/pvc-2.img (deleted)"},
		},
		{
			name: "holders of the node's images, at any depth, in any order",
			dirs: firstDirs,
			loops: []loopFile{
				{device: "/dev/loop12", file: "/dev/loop11", holds: "/dev/loop11"},
				{device: "/dev/loop11", file: "/var/lib/kubelet/plugins/x", holds: "/dev/loop10"},
				{device: "/dev/loop10", file: firstData + "/pvc-10.img", fs: otherFS},
			},
			want: map[string]string{
				"/dev/loop10": firstData + "/pvc-10.img",
				"/dev/loop11": "holds /dev/loop10",
				"/dev/loop12": "holds /dev/loop11",
			},
		},
		{
			name: "a holder is picked by what it holds, not by its name",
			dirs: firstDirs,
			fss:  []uint64{poolFS},
			loops: []loopFile{
				{device: "/dev/loop0", file: aRun + "/pool-fast.img", fs: otherFS},
				{device: "/dev/loop13", file: firstData + "/disk", fs: poolFS, holds: "/dev/loop0"},
				{device: "/dev/loop14", file: firstData + "/other", fs: otherFS, holds: "8:1"},
			},
			want: map[string]string{},
		},
		{
			name: "a directory of \"\" or \"/\" takes nothing",
			dirs: []string{"", "/"},
			loops: []loopFile{
				{device: "/dev/loop1", file: firstData + "/pvc-1.img", fs: otherFS},
			},
			want: map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pickLoops(tt.loops, tt.dirs, tt.fss)
			if !maps.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLoopMountsAt checks which of a node's directories are filesystems
// of their own that a soak may fill: a whole filesystem of a loop device
// on top at the directory, never the machine's disk.
func TestLoopMountsAt(t *testing.T) {
	loop := func(path string, minor uint32) host.Mount {
		return host.Mount{Path: path, Root: "/", Dev: host.DevNum{Major: loopMajor, Minor: minor}}
	}
	disk := func(path string) host.Mount {
		return host.Mount{Path: path, Root: "/", Dev: host.DevNum{Major: 8, Minor: 1}}
	}
	tests := []struct {
		name   string
		mounts []host.Mount
		dirs   []string
		want   []string
	}{
		{
			name:   "the pool's filesystem",
			mounts: []host.Mount{disk("/"), loop(firstPools+"/fast", 0)},
			dirs:   []string{firstData, firstPools + "/fast"},
			want:   []string{firstPools + "/fast"},
		},
		{
			name:   "the second node's data directory",
			mounts: []host.Mount{disk("/"), loop(secondData, 3)},
			dirs:   []string{secondData},
			want:   []string{secondData},
		},
		{
			name:   "a directory on a loop-backed /tmp is not a filesystem of its own",
			mounts: []host.Mount{disk("/"), loop("/tmp", 1)},
			dirs:   []string{firstData, aRun},
			want:   nil,
		},
		{
			name:   "the machine's disk mounted on top",
			mounts: []host.Mount{loop(firstPools+"/fast", 0), disk(firstPools + "/fast")},
			dirs:   []string{firstPools + "/fast"},
			want:   nil,
		},
		{
			name:   "a bind of a directory of a loop device's filesystem",
			mounts: []host.Mount{{Path: secondData, Root: "/sub", Dev: host.DevNum{Major: loopMajor, Minor: 3}}},
			dirs:   []string{secondData},
			want:   nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := loopMountsAt(tt.mounts, tt.dirs)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// TestNodeLoopsDetachesImagesAndHolders makes on the real kernel, without
// a cluster or a run, the loop devices a node leaves when its processes
// die: images of its data directory and of its pool's filesystem,
// attached through mounts of namespaces that have ended (as csi-node's
// container's), one deleted since, and a kubelet's holder of one. A
// reboot's NodeLoops must list those and DetachLoops detach them, and
// both leave the pool's own device (the node's disk) and an image of
// another's attached.
func TestNodeLoopsDetachesImagesAndHolders(t *testing.T) {
	needLoops(t)
	node := t.TempDir() // removed after m's clean-up has unmounted the pool
	m := newMade(t)
	stateDir := filepath.Join(node, "converge")
	dataDir := filepath.Join(stateDir, "volumes")
	poolsDir := filepath.Join(node, "pools")
	pool := filepath.Join(poolsDir, "fast")
	disk := m.filesystem(t, filepath.Join(node, "pool-fast.img"), pool)
	for _, f := range []string{filepath.Join(dataDir, "pvc-1.img"), filepath.Join(pool, "pvc-2.img"), filepath.Join(pool, "pvc-3.img")} {
		sparseFile(t, f, 1<<20)
	}
	mnt := t.TempDir()
	dataImage := attachIn(t, `mount --bind "$1" "$2"; losetup -f --show "$2/volumes/pvc-1.img"`, stateDir, mnt)
	poolImage := attachIn(t, `mount --bind "$1" "$2"; losetup -f --show "$2/pvc-2.img"`, pool, mnt)
	deleted := attachIn(t, `mount --bind "$1" "$2"; losetup -f --show "$2/pvc-3.img"; rm "$2/pvc-3.img"`, pool, mnt)
	holder := attachIn(t, `losetup -f --show "$1"`, poolImage)
	other := m.loop(t, filepath.Join(t.TempDir(), "pvc-9.img"), 1<<20)

	loops := NodeLoops(NodeStorage{
		Dirs:        []string{dataDir, poolsDir},
		Roots:       []string{stateDir, dataDir, poolsDir, pool},
		Filesystems: LoopFilesystems(pool),
	})
	want := []string{dataImage, poolImage, deleted, holder}
	if got := slices.Sorted(maps.Keys(loops)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("NodeLoops: got %v, want %v", loops, want)
	}
	if got, want := loops[dataImage], filepath.Join(dataDir, "pvc-1.img"); got != want {
		t.Errorf("the data directory's image %s: got %q, want %q", dataImage, got, want)
	}
	if got, want := loops[holder], "holds "+poolImage; got != want {
		t.Errorf("the holder %s: got %q, want %q", holder, got, want)
	}
	ids := map[string]loopID{}
	for _, dev := range append(want, disk, other) {
		ids[dev], _ = identity(dev)
	}
	if err := DetachLoops(loops, 10*time.Second); err != nil {
		t.Errorf("DetachLoops: %v", err)
	}
	for _, dev := range want {
		if now, ok := identity(dev); ok && now == ids[dev] {
			t.Errorf("%s (%s) is still attached", dev, loops[dev])
		}
	}
	for what, dev := range map[string]string{"the pool's own device": disk, "another's image": other} {
		if now, ok := identity(dev); !ok || now != ids[dev] {
			t.Errorf("%s, %s, was detached", what, dev)
		}
	}
}

// needLoops skips t unless it runs as root on a machine with loop
// devices, mkfs.ext4 and unshare. It makes no run: a live one is no
// obstacle.
func needLoops(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes loop devices and mounts")
	}
	for _, tool := range []string{"mkfs.ext4", "unshare", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
}

// sparseFile makes a sparse file of size bytes, and its directory.
func sparseFile(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// attachIn runs script (sh, with args) in a mount namespace of its own,
// which ends with it, and returns the loop device it prints; the device
// is detached when t ends if it is still attached to the same file.
func attachIn(t *testing.T, script string, args ...string) string {
	t.Helper()
	out, err := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-ec", script, "sh"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
	dev := strings.TrimSpace(string(out))
	id, ok := identity(dev)
	if !ok {
		t.Fatalf("%s: %q is no loop device", script, dev)
	}
	t.Cleanup(func() {
		if now, ok := identity(dev); ok && now == id {
			devices.DetachLoop(dev)
		}
	})
	return dev
}

// TestFreezeCgroupsStopsTheNodeAlone: a reboot stops every process of the
// node's pods before it cuts their filesystems, as a power loss stops them
// all at once. A cut that fell while a writer's fsync was under way could
// let that fsync return success for a record the cut then lost, which the
// writer would acknowledge (a soak saw it). FreezeCgroups returns only
// once the node's pods are stopped, and leaves another node's running.
func TestFreezeCgroupsStopsTheNodeAlone(t *testing.T) {
	needMachine(t)
	m := newMade(t)
	dir := m.run(t, "")
	root, other := CgroupRoot(dir, "a"), CgroupRoot(dir, "b")
	pod, otherPod := root[1:]+"/kubepods/pod1", other[1:]+"/kubepods/pod1"
	m.cgroup(t, pod)
	m.cgroup(t, otherPod)
	counter := func(name string) (string, func() string) {
		f := filepath.Join(dir, name)
		// The last line written whole.
		read := func() string {
			b, _ := os.ReadFile(f)
			lines := strings.Split(string(b), "\n")
			if len(lines) < 2 {
				return ""
			}
			return lines[len(lines)-2]
		}
		return f, read
	}
	// Writers that never sleep: each appends its counter as fast as it
	// can, a line a write.
	busy := func(f string) *exec.Cmd {
		return exec.Command("sh", "-c", `i=0; while :; do i=$((i+1)); echo $i >> "$1"; done`, "sh", f)
	}
	f, read := counter("a")
	otherF, otherRead := counter("b")
	m.start(t, busy(f), pod)
	m.start(t, busy(otherF), otherPod)
	// value reads a writer's counter, again until it has written one.
	value := func(what string, read func() string) int {
		t.Helper()
		var n int
		poll.Until(t, 10*time.Second, time.Millisecond, what+" reading", func() error {
			_, err := fmt.Sscan(read(), &n)
			return err
		})
		return n
	}
	// advances waits until a writer's counter has gone 1000 past what it
	// reads now: long enough for any writer that runs to have written.
	advances := func(what string, read func() string) {
		t.Helper()
		from := value(what, read)
		poll.Until(t, 10*time.Second, time.Millisecond, what+" going on", func() error {
			if now := value(what, read); now < from+1000 {
				return fmt.Errorf("its counter went from %d to %d", from, now)
			}
			return nil
		})
	}
	advances("the node's writer", read)

	if err := FreezeCgroups(root, 10*time.Second, nil); err != nil {
		t.Fatalf("FreezeCgroups: %v", err)
	}
	stopped := value("the node's writer", read)
	if got := freezerState(pod); got != "FROZEN" {
		t.Errorf("the node's pod: got %s, want FROZEN", got)
	}
	if got := freezerState(otherPod); got != "THAWED" {
		t.Errorf("the other node's pod: got %s, want THAWED", got)
	}
	advances("the other node's writer", otherRead)
	if now := value("the node's writer", read); now != stopped {
		t.Errorf("the node's writer went on while frozen: its counter went from %d to %d", stopped, now)
	}

	if still := ThawCgroups(root); len(still) > 0 {
		t.Fatalf("ThawCgroups: still frozen: %q", still)
	}
	advances("the node's writer, thawed", read)

	if err := FreezeCgroups("/not-a-run", time.Second, nil); err == nil {
		t.Error("FreezeCgroups of a root that is not a run's: got nil, want an error")
	}
}

// TestFreezeCgroupsOfAStuckProcess: a process in a sleep that does not
// freeze (a direct write to a loop device whose backing file lies on a
// frozen filesystem: the device's I/O waits for the thaw) keeps its
// cgroup from freezing, as a writer waits on a volume that a stopped
// csi-node froze for a snapshot. Without an unblock, FreezeCgroups gives
// up at its timeout (ErrNotStopped), names the process, and thaws the node
// again: the reboot it stands before is refused rather than cut with the
// write under way, and nothing of the node stays frozen. With an unblock
// that thaws the filesystem, the write ends and the node freezes.
func TestFreezeCgroupsOfAStuckProcess(t *testing.T) {
	needMachine(t)
	if _, err := exec.LookPath("fsfreeze"); err != nil {
		t.Skipf("needs fsfreeze: %v", err)
	}
	m := newMade(t)
	dir := m.run(t, "")
	root := CgroupRoot(dir, "a")
	pod := root[1:] + "/kubepods/pod1"
	m.cgroup(t, pod)
	outer := filepath.Join(dir, "outer")
	m.filesystem(t, filepath.Join(dir, "outer.img"), outer)
	inner := m.loop(t, filepath.Join(outer, "inner.img"), 1<<20)
	thawOuter := func() { exec.Command("fsfreeze", "-u", outer).Run() }
	// Before m's clean-up: the write waits for the thaw, and the inner
	// device, named by its path in outer, would not be found once outer
	// is unmounted.
	t.Cleanup(func() {
		thawOuter()
		if err := devices.DetachLoop(inner); err != nil {
			t.Errorf("clean-up: %v", err)
		}
	})
	if out, err := exec.Command("fsfreeze", "-f", outer).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze -f %s: %v: %s", outer, err, out)
	}
	write := m.start(t, exec.Command("dd", "if=/dev/zero", "of="+inner, "bs=4096", "count=1", "oflag=direct"), pod)
	pid := write.cmd.Process.Pid
	inflight := filepath.Join("/sys/block", filepath.Base(inner), "inflight")
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the write waiting for its device", func() error {
		b, err := os.ReadFile(inflight)
		if err != nil {
			return err
		}
		var reads, writes int
		if _, err := fmt.Sscan(string(b), &reads, &writes); err != nil || writes == 0 {
			return fmt.Errorf("%s reads %q", inflight, b)
		}
		if got := processState(pid); got != "D" {
			return fmt.Errorf("process %d is in state %s", pid, got)
		}
		return nil
	})

	err := FreezeCgroups(root, time.Second, nil)
	t.Logf("FreezeCgroups: %v", err)
	if !errors.Is(err, ErrNotStopped) {
		t.Fatalf("FreezeCgroups with a process that cannot stop: got %v, want ErrNotStopped", err)
	}
	if want := fmt.Sprintf("%d dd in ", pid); !strings.Contains(err.Error(), want) {
		t.Errorf("FreezeCgroups's error does not name the stuck process (%q)", want)
	}
	for _, cg := range []string{root[1:], pod} {
		if got := freezerState(cg); got != "THAWED" {
			t.Errorf("cgroup %s after FreezeCgroups gave up: got %s, want THAWED", cg, got)
		}
	}

	if err := FreezeCgroups(root, 10*time.Second, thawOuter); err != nil {
		t.Fatalf("FreezeCgroups with an unblock that thaws the filesystem: %v", err)
	}
	if got := freezerState(pod); got != "FROZEN" {
		t.Errorf("the pod after FreezeCgroups with an unblock: got %s, want FROZEN", got)
	}
	if still := ThawCgroups(root); len(still) > 0 {
		t.Fatalf("ThawCgroups: still frozen: %q", still)
	}
	select {
	case <-write.done:
	case <-time.After(10 * time.Second):
		t.Errorf("the write (process %d) does not end once its filesystem is thawed, state %s", pid, processState(pid))
	}
}

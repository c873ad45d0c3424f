package devices

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/test/testenv/loops"
)

// blkioRoot is where this machine's cgroup v1 blkio hierarchy is.
const blkioRoot = "/sys/fs/cgroup/blkio"

// needBlkio skips a test that needs the kernel's cgroup v1 blkio
// controller and the privilege to make cgroups and loop devices.
func needBlkio(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups and loop devices")
	}
	if _, err := os.Stat(filepath.Join(blkioRoot, "blkio.throttle.read_iops_device")); err != nil {
		t.Skipf("needs cgroup v1 blkio with throttling: %v", err)
	}
}

// kubeletCgroupsV1 makes, in the blkio hierarchy, the cgroups the kubelet
// (cgroupfs driver) and the runtime make for a burstable pod with a
// container and a sandbox, below a cgroupRoot of the test's own, and a
// second pod; they are removed, deepest first, when the test ends. It
// returns the pod's, the container's and the sandbox's cgroups.
func kubeletCgroupsV1(t *testing.T) (pod, ctr, sandbox string) {
	t.Helper()
	cgroupRoot := fmt.Sprintf("converge-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	burstable := filepath.Join(blkioRoot, cgroupRoot, "kubepods", "burstable")
	pod = filepath.Join(burstable, "pod"+testPodUID)
	ctr = filepath.Join(pod, strings.Repeat("c1", 32))
	sandbox = filepath.Join(pod, strings.Repeat("5a", 32))
	var made []string
	t.Cleanup(func() {
		for _, d := range slices.Backward(made) {
			if err := unix.Rmdir(d); err != nil {
				t.Errorf("removing cgroup %s: %v", d, err)
			}
		}
	})
	for _, d := range []string{ctr, sandbox, filepath.Join(burstable, "pod"+testPodUID2)} {
		var missing []string
		for p := d; p != blkioRoot && !isDir(p); p = filepath.Dir(p) {
			missing = append(missing, p)
		}
		for _, p := range slices.Backward(missing) {
			if err := unix.Mkdir(p, 0o755); err != nil {
				t.Fatalf("making cgroup %s: %v", p, err)
			}
			made = append(made, p)
		}
	}
	return pod, ctr, sandbox
}

// testLoopDevice attaches a loop device over a sparse image of size
// bytes, released when the test ends, and returns its node and number.
func testLoopDevice(t *testing.T, size int64) (string, host.DevNum) {
	t.Helper()
	dir := t.TempDir()
	image := filepath.Join(dir, "v.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, size); err != nil {
		t.Fatal(err)
	}
	dev, err := AttachLoop(image, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loops.Release(dev, dir) })
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return dev, host.DevNum{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}
}

// TestCgroupThrottleV1Kernel sets, changes and removes a loop device's
// rules in the real blkio files of every cgroup of a pod, found below a
// cgroupRoot prefix: what Throttle reads back is what SetThrottle set, the
// files read as the kernel prints them, a second SetThrottle writes
// nothing, and the least value, 1, is taken.
func TestCgroupThrottleV1Kernel(t *testing.T) {
	needBlkio(t)
	pod, ctr, sandbox := kubeletCgroupsV1(t)
	_, dev := testLoopDevice(t, 1<<20)
	c, err := DetectCgroupIO("/sys/fs/cgroup")
	if err != nil || c.Version != 1 {
		t.Fatalf("DetectCgroupIO: got version %d, %v; want 1", c.Version, err)
	}
	dirs, err := c.PodCgroups(testPodUID)
	if want := []string{pod, ctr, sandbox}; err != nil || !sameSet(dirs, want) {
		t.Fatalf("PodCgroups: got %v, %v; want %v", dirs, err, want)
	}
	writes := 0
	c.write = func(path, rule string) error { writes++; return writeCgroupFile(path, rule) }
	d := formatCgroupDev(dev)
	for _, step := range []struct {
		name     string
		l        host.IOLimits
		writes   int
		readIOPS string // blkio.throttle.read_iops_device
	}{
		{name: "set", l: host.IOLimits{ReadIOPS: 200, WriteIOPS: 100, ReadBPS: 1 << 20, WriteBPS: 2 << 20}, writes: 4, readIOPS: d + " 200\n"},
		{name: "again", l: host.IOLimits{ReadIOPS: 200, WriteIOPS: 100, ReadBPS: 1 << 20, WriteBPS: 2 << 20}, readIOPS: d + " 200\n"},
		{name: "change", l: host.IOLimits{ReadIOPS: 1, WriteBPS: 2 << 20}, writes: 3, readIOPS: d + " 1\n"},
		{name: "remove", l: host.IOLimits{}, writes: 2, readIOPS: ""},
		{name: "remove again", l: host.IOLimits{}, readIOPS: ""},
	} {
		t.Run(step.name, func(t *testing.T) {
			for _, dir := range dirs {
				writes = 0
				if err := c.SetThrottle(dir, dev, step.l); err != nil {
					t.Fatal(err)
				}
				if writes != step.writes {
					t.Errorf("%s: writes: got %d, want %d", dir, writes, step.writes)
				}
				if got, err := c.Throttle(dir, dev); err != nil || got != step.l {
					t.Errorf("%s: Throttle: got %+v, %v; want %+v", dir, got, err, step.l)
				}
				if b, err := os.ReadFile(filepath.Join(dir, v1Knobs[0].file)); err != nil || string(b) != step.readIOPS {
					t.Errorf("%s: %s: got %q, %v; want %q", dir, v1Knobs[0].file, b, err, step.readIOPS)
				}
			}
		})
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestCgroupThrottleV1Limits measures the kernel limiting a container's
// reads of a loop device: dd, moved into the container's cgroup before it
// reads, reads throttleReads blocks with direct IO, at no more than
// throttleIOPS a second with the rules SetThrottle wrote for the pod, and
// far faster once they are removed. A rule in the pod's cgroup alone
// leaves the container's reads unlimited: v1's groups are flat, which is
// why PodCgroups lists every cgroup of the pod there.
func TestCgroupThrottleV1Limits(t *testing.T) {
	needBlkio(t)
	const throttleIOPS, throttleReads = 200, 400
	pod, ctr, _ := kubeletCgroupsV1(t)
	node, dev := testLoopDevice(t, 4<<20)
	c, err := DetectCgroupIO("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := c.PodCgroups(testPodUID)
	if err != nil {
		t.Fatal(err)
	}
	setAll := func(l host.IOLimits) {
		for _, dir := range dirs {
			if err := c.SetThrottle(dir, dev, l); err != nil {
				t.Fatal(err)
			}
		}
	}
	least := time.Duration(0.8 * throttleReads / throttleIOPS * float64(time.Second))
	setAll(host.IOLimits{ReadIOPS: throttleIOPS})
	limited := readsIn(t, ctr, node, throttleReads)
	setAll(host.IOLimits{})
	free := readsIn(t, ctr, node, throttleReads)
	if err := c.SetThrottle(pod, dev, host.IOLimits{ReadIOPS: throttleIOPS}); err != nil {
		t.Fatal(err)
	}
	podOnly := readsIn(t, ctr, node, throttleReads)
	t.Logf("%d direct reads of 4 KiB: %v at %d IOPS, %v without a limit, %v with the limit in the pod's cgroup alone",
		throttleReads, limited, throttleIOPS, free, podOnly)
	if limited < least {
		t.Errorf("with a read limit of %d IOPS, %d reads took %v, want at least %v", throttleIOPS, throttleReads, limited, least)
	}
	if free > least/4 {
		t.Errorf("without a limit, %d reads took %v, want less than %v", throttleReads, free, least/4)
	}
	if podOnly > least/4 {
		t.Errorf("with the limit in the pod's cgroup alone, %d reads in its container took %v, want less than %v (v1 is flat)", throttleReads, podOnly, least/4)
	}
}

// readsIn runs dd in the cgroup dir (it moves itself there before it
// opens the device) to read n blocks of 4 KiB of dev with direct IO, and
// returns how long it ran.
func readsIn(t *testing.T, dir, dev string, n int) time.Duration {
	t.Helper()
	cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec dd if="$2" of=/dev/null iflag=direct bs=4k count="$3"`,
		"sh", dir, dev, fmt.Sprint(n))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("dd in %s: %v: %s", dir, err, out)
	}
	if !strings.Contains(string(out), fmt.Sprintf("%d+0 records in", n)) {
		t.Fatalf("dd in %s read less than %d blocks: %s", dir, n, out)
	}
	return took
}

package devices

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/converge-csi/converge/pkg/host"
)

const (
	testPodUID  = "0b5c8f1e-32c4-4b7a-9d1e-8a2f6c3d4e5f"
	testPodUID2 = "7d1e2f3a-0000-4b7a-9d1e-000000000002"
)

// fakeIOMax stands in for the kernel behind the plain io.max files of a
// fake cgroup v2 hierarchy, as block/blk-throttle.c's tg_set_limit and
// tg_prfill_limit do: a write names one device and some keys, the keys
// not given keep their value, 0 is refused (ERANGE) and an unknown key or
// value too (EINVAL), an IOPS value above UINT_MAX is none; the file then
// reads one line per device with a rule, all four keys, max for none.
type fakeIOMax struct{ writes int }

func (k *fakeIOMax) write(path, rule string) error {
	k.writes++
	if filepath.Base(path) != ioMaxFile {
		return fmt.Errorf("fake kernel: %s is not io.max", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	f := strings.Fields(rule)
	if len(f) == 0 {
		return syscall.EINVAL
	}
	var lines []string
	var vals []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if dev, rest, _ := strings.Cut(line, " "); dev == f[0] {
			vals = strings.Fields(rest)
		} else if line != "" {
			lines = append(lines, line)
		}
	}
	if vals == nil {
		vals = []string{"rbps=max", "wbps=max", "riops=max", "wiops=max"}
	}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.ParseUint(v, 10, 64)
		switch {
		case err != nil && v != "max":
			return syscall.EINVAL
		case err == nil && n == 0:
			return syscall.ERANGE
		case err == nil && n >= 1<<32-1 && strings.HasSuffix(k, "iops"):
			v = "max"
		}
		i := ioMaxKeyIndex(k)
		if i < 0 {
			return syscall.EINVAL
		}
		vals[i] = k + "=" + v
	}
	if strings.Join(vals, " ") != "rbps=max wbps=max riops=max wiops=max" {
		lines = append(lines, f[0]+" "+strings.Join(vals, " "))
	}
	out := strings.Join(lines, "\n")
	if out != "" {
		out += "\n"
	}
	return os.WriteFile(path, []byte(out), 0o644)
}

// fakeCgroupV2 lays out a cgroup v2 hierarchy below a temporary root as
// the kubelet does under the cgroupRoot /run1-node1, for the driver
// given: a burstable pod with a container and its sandbox, a guaranteed
// pod, and a system slice; every cgroup but the root has an empty io.max.
// It returns the root, the two pods' cgroups and the burstable pod's
// container's.
func fakeCgroupV2(t *testing.T, driver string) (root, pod, pod2, ctr string) {
	t.Helper()
	root = t.TempDir()
	writeFile(t, filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n")
	writeFile(t, filepath.Join(root, "cgroup.subtree_control"), "cpu io memory pids\n")
	uid_ := strings.ReplaceAll(testPodUID, "-", "_")
	uid2_ := strings.ReplaceAll(testPodUID2, "-", "_")
	kube := filepath.Join(root, "run1-node1", "kubepods")
	pod = filepath.Join(kube, "burstable", "pod"+testPodUID)
	pod2 = filepath.Join(kube, "pod"+testPodUID2)
	ctr = filepath.Join(pod, strings.Repeat("c1", 32))
	sandbox := filepath.Join(pod, strings.Repeat("5a", 32))
	if driver == "systemd" {
		kube = filepath.Join(root, "run1-node1", "kubepods.slice")
		pod = filepath.Join(kube, "kubepods-burstable.slice", "kubepods-burstable-pod"+uid_+".slice")
		pod2 = filepath.Join(kube, "kubepods-pod"+uid2_+".slice")
		ctr = filepath.Join(pod, "cri-containerd-"+strings.Repeat("c1", 32)+".scope")
		sandbox = filepath.Join(pod, "cri-containerd-"+strings.Repeat("5a", 32)+".scope")
	}
	for _, d := range []string{ctr, sandbox, pod2, filepath.Join(root, "system.slice", "containerd.service")} {
		for p := d; p != root; p = filepath.Dir(p) {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(p, ioMaxFile)); err != nil {
				writeFile(t, filepath.Join(p, ioMaxFile), "")
			}
		}
	}
	return root, pod, pod2, ctr
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCgroupDetect finds the io controller on v1 (and on a hybrid
// machine, where v2 is mounted without it), on v2, and says what is
// missing when there is none.
func TestCgroupDetect(t *testing.T) {
	for _, c := range []struct {
		name        string
		files       map[string]string
		version     int
		sub, reason string
		// problem is in Problem: the controller is there, not enabled
		// where the pods' cgroups are.
		problem string
	}{
		{name: "v1", files: map[string]string{"blkio/blkio.throttle.read_iops_device": ""}, version: 1, sub: "blkio"},
		{name: "hybrid", files: map[string]string{"blkio/blkio.throttle.read_iops_device": "", "unified/cgroup.controllers": ""}, version: 1, sub: "blkio"},
		{name: "v2", files: map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n"}, version: 2},
		{name: "v2 enabled", version: 2, files: map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n", "cgroup.subtree_control": "cpu io memory\n",
			"kubepods.slice/io.max": "", "kubepods.slice/cgroup.subtree_control": "cpu io memory\n"}},
		{name: "v2 io not in the root's subtree_control", version: 2, problem: "io is not in",
			files: map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n", "cgroup.subtree_control": "cpu memory\n", "kubepods.slice/cgroup.procs": ""}},
		{name: "v2 kubepods without io.max", version: 2, problem: "kubepods has no io.max: enable io in",
			files: map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n", "cgroup.subtree_control": "cpu io memory\n", "run1-node1/kubepods/cgroup.procs": ""}},
		{name: "v2 kubepods without io in its subtree_control", version: 2, problem: "kubepods.slice/cgroup.subtree_control",
			files: map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n", "kubepods.slice/io.max": "", "kubepods.slice/cgroup.subtree_control": "cpu memory\n"}},
		{name: "v2 without io", files: map[string]string{"cgroup.controllers": "cpuset cpu iomem memory\n"}, reason: "does not list io"},
		{name: "none", files: map[string]string{"blkio/cgroup.procs": ""}, reason: "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for p, content := range c.files {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(root, p), content)
			}
			got, err := DetectCgroupIO(root)
			if c.reason != "" {
				if err == nil || !strings.Contains(err.Error(), "no io controller") || !strings.Contains(err.Error(), c.reason) {
					t.Fatalf("got %+v, %v; want an error saying no io controller: %s", got, err, c.reason)
				}
				return
			}
			if err != nil || got.Version != c.version || got.Root != filepath.Join(root, c.sub) {
				t.Fatalf("got version %d at %s, %v; want %d at %s", got.Version, got.Root, err, c.version, filepath.Join(root, c.sub))
			}
			if c.problem == "" && got.Problem != "" || !strings.Contains(got.Problem, c.problem) {
				t.Errorf("Problem: got %q, want %q in it", got.Problem, c.problem)
			}
		})
	}
}

// TestCgroupPodCgroupsV2 finds pods' cgroups in a hierarchy laid out as
// each of the kubelet's cgroup drivers lays it out below a cgroupRoot: on
// v2 the pod's cgroup alone, since its rules bind its whole subtree. It
// finds a pod again once its cgroup moved, and tells a pod it cannot find
// apart from a UID it refuses.
func TestCgroupPodCgroupsV2(t *testing.T) {
	for _, driver := range []string{"cgroupfs", "systemd"} {
		t.Run(driver, func(t *testing.T) {
			root, pod, pod2, _ := fakeCgroupV2(t, driver)
			c, err := DetectCgroupIO(root)
			if err != nil {
				t.Fatal(err)
			}
			for uid, want := range map[string]string{testPodUID: pod, testPodUID2: pod2} {
				if got, err := c.PodCgroups(uid); err != nil || len(got) != 1 || got[0] != want {
					t.Errorf("PodCgroups(%s): got %v, %v; want [%s]", uid, got, err, want)
				}
			}
			// The pod's cgroup goes, and the pod is found elsewhere (as a
			// fake for a cgroup made again, in a shape of the kubelet's): the
			// remembered one is not used.
			moved := filepath.Join(filepath.Dir(pod2), filepath.Base(pod))
			if driver == "systemd" {
				moved = filepath.Join(filepath.Dir(pod2), "kubepods-pod"+strings.ReplaceAll(testPodUID, "-", "_")+".slice")
			}
			if err := os.Rename(pod, moved); err != nil {
				t.Fatal(err)
			}
			if got, err := c.PodCgroups(testPodUID); err != nil || len(got) != 1 || got[0] != moved {
				t.Errorf("PodCgroups after the move: got %v, %v; want [%s]", got, err, moved)
			}
			if err := os.RemoveAll(moved); err != nil {
				t.Fatal(err)
			}
			if got, err := c.PodCgroups(testPodUID); !errors.Is(err, ErrPodCgroupNotFound) {
				t.Errorf("PodCgroups of a pod gone: got %v, %v; want ErrPodCgroupNotFound", got, err)
			}
			for _, uid := range []string{"", "../pod" + testPodUID2, "a_b"} {
				if got, err := c.PodCgroups(uid); err == nil || errors.Is(err, ErrPodCgroupNotFound) {
					t.Errorf("PodCgroups(%q): got %v, %v; want it refused", uid, got, err)
				}
			}
		})
	}
}

// fakeCgroupIOV2 returns a CgroupIO on a fake cgroup v2 hierarchy laid
// out by the systemd driver, whose io.max writes go to a fake kernel.
func fakeCgroupIOV2(t *testing.T, driver string) (c CgroupIO, kernel *fakeIOMax, pod, pod2, ctr string) {
	t.Helper()
	root, pod, pod2, ctr := fakeCgroupV2(t, driver)
	c, err := DetectCgroupIO(root)
	if err != nil {
		t.Fatal(err)
	}
	kernel = &fakeIOMax{}
	c.write = kernel.write
	return c, kernel, pod, pod2, ctr
}

// TestCgroupThrottleV2 sets, changes and removes a device's rules in a
// pod's io.max, against a fake of the kernel's io.max: what Throttle reads
// is what SetThrottle set, another device's rule is left alone, and a
// second SetThrottle writes nothing.
func TestCgroupThrottleV2(t *testing.T) {
	for _, driver := range []string{"systemd", "cgroupfs"} {
		t.Run(driver, func(t *testing.T) {
			c, kernel, pod, pod2, _ := fakeCgroupIOV2(t, driver)
			other := "8:0 rbps=max wbps=max riops=max wiops=7\n"
			writeFile(t, filepath.Join(pod, ioMaxFile), other)
			for _, step := range []struct {
				name   string
				l      host.IOLimits
				writes int
				file   string
			}{
				{name: "set", l: host.IOLimits{ReadIOPS: 200, WriteBPS: 1 << 20}, writes: 1,
					file: other + "7:3 rbps=max wbps=1048576 riops=200 wiops=max\n"},
				{name: "again", l: host.IOLimits{ReadIOPS: 200, WriteBPS: 1 << 20},
					file: other + "7:3 rbps=max wbps=1048576 riops=200 wiops=max\n"},
				{name: "change", l: host.IOLimits{WriteIOPS: 1, ReadBPS: 2}, writes: 1,
					file: other + "7:3 rbps=2 wbps=max riops=max wiops=1\n"},
				{name: "remove", l: host.IOLimits{}, writes: 1, file: other},
				{name: "remove again", l: host.IOLimits{}, file: other},
			} {
				t.Run(step.name, func(t *testing.T) {
					kernel.writes = 0
					if err := c.SetThrottle(pod, loop3, step.l); err != nil {
						t.Fatal(err)
					}
					if kernel.writes != step.writes {
						t.Errorf("writes: got %d, want %d", kernel.writes, step.writes)
					}
					if got, err := c.Throttle(pod, loop3); err != nil || got != step.l {
						t.Errorf("Throttle: got %+v, %v; want %+v", got, err, step.l)
					}
					if b, _ := os.ReadFile(filepath.Join(pod, ioMaxFile)); string(b) != step.file {
						t.Errorf("io.max: got %q, want %q", b, step.file)
					}
				})
			}
			if got, err := c.Throttle(pod2, loop3); err != nil || !got.IsZero() {
				t.Errorf("Throttle without a rule: got %+v, %v; want none", got, err)
			}
		})
	}
}

// TestCgroupThrottleV2Refuses checks what SetThrottle and Throttle refuse,
// writing nothing: limits the kernel cannot hold, a cgroup outside the
// hierarchy, a cgroup gone (os.ErrNotExist), one without the io
// controller, and every call of the zero CgroupIO.
func TestCgroupThrottleV2Refuses(t *testing.T) {
	c, kernel, pod, _, ctr := fakeCgroupIOV2(t, "systemd")
	if err := c.SetThrottle(pod, loop3, host.IOLimits{ReadIOPS: host.MaxIOPS + 1}); err == nil {
		t.Errorf("SetThrottle beyond MaxIOPS: got %v, want refused", err)
	}
	if err := c.SetThrottle(filepath.Dir(c.Root), loop3, host.IOLimits{ReadIOPS: 2}); err == nil {
		t.Errorf("SetThrottle outside the hierarchy: got %v, want refused", err)
	}
	if _, err := c.Throttle(filepath.Join(pod, "gone"), loop3); !errors.Is(err, ErrCgroupGone) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Throttle of a cgroup gone: got %v, want ErrCgroupGone and os.ErrNotExist", err)
	}
	if err := c.SetThrottle(filepath.Join(pod, "gone"), loop3, host.IOLimits{ReadIOPS: 2}); !errors.Is(err, ErrCgroupGone) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("SetThrottle of a cgroup gone: got %v, want ErrCgroupGone and os.ErrNotExist", err)
	}
	// A cgroup that is there without io.max is not gone: its pod runs
	// unlimited, which is an error to report, not a cgroup to pass over.
	if err := os.Remove(filepath.Join(ctr, ioMaxFile)); err != nil {
		t.Fatal(err)
	}
	notEnabled := func(err error) bool {
		return errors.Is(err, ErrIONotEnabled) && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, ErrCgroupGone) &&
			strings.Contains(err.Error(), filepath.Join(filepath.Dir(ctr), "cgroup.subtree_control"))
	}
	if err := c.SetThrottle(ctr, loop3, host.IOLimits{ReadIOPS: 2}); !notEnabled(err) {
		t.Errorf("SetThrottle without io.max: got %v, want ErrIONotEnabled, not os.ErrNotExist, naming the parent's subtree_control", err)
	}
	if _, err := c.Throttle(ctr, loop3); !notEnabled(err) {
		t.Errorf("Throttle without io.max: got %v, want ErrIONotEnabled, not os.ErrNotExist, naming the parent's subtree_control", err)
	}
	if kernel.writes != 0 {
		t.Errorf("writes: got %d, want none", kernel.writes)
	}
	zero := CgroupIO{}
	if _, err := zero.PodCgroups(testPodUID); !errors.Is(err, errNoCgroupIO) {
		t.Errorf("zero CgroupIO's PodCgroups: got %v, want errNoCgroupIO", err)
	}
	if err := zero.SetThrottle(pod, loop3, host.IOLimits{}); !errors.Is(err, errNoCgroupIO) {
		t.Errorf("zero CgroupIO's SetThrottle: got %v, want errNoCgroupIO", err)
	}
}

// TestCgroupThrottleV1FileMissing checks, on a fake v1 hierarchy, that a
// cgroup without blkio's throttle files is ErrIONotEnabled and not gone,
// and that only a cgroup that is not there is ErrCgroupGone.
func TestCgroupThrottleV1FileMissing(t *testing.T) {
	root := t.TempDir()
	pod := filepath.Join(root, "blkio", "kubepods", "burstable", "pod"+testPodUID)
	if err := os.MkdirAll(pod, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "blkio", v1Knobs[0].file), "")
	c, err := DetectCgroupIO(root)
	if err != nil || c.Version != 1 {
		t.Fatalf("DetectCgroupIO: got version %d, %v; want 1", c.Version, err)
	}
	c.write = func(string, string) error { t.Error("write: want none"); return nil }
	if _, err := c.Throttle(pod, loop3); !errors.Is(err, ErrIONotEnabled) || errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), v1Knobs[0].file) {
		t.Errorf("Throttle without the throttle files: got %v, want ErrIONotEnabled naming %s, not os.ErrNotExist", err, v1Knobs[0].file)
	}
	if err := c.SetThrottle(pod, loop3, host.IOLimits{ReadIOPS: 2}); !errors.Is(err, ErrIONotEnabled) || errors.Is(err, os.ErrNotExist) {
		t.Errorf("SetThrottle without the throttle files: got %v, want ErrIONotEnabled, not os.ErrNotExist", err)
	}
	if _, err := c.Throttle(filepath.Join(pod, "gone"), loop3); !errors.Is(err, ErrCgroupGone) {
		t.Errorf("Throttle of a cgroup gone: got %v, want ErrCgroupGone", err)
	}
}

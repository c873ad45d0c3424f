package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// blkioRoot is the cgroup v1 blkio hierarchy the test makes its pod's
// cgroups in; the test is skipped where there is none.
const blkioRoot = "/sys/fs/cgroup/blkio"

// TestIOLimitsHoldThePodsCgroups checks, on the real kernel's cgroup v1
// blkio controller, that a ControllerModifyVolume's IO limits reach the
// cgroups of the pod that publishes the volume at a target laid out as
// the kubelet lays it out, each container's among them (v1 throttling is
// not hierarchical), and not csi-node's own, where its mkfs and fsck run;
// that a rule removed by hand is set again by the next pass; and that the
// unpublish removes the rules.
func TestIOLimitsHoldThePodsCgroups(t *testing.T) {
	if _, err := os.Stat(filepath.Join(blkioRoot, "blkio.throttle.read_iops_device")); err != nil {
		t.Skipf("needs the cgroup v1 blkio controller at %s: %v", blkioRoot, err)
	}
	p := testenv.New(t, "--resync-period", "1s", "--cgroup-root", filepath.Dir(blkioRoot), "--feature-gates=ModifyVolume=true")
	kubelet := mkdir(t, filepath.Join(p.Dir, "kubelet"))
	const uid = "0b7e9f5c-1d2a-4c3b-8e4f-5a6b7c8d9e0f"
	// The kubelet's cgroupfs layout below a cgroupRoot of the test's own,
	// as the e2e kubelets run with one: <root>/kubepods/burstable/pod<uid>.
	prefix := filepath.Join(blkioRoot, fmt.Sprintf("converge-test-%d", os.Getpid()))
	podDir := filepath.Join(prefix, "kubepods", "burstable", "pod"+uid)
	ctrDir := filepath.Join(podDir, "ctr-1")
	mkdir(t, ctrDir)
	t.Cleanup(func() {
		for _, d := range []string{ctrDir, podDir, filepath.Dir(podDir), filepath.Dir(filepath.Dir(podDir)), prefix} {
			if err := os.Remove(d); err != nil {
				t.Errorf("removing cgroup %s: %v", d, err)
			}
		}
	})
	p.Start()

	id := create(t, p, "iolimits")
	staging := mkdir(t, filepath.Join(p.Root, "staging-"+id))
	target := filepath.Join(mkdir(t, filepath.Join(kubelet, "pods", uid, "volumes", "kubernetes.io~csi", "pv-iolimits")), "mount")
	must(t, "stage", stage(t, p, id, staging, rwo))
	must(t, "publish", publish(t, p, id, staging, target, false))
	var st unix.Stat_t
	if err := unix.Stat(staging, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))

	if _, err := p.Controller().ControllerModifyVolume(ctx(t), &csi.ControllerModifyVolumeRequest{
		VolumeId: id, MutableParameters: map[string]string{"maxReadIops": "150", "maxWriteBps": "1Mi"},
	}); err != nil {
		t.Fatalf("ControllerModifyVolume: %v", err)
	}
	want := map[string]string{"blkio.throttle.read_iops_device": dev + " 150", "blkio.throttle.write_bps_device": dev + " 1048576"}
	for _, d := range []string{podDir, ctrDir} {
		for file, line := range want {
			waitLine(t, filepath.Join(d, file), line, true)
		}
	}
	// csi-node's own cgroup, where its mkfs, fsck and resize run, and
	// those above it, hold no rule of the volume's device.
	for _, d := range ownCgroups(t, p.PID()) {
		for _, file := range []string{"blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device", "blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"} {
			b, err := os.ReadFile(filepath.Join(d, file))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains("\n"+string(b), "\n"+dev+" ") {
				t.Errorf("csi-node's cgroup %s has a rule of the volume's device %s: %q", d, dev, b)
			}
		}
	}

	// An operator removes the container's rule: the next pass sets it again.
	if err := os.WriteFile(filepath.Join(ctrDir, "blkio.throttle.read_iops_device"), []byte(dev+" 0"), 0); err != nil {
		t.Fatal(err)
	}
	waitLine(t, filepath.Join(ctrDir, "blkio.throttle.read_iops_device"), dev+" 150", true)

	unpublish(t, p, id, target)
	for _, d := range []string{podDir, ctrDir} {
		for file := range want {
			waitLine(t, filepath.Join(d, file), dev+" ", false)
		}
	}
	unstage(t, p, id, staging)
	if _, err := p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
}

// waitLine waits until the cgroup file path has a line starting with
// line (present) or none (!present).
func waitLine(t *testing.T, path, line string, present bool) {
	t.Helper()
	what := fmt.Sprintf("%s holding %q", path, line)
	if !present {
		what = fmt.Sprintf("%s without a line of %q", path, line)
	}
	poll.Until(t, 15*time.Second, 100*time.Millisecond, what, func() error {
		b, err := os.ReadFile(path)
		if err != nil {
			return poll.Stop(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, line) }) != present {
			return fmt.Errorf("it holds %q", b)
		}
		return nil
	})
}

// ownCgroups are the blkio cgroups of process pid, its own first, then
// each above it up to the hierarchy's root.
func ownCgroups(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || !slices.Contains(strings.Split(parts[1], ","), "blkio") {
			continue
		}
		var out []string
		for d := filepath.Join(blkioRoot, parts[2]); ; d = filepath.Dir(d) {
			out = append(out, d)
			if d == blkioRoot {
				return out
			}
		}
	}
	t.Fatalf("process %d is in no blkio cgroup: %s", pid, b)
	return nil
}

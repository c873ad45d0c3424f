package devices

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testPodUID3 is a pod with no cgroup of the kubelet's.
const testPodUID3 = "5e6f7a8b-0000-4b7a-9d1e-000000000003"

// fakeCgroupV2Root returns a CgroupIO on an empty fake cgroup v2
// hierarchy, and a function that makes a directory (and its parents) in
// it.
func fakeCgroupV2Root(t *testing.T) (CgroupIO, func(rel string) string) {
	t.Helper()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory pids\n")
	c, err := DetectCgroupIO(root)
	if err != nil {
		t.Fatal(err)
	}
	mkdir := func(rel string) string {
		dir := filepath.Join(c.Root, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return c, mkdir
}

// TestPodCgroupsShapes finds a pod's cgroup in each shape the kubelet
// makes one, with either cgroup driver and below a cgroupRoot of up to
// two components, and in no other: a directory of a pod cgroup's name
// elsewhere (one an unprivileged user made below its user@N.service, a
// "kubepods" of its own there) is no pod's.
func TestPodCgroupsShapes(t *testing.T) {
	const uid = testPodUID
	uid_ := strings.ReplaceAll(uid, "-", "_")
	user := "user.slice/user-1000.slice/user@1000.service/"
	for _, c := range []struct {
		dir   string
		found bool
	}{
		{"kubepods/pod" + uid, true},
		{"kubepods/burstable/pod" + uid, true},
		{"kubepods/besteffort/pod" + uid, true},
		{"run1-node1/kubepods/burstable/pod" + uid, true},
		{"a/b/kubepods/besteffort/pod" + uid, true},
		{"kubepods.slice/kubepods-pod" + uid_ + ".slice", true},
		{"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid_ + ".slice", true},
		{"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uid_ + ".slice", true},
		{"run1-node1/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid_ + ".slice", true},
		{"node.slice/node-kubepods.slice/node-kubepods-burstable.slice/node-kubepods-burstable-pod" + uid_ + ".slice", true},
		{"run1_node1.slice/run1_node1-kubepods.slice/run1_node1-kubepods-pod" + uid_ + ".slice", true},

		{"pod" + uid, false},
		{"system.slice/pod" + uid, false},
		{user + "pod" + uid, false},
		{user + "kubepods-burstable-pod" + uid_ + ".slice", false},
		{user + "kubepods/pod" + uid, false},
		{user + "kubepods.slice/kubepods-pod" + uid_ + ".slice", false},
		{"a/b/c/kubepods/pod" + uid, false},
		{"kubepods/guaranteed/pod" + uid, false},
		{"kubepods/burstable/x/pod" + uid, false},
		{"kubepods/kubepods-pod" + uid_ + ".slice", false},
		{"kubepods.slice/pod" + uid, false},
		{"kubepods.slice/kubepods-burstable-pod" + uid_ + ".slice", false},
		{"kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod" + uid_ + ".slice", false},
		{"kubepods.slice/kubepods-pod" + uid + ".slice", false},
		{"kubepods.slice/user-pod" + uid_ + ".slice", false},
		{"other.slice/node-kubepods.slice/node-kubepods-pod" + uid_ + ".slice", false},
		{"node-kubepods.slice/node-kubepods-pod" + uid_ + ".slice", false},
	} {
		t.Run(c.dir, func(t *testing.T) {
			cg, mkdir := fakeCgroupV2Root(t)
			dir := mkdir(c.dir)
			got, err := cg.PodCgroups(uid)
			switch {
			case c.found && (err != nil || len(got) != 1 || got[0] != dir):
				t.Errorf("got %v, %v; want [%s]", got, err, dir)
			case !c.found && !errors.Is(err, ErrPodCgroupNotFound):
				t.Errorf("got %v, %v; want ErrPodCgroupNotFound", got, err)
			}
		})
	}
}

// TestPodCgroupsDecoy finds the pod's own cgroup, not the decoys of its
// name that an unprivileged user made below its user@N.service (which
// sorts after the kubelet's cgroups, so that a walk keeping the last one
// found would pick them).
func TestPodCgroupsDecoy(t *testing.T) {
	uid_ := strings.ReplaceAll(testPodUID, "-", "_")
	eachFakeV2(t, func(t *testing.T, driver string, c CgroupIO, pod string) {
		user := filepath.Join(c.Root, "user.slice", "user-1000.slice", "user@1000.service")
		for _, d := range []string{"pod" + testPodUID, "kubepods-burstable-pod" + uid_ + ".slice", "pod" + testPodUID3} {
			if err := os.MkdirAll(filepath.Join(user, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := c.PodCgroups(testPodUID); err != nil || len(got) != 1 || got[0] != pod {
			t.Errorf("PodCgroups: got %v, %v; want [%s]", got, err, pod)
		}
		if got, err := c.PodCgroups(testPodUID3); !errors.Is(err, ErrPodCgroupNotFound) {
			t.Errorf("PodCgroups of a pod with a decoy alone: got %v, %v; want ErrPodCgroupNotFound", got, err)
		}
	})
}

// TestPodCgroupsTwice refuses a pod whose UID names cgroups at two places
// of the kubelet's shapes, with an error naming both, rather than set the
// limits in either: the other might be the one that binds the pod.
func TestPodCgroupsTwice(t *testing.T) {
	uid_ := strings.ReplaceAll(testPodUID, "-", "_")
	eachFakeV2(t, func(t *testing.T, driver string, c CgroupIO, pod string) {
		kube := filepath.Dir(filepath.Dir(pod))
		other := filepath.Join(kube, "besteffort", "pod"+testPodUID)
		if driver == "systemd" {
			other = filepath.Join(kube, "kubepods-besteffort.slice", "kubepods-besteffort-pod"+uid_+".slice")
		}
		if err := os.MkdirAll(other, 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := c.PodCgroups(testPodUID)
		if err == nil || errors.Is(err, ErrPodCgroupNotFound) || !strings.Contains(err.Error(), pod) || !strings.Contains(err.Error(), other) {
			t.Fatalf("PodCgroups of a pod at two places: got %v, %v; want an error naming %s and %s", got, err, pod, other)
		}
		t.Log(err)
	})
}

// eachFakeV2 runs f for a fake v2 hierarchy of each cgroup driver's
// layout, with its CgroupIO and the path of its pod's cgroup.
func eachFakeV2(t *testing.T, f func(t *testing.T, driver string, c CgroupIO, pod string)) {
	for _, driver := range []string{"cgroupfs", "systemd"} {
		t.Run(driver, func(t *testing.T) {
			root, pod, _, _ := fakeCgroupV2(t, driver)
			c, err := DetectCgroupIO(root)
			if err != nil {
				t.Fatal(err)
			}
			f(t, driver, c, pod)
		})
	}
}

// TestPodCgroupsSymlink follows no symlink, neither one in a pod's place
// nor one in kubepods' place (cgroup file systems have none; a fake tree
// might).
func TestPodCgroupsSymlink(t *testing.T) {
	c, mkdir := fakeCgroupV2Root(t)
	// Deeper than any kubepods is looked for.
	elsewhere := mkdir("a/b/c/elsewhere")
	mkdir("a/b/c/elsewhere/kubepods/burstable/pod" + testPodUID2)
	mkdir("kubepods/burstable")
	for link, target := range map[string]string{
		"kubepods/besteffort":                 filepath.Join(elsewhere, "kubepods", "burstable"),
		"kubepods/burstable/pod" + testPodUID: elsewhere,
		"run1-node1":                          elsewhere,
	} {
		if err := os.Symlink(target, filepath.Join(c.Root, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, uid := range []string{testPodUID, testPodUID2} {
		if got, err := c.PodCgroups(uid); !errors.Is(err, ErrPodCgroupNotFound) {
			t.Errorf("PodCgroups(%s): got %v, %v; want ErrPodCgroupNotFound", uid, got, err)
		}
	}
}

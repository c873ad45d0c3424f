package runs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/devices"
)

// TestPodHoldsNoForeignMount: a made pod's namespace keeps no copy of a
// loop-backed mount outside the test's runs, so a test beside it (test/fault's
// reboot) can unmount and detach its device while the pod lives, frozen.
func TestPodHoldsNoForeignMount(t *testing.T) {
	needMachine(t)
	m := newMade(t)
	run := m.run(t, "")
	foreign := t.TempDir()
	image := filepath.Join(foreign, "foreign.img")
	at := filepath.Join(foreign, "mnt")
	dev := m.filesystem(t, image, at)
	pod := filepath.Base(run) + "-node/kubepods/pod1"
	m.cgroup(t, pod)
	m.pod(t, pod)
	m.freeze(t, pod)

	if err := syscall.Unmount(at, 0); err != nil {
		t.Fatal(err)
	}
	m.mounts = m.mounts[:len(m.mounts)-1]
	if err := devices.DetachLoop(dev); err != nil {
		t.Fatal(err)
	}
	backing := filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(backing); err != nil || strings.TrimSpace(string(b)) != image {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still backs %s 5s after its unmount on the host: the pod's namespace holds a copy of its mount", image, dev)
		}
	}
}

package devices

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestAttachLoopBurst attaches 100 images at once, as a burst of stages
// does (and the bench's raw floor, one goroutine per volume). The kernel
// offers every caller the same lowest free number; racing for it, a burst
// ran out of retries on a machine with few loop devices made, and the
// plugin answered RESOURCE_EXHAUSTED for what was contention.
func TestAttachLoopBurst(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	const n = 100
	dir := t.TempDir()
	devs := make([]string, n)
	errs := make([]error, n)
	t.Cleanup(func() {
		for _, d := range devs {
			if d != "" {
				releaseLoop(d)
			}
		}
	})
	images := make([]string, n)
	for i := range images {
		images[i] = sparseImage(t, filepath.Join(dir, fmt.Sprintf("%d.img", i)))
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { devs[i], errs[i] = AttachLoop(images[i], false) })
	}
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("attach %d: %v", i, err)
			continue
		}
		if j, dup := seen[devs[i]]; dup {
			t.Errorf("attaches %d and %d both got %s", j, i, devs[i])
		}
		seen[devs[i]] = i
		backing, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(devs[i]), "loop", "backing_file"))
		if err != nil || string(backing) != images[i]+"\n" {
			t.Errorf("%s is backed by %q (%v), want %s", devs[i], backing, err, images[i])
		}
	}
}

// releaseLoop detaches a test's loop device and removes its node. The
// kernel keeps a detached node, and every loop listing visits every node:
// 300 left behind made each observation on the machine about 1 ms slower,
// in every later test and benchmark.
func releaseLoop(dev string) {
	DetachLoop(dev)
	removeLoop(dev)
}

// releaseLoopIn is releaseLoop for a device only while an image in dir
// backs it: a number the test detached may serve someone else by now.
func releaseLoopIn(dev, dir string) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err == nil && filepath.Dir(strings.TrimSpace(string(b))) == dir {
		releaseLoop(dev)
	}
}

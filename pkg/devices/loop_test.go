package devices

import (
	"bytes"
	"os/exec"
	"syscall"

	"github.com/converge-csi/converge/test/testenv/loops"

	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
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
				loops.Release(d, dir)
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

// TestClaimWait checks the wait between two claims of a free loop device:
// it doubles from attachFirstWait to attachMaxWait, never more however many
// claims were lost, and is drawn from the upper half of that.
func TestClaimWait(t *testing.T) {
	for _, c := range []struct {
		name     string
		lost     int
		r        float64
		min, max time.Duration
	}{
		{name: "first, least", lost: 0, r: 0, min: attachFirstWait / 2, max: attachFirstWait / 2},
		{name: "first, most", lost: 0, r: 0.999999, min: attachFirstWait / 2, max: attachFirstWait},
		{name: "second", lost: 1, r: 0.5, min: attachFirstWait, max: 2 * attachFirstWait},
		{name: "fifth", lost: 4, r: 0, min: 8 * attachFirstWait, max: 8 * attachFirstWait},
		{name: "capped", lost: 15, r: 0.999999, min: attachMaxWait / 2, max: attachMaxWait},
		{name: "very many", lost: 1 << 20, r: 0, min: attachMaxWait / 2, max: attachMaxWait / 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := claimWait(c.lost, c.r); got < c.min || got > c.max {
				t.Errorf("claimWait(%d, %v): got %v, want %v to %v", c.lost, c.r, got, c.min, c.max)
			}
		})
	}
}

// TestCloneMountsWhereItsSourceDid makes an ext4 on a small volume in an
// xfs with reflinks (mke2fs picks 1 KiB blocks for it, on a device of 512
// byte sectors), clones the image and mounts the clone. xfs asks direct
// I/O to a file that shares blocks for whole filesystem blocks (4 KiB):
// a loop device that took its sector size from that refused the clone's
// 1 KiB filesystem ("bad block size"), and so the source's own once it
// was snapshotted. A volume's device keeps 512 byte sectors on every
// backing, which every filesystem mounts on.
func TestCloneMountsWhereItsSourceDid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	dir, _ := mountFresh(t, t.TempDir(), "xfs", "-m", "reflink=1")
	src, clone := filepath.Join(dir, "src.img"), filepath.Join(dir, "clone.img")
	mnt := t.TempDir()
	attach := func(img string) string {
		dev, err := AttachLoop(img, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { loops.Release(dev, dir) })
		return dev
	}
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, 64<<20); err != nil {
		t.Fatal(err)
	}
	dev := attach(src)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if err := DetachLoop(dev); err != nil {
		t.Fatal(err)
	}
	if err := CopyFile(t.Context(), src, clone, CopyReflink, CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{clone, src} {
		dev := attach(img)
		if err := syscall.Mount(dev, mnt, "ext4", 0, ""); err != nil {
			sectors, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "logical_block_size"))
			t.Errorf("mounting the ext4 of %s, which shares its blocks: %v (the device's sectors: %s bytes)", filepath.Base(img), err, bytes.TrimSpace(sectors))
			continue
		}
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}
	}
}

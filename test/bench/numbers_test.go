package bench

import (
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv"
)

// removeNumber gives a detached loop device's number back to the kernel
// (LOOP_CTL_REMOVE), as converge's unstage does for a thick volume's: the
// kernel keeps a number's discard limit across detaches, so without it the
// next attach of a thick image, of whichever way, would find discards off
// already and skip the write that turns them off (a queue freeze and an
// RCU grace period, 6-18 ms here), and the ways would not compare. It is
// called after a teardown, never inside the time of one. A number removed
// already is a no-op.
func removeNumber(dev string) error {
	n, err := strconv.Atoi(strings.TrimPrefix(dev, "/dev/loop"))
	if err != nil {
		return fmt.Errorf("%q is not a loop device", dev)
	}
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(ctl)
	// The last close of a device just detached can trail the detach.
	for deadline := time.Now().Add(time.Second); ; {
		err := unix.IoctlSetInt(ctl, unix.LOOP_CTL_REMOVE, n)
		switch {
		case err == nil || errors.Is(err, unix.ENODEV):
			return nil
		case !errors.Is(err, unix.EBUSY) || time.Now().After(deadline):
			return fmt.Errorf("LOOP_CTL_REMOVE %s: %w", dev, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// removeNumbers removes the numbers of devs (skipping empty ones), one
// after the other, as the kernel serializes them anyway.
func removeNumbers(b testing.TB, devs []string) {
	for _, dev := range devs {
		if dev == "" {
			continue
		}
		if err := removeNumber(dev); err != nil {
			b.Error(err)
		}
	}
}

// loopsBackedIn returns the numbers of the loop devices whose backing file
// is in dir.
func loopsBackedIn(dir string) map[int]bool {
	out := map[int]bool{}
	for n := range loopNodes() {
		if backedIn(n, dir) {
			out[n] = true
		}
	}
	return out
}

// backedIn reports whether loop device n is attached to a file in dir.
func backedIn(n int, dir string) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/loop/backing_file", n))
	return err == nil && strings.HasPrefix(string(raw), dir+"/")
}

// removalWait bounds the benchmarks' awaitRemoved: converge removes a
// thick volume's number within milliseconds of its detach, and a number it
// does not remove (a device someone else holds) must not stall the run.
const removalWait = 5 * time.Second

// awaitRemoved waits until each of the loop device numbers nums, which the
// plugin had attached to images in its data directory dataDir, is removed
// (its /sys/block entry gone) or attached to a file outside dataDir (taken
// by another user before converge could remove it: converge is done with
// it either way), so that none of the plugin's work in the background
// after a teardown lands in a baseline's measurement. It returns how long
// it waited, and false if bound ran out first.
func awaitRemoved(nums map[int]bool, dataDir string, bound time.Duration) (time.Duration, bool) {
	start := time.Now()
	for {
		left := false
		for n := range nums {
			_, err := os.Stat(fmt.Sprintf("/sys/block/loop%d", n))
			if err == nil && (backedIn(n, dataDir) || !attached(n)) {
				left = true
				break
			}
		}
		if !left {
			return time.Since(start), true
		}
		if time.Since(start) > bound {
			return time.Since(start), false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// attached reports whether loop device n has a backing file.
func attached(n int) bool {
	_, err := os.Stat(fmt.Sprintf("/sys/block/loop%d/loop/backing_file", n))
	return err == nil
}

// attachImage attaches a new 1 MiB image in dir with discards off, as a
// thick volume's, and returns the device and its number; cleanup detaches
// it and removes the number if the test did not.
func attachImage(t *testing.T, dir string) (string, int) {
	t.Helper()
	img := filepath.Join(dir, fmt.Sprintf("img-%d", time.Now().UnixNano()))
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := devices.AttachLoop(img, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if backedIn(number(t, dev), dir) {
			devices.DetachLoop(dev)
			removeNumber(dev)
		}
	})
	return dev, number(t, dev)
}

// attachAside attaches a new 1 MiB image in dir to a loop device of a
// number in the upper half of those the kernel can make, made for it
// (LOOP_CTL_ADD), below which it makes decoys, unbound devices of the
// numbers just under it. Once detached it is free, and another user of the
// machine's loop devices (a test beside this one) attaching with
// LOOP_CTL_GET_FREE is handed the first unbound device in the order of
// numbers: a decoy, or one lower still, never this one while a decoy is
// left. Cleanup detaches it if it is still attached to the image, and
// removes its number and each decoy's that no one attached.
func attachAside(t *testing.T, dir string) (string, int) {
	t.Helper()
	img := filepath.Join(dir, fmt.Sprintf("img-%d", time.Now().UnixNano()))
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ctl)
	// A number's first minor is the number shifted by the partitions
	// each device may have (max_part, rounded up to a power of two less
	// one), and a minor has 20 bits.
	shift := 0
	if b, err := os.ReadFile("/sys/module/loop/parameters/max_part"); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 {
			shift = bits.Len(uint(p))
		}
	}
	half := 1 << (20 - shift - 1)
	const decoys = 16
	add := func(n int) bool {
		err := unix.IoctlSetInt(ctl, unix.LOOP_CTL_ADD, n)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("LOOP_CTL_ADD %d: %v", n, err)
		}
		if err == nil {
			t.Cleanup(func() {
				if !attached(n) {
					removeNumber(fmt.Sprintf("/dev/loop%d", n))
				}
			})
		}
		return err == nil
	}
	n := 0
	for {
		n = half + decoys + rand.IntN(half-decoys)
		if add(n) {
			break
		}
	}
	for i := 1; i <= decoys; i++ {
		add(n - i)
	}
	dev := fmt.Sprintf("/dev/loop%d", n)
	t.Cleanup(func() {
		if backedIn(n, dir) {
			devices.DetachLoop(dev)
		}
	})
	if out, err := exec.Command("losetup", dev, img).CombinedOutput(); err != nil {
		t.Fatalf("losetup %s %s: %v: %s", dev, img, err, out)
	}
	return dev, n
}

func number(t *testing.T, dev string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(dev, "/dev/loop"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func exists(n int) bool {
	_, err := os.Stat(fmt.Sprintf("/sys/block/loop%d", n))
	return err == nil
}

func TestRemoveNumber(t *testing.T) {
	testenv.RequireRoot(t)
	dev, n := attachImage(t, t.TempDir())
	if err := devices.DetachLoop(dev); err != nil {
		t.Fatal(err)
	}
	if err := removeNumber(dev); err != nil {
		t.Fatalf("removeNumber(%s): got %v, want nil", dev, err)
	}
	if exists(n) {
		t.Errorf("/sys/block/loop%d: got present after removeNumber, want gone", n)
	}
	if err := removeNumber(dev); err != nil {
		t.Errorf("removeNumber(%s) again: got %v, want nil (a no-op)", dev, err)
	}
	if err := removeNumber("/dev/sda"); err == nil {
		t.Errorf("removeNumber(/dev/sda): got nil, want an error")
	}
}

func TestAwaitRemoved(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	t.Run("waits for the detach and then the removal", func(t *testing.T) {
		dev, n := attachAside(t, dir)
		used := loopsBackedIn(dir)
		if len(used) != 1 || !used[n] {
			t.Fatalf("loopsBackedIn(%s): got %v, want {%d}", dir, used, n)
		}
		const detachAfter, removeAfter = 50 * time.Millisecond, 150 * time.Millisecond
		done := make(chan error, 1)
		go func() {
			time.Sleep(detachAfter)
			if err := devices.DetachLoop(dev); err != nil {
				done <- err
				return
			}
			// Detached but not removed: not done yet.
			time.Sleep(removeAfter - detachAfter)
			done <- removeNumber(dev)
		}()
		waited, ok := awaitRemoved(used, dir, 5*time.Second)
		if err := <-done; err != nil {
			if attached(n) && !backedIn(n, dir) {
				t.Skipf("loop%d was taken by another user between its detach and its removal: every decoy below it was taken first (%v)", n, err)
			}
			t.Fatal(err)
		}
		if !ok || waited < removeAfter {
			t.Errorf("awaitRemoved: got (%v, %v), want (at least %v, true)", waited, ok, removeAfter)
		}
		if exists(n) {
			t.Errorf("awaitRemoved returned while /sys/block/loop%d was still there", n)
		}
	})
	t.Run("gives up at its bound", func(t *testing.T) {
		_, n := attachImage(t, dir)
		const bound = 100 * time.Millisecond
		waited, ok := awaitRemoved(map[int]bool{n: true}, dir, bound)
		if ok || waited < bound {
			t.Errorf("awaitRemoved of a device still attached: got (%v, %v), want (at least %v, false)", waited, ok, bound)
		}
	})
	t.Run("a number another user took is done", func(t *testing.T) {
		_, n := attachImage(t, dir)
		// The same device seen from a data directory it is not in.
		waited, ok := awaitRemoved(map[int]bool{n: true}, filepath.Join(dir, "elsewhere"), time.Second)
		if !ok || waited > 500*time.Millisecond {
			t.Errorf("awaitRemoved of a number attached outside the data directory: got (%v, %v), want (quick, true)", waited, ok)
		}
	})
}

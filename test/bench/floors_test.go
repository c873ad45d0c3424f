package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv"
)

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
		dev, n := attachImage(t, dir)
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

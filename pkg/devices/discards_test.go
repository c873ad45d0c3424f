package devices

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDiscardsAfterAThickUser checks that a device number whose discards a
// thick volume turned off is never handed to a thin volume with them stuck
// off: the kernel keeps a device's discard limit across detaches, so Detach
// removes such a device (in the background, removeDelay later) and an
// attach that finds one before that takes another. Every other thin attach
// follows a thick detach at once, before the removal.
func TestDiscardsAfterAThickUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	thick, thin := sparseImage(t, filepath.Join(dir, "thick.img")), sparseImage(t, filepath.Join(dir, "thin.img"))
	var attached []string
	t.Cleanup(func() {
		for _, d := range attached {
			releaseLoopIn(d, dir)
		}
	})
	discards := func(dev string) int64 {
		t.Helper()
		n, err := readInt(filepath.Join("/sys/block", filepath.Base(dev), "queue", "discard_max_bytes"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	attach := func(img string, on bool) string {
		t.Helper()
		dev, err := AttachLoop(img, on)
		if err != nil {
			t.Fatal(err)
		}
		attached = append(attached, dev)
		if n := discards(dev); (n > 0) != on {
			t.Fatalf("%s attached with discards %v: its limit is %d bytes", dev, on, n)
		}
		return dev
	}
	detach := func(dev string) {
		t.Helper()
		if gone, err := (LoopDevices{}).Detach(dev); err != nil || !gone {
			t.Fatalf("detaching unused %s: gone %v, %v; want gone", dev, gone, err)
		}
	}
	for i := range 10 {
		dev := attach(thick, false)
		detach(dev)
		if i%2 == 0 {
			// Right away: racing the background removal.
			detach(attach(thin, true))
			continue
		}
		// The thick device's number is removed in the background: soon
		// nobody, not even a user that leaves discards alone, can get
		// it with its discards stuck off.
		deadline := time.Now().Add(5 * time.Second)
		for {
			g, err := readInt(filepath.Join("/sys/block", filepath.Base(dev), "queue", "discard_granularity"))
			if err != nil || g > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %s still has its discards stuck off 5 s after its detach", i, dev)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	out, err := exec.Command("losetup", "--find", "--show", thin).Output()
	if err != nil {
		t.Fatal(err)
	}
	other := strings.TrimSpace(string(out))
	attached = append(attached, other)
	if n := discards(other); n == 0 {
		t.Errorf("losetup after the thick volumes got %s with discards off", other)
	}
}

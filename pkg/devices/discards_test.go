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

// TestSetDiscardsWritesOnlyAChange checks that a device that passes discards
// on, or refuses them, as asked is left as it is: each write makes the kernel freeze the
// device's queue for an RCU grace period. A fake sysfs tells a write by the
// attribute's modification time.
func TestSetDiscardsWritesOnlyAChange(t *testing.T) {
	sys := t.TempDir()
	queue := filepath.Join(sys, "loop9", "queue")
	if err := os.MkdirAll(queue, 0o700); err != nil {
		t.Fatal(err)
	}
	attr := func(name, value string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(queue, name), []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	attr("discard_max_hw_bytes", "4294966784")
	attr("discard_granularity", "4096")
	limit := filepath.Join(queue, "discard_max_bytes")
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, c := range []struct {
		on          bool
		before, now string
		written     bool
	}{
		// A fresh device's limit, not in whole granules.
		{on: true, before: "4294966784", now: "4294966784", written: false},
		{on: true, before: "4096", now: "4096", written: false},
		{on: false, before: "0", now: "0", written: false},
		{on: false, before: "4294966784", now: "0", written: true},
		// As far as the device can, in whole granules.
		{on: true, before: "0", now: "4294963200", written: true},
	} {
		attr("discard_max_bytes", c.before)
		if err := os.Chtimes(limit, old, old); err != nil {
			t.Fatal(err)
		}
		if err := SetDiscards(sys, "/dev/loop9", c.on); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(limit)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(limit)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != c.now {
			t.Errorf("discards %v from %s: limit %s, want %s", c.on, c.before, got, c.now)
		}
		if written := !st.ModTime().Equal(old); written != c.written {
			t.Errorf("discards %v from %s: written %v, want %v", c.on, c.before, written, c.written)
		}
	}
}

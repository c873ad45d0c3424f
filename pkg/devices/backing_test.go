package devices

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestObserveFindsDevicesOfAnEndedContainer attaches an image through a
// bind mount of its state directory in a mount namespace of its own, as
// csi-node in a container does through its hostPath, and lets the
// namespace end, as the container does when it restarts. The kernel then
// names the backing file /volumes/v.img; the observation must still find
// the device under the image's path in the data directory, and must not
// take a device of another directory's file of the same name for it.
func TestObserveFindsDevicesOfAnEndedContainer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mount namespaces")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	state, other, view := t.TempDir(), t.TempDir(), t.TempDir()
	image := func(root string) string {
		if err := os.Mkdir(filepath.Join(root, "volumes"), 0o700); err != nil {
			t.Fatal(err)
		}
		return sparseImage(t, filepath.Join(root, "volumes", "v.img"))
	}
	mine, theirs := image(state), image(other)
	// attach binds root at view in a mount namespace that ends with the
	// command, and attaches root's image through view.
	attach := func(root, file string) string {
		out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$1" "$2" && losetup --find --show "$2/volumes/v.img"`, "sh", root, view).CombinedOutput()
		if err != nil {
			t.Fatalf("attach through a namespace of its own: %v: %s", err, out)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() { detachIfBacking(t, dev, file) })
		return dev
	}
	myDev, theirDev := attach(state, mine), attach(other, theirs)
	if b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(myDev), "loop", "backing_file")); strings.TrimSpace(string(b)) != "/volumes/v.img" {
		t.Logf("the kernel names the backing file of %s %q (this test expects /volumes/v.img)", myDev, b)
	}

	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Pools: map[string]string{"default": filepath.Join(state, "volumes")}}
	defer o.Close()
	obs, err := o.Observe()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, l := range obs.Loops() {
		found[l.Device] = l.BackingFile
		if l.Device == myDev && l.BackingSize != 1<<20 {
			t.Errorf("%s: backing size %d, want %d", l.Device, l.BackingSize, 1<<20)
		}
	}
	if got := found[myDev]; got != mine {
		t.Errorf("%s, attached to %s through an ended mount: observed backing %q, want %q", myDev, mine, got, mine)
	}
	if got := found[theirDev]; got == mine {
		t.Errorf("%s, attached to %s, was taken for %s", theirDev, theirs, mine)
	}
	if ls := obs.LoopsFor(mine); len(ls) != 1 || ls[0].Device != myDev {
		t.Errorf("loops for %s: got %v, want %s alone", mine, ls, myDev)
	}
}

// detachIfBacking detaches dev and gives its number back only while file
// backs it: the number may serve another process by now.
func detachIfBacking(t *testing.T, dev, file string) {
	t.Helper()
	d, ino, err := loopBacking(dev)
	var st unix.Stat_t
	if err != nil || unix.Stat(file, &st) != nil || st.Dev != d || st.Ino != ino {
		return
	}
	if err := DetachLoop(dev); err != nil {
		t.Errorf("detach %s: %v", dev, err)
		return
	}
	removeLoop(dev)
}

// TestObserveLeavesAnotherNodesDevicesAlone attaches, in a mount namespace
// that lives while the test observes, another state directory's image
// through a bind mount at this state directory's own path, as another
// node's csi-node on the same kernel does through its hostPath: the kernel
// names that device's backing file by the very path of this directory's
// image. The observation must not take it for this directory's (it would
// be released as an orphan under the other node's volume), and must still
// find the device this directory's image is attached to.
func TestObserveLeavesAnotherNodesDevicesAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mount namespaces")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	state, other := t.TempDir(), t.TempDir()
	for _, root := range []string{state, other} {
		if err := os.Mkdir(filepath.Join(root, "volumes"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mine := sparseImage(t, filepath.Join(state, "volumes", "v.img"))
	theirs := sparseImage(t, filepath.Join(other, "volumes", "v.img"))
	myDev, err := AttachLoop(mine, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detachIfBacking(t, myDev, mine) })

	node := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" "$2" && losetup --find --show "$2/volumes/v.img" && exec sleep 60`, "sh", other, state)
	out, err := node.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	theirDev := strings.TrimSpace(line)
	t.Cleanup(func() {
		node.Process.Kill()
		node.Wait()
		if theirDev != "" {
			detachIfBacking(t, theirDev, theirs)
		}
	})
	if !strings.HasPrefix(theirDev, "/dev/loop") {
		t.Fatalf("the other namespace's losetup printed %q", line)
	}
	if b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(theirDev), "loop", "backing_file")); strings.TrimSpace(string(b)) != mine {
		t.Logf("the kernel names the backing file of %s %q here (this test expects %s)", theirDev, b, mine)
	}

	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Pools: map[string]string{"default": filepath.Join(state, "volumes")}}
	defer o.Close()
	for pass := range 2 { // the second from what the first learned
		obs, err := o.Observe()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range obs.LoopsFor(mine) {
			got = append(got, l.Device)
		}
		if len(got) != 1 || got[0] != myDev {
			t.Errorf("pass %d: devices of %s: got %v, want %s alone (not %s, another namespace's)", pass, mine, got, myDev, theirDev)
		}
	}
}

package runs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestCleanStale makes on the real kernel, without a cluster, what e2e
// runs killed before their teardown leave (issue 74: a node's containers
// frozen by TestTwoNodesNodeLoss, alive in them, holding their mounts and
// loop devices), beside a live run's objects. CleanStale must remove the
// first, all of them, and leave the second as they are; the live run's
// Clean must then leave nothing of its own and say nothing of a frozen
// leftover of another run.
func TestCleanStale(t *testing.T) {
	needMachine(t)
	m := newMade(t)

	// The live run, this process's: a mounted image, its pod frozen too,
	// a daemon. Made first, so that its pod's namespace holds no copy of
	// the other runs' mounts, as a run's made after CleanStale holds none.
	live := m.run(t, "")
	liveImage := filepath.Join(live, "pool.img")
	liveMount := filepath.Join(live, "mnt")
	liveDev := m.filesystem(t, liveImage, liveMount)
	livePod := filepath.Base(live) + "-node/kubepods/pod1"
	m.cgroup(t, livePod)
	liveContainer := m.pod(t, livePod)
	m.freeze(t, livePod)
	liveDaemon := m.daemon(t, filepath.Join(live, "bin", "kubelet"))

	// A run killed at its timeout: its owner is gone, its directory holds
	// a mounted image and an image deleted under its loop device, a
	// daemon started from it runs, and its node's pod is frozen, its
	// process holding the mount in its own namespace.
	killed := m.run(t, deadOwner(t))
	killedImage := filepath.Join(killed, "data.img")
	killedMount := filepath.Join(killed, "mnt")
	killedDev := m.filesystem(t, killedImage, killedMount)
	deletedImage := filepath.Join(killed, "deleted.img")
	deletedDev := m.loop(t, deletedImage, 1<<20)
	if err := os.Remove(deletedImage); err != nil {
		t.Fatal(err)
	}
	killedDaemon := m.daemon(t, filepath.Join(killed, "bin", "kubelet"))
	killedPod := filepath.Base(killed) + "-node/kubepods/pod1"
	m.cgroup(t, killedPod)
	killedContainer := m.pod(t, killedPod)
	m.freeze(t, killedPod)

	// A run killed whose directory was removed since (by a clean-up that
	// could not kill its frozen pod): its image, deleted, stays attached
	// and mounted in the pod's namespace alone.
	gone := m.run(t, deadOwner(t))
	goneImage := filepath.Join(gone, "data.img")
	goneDev := m.filesystem(t, goneImage, filepath.Join(gone, "mnt"))
	gonePod := filepath.Base(gone) + "-node/kubepods/pod1"
	m.cgroup(t, gonePod)
	goneContainer := m.pod(t, gonePod)
	m.freeze(t, gonePod)
	if err := syscall.Unmount(filepath.Join(gone, "mnt"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}

	// A cgroup of the naming before runs named theirs, after its node:
	// frozen from its top, a process in a pod under it.
	oldRoot := prefix + "oldnode"
	m.cgroup(t, oldRoot+"/kubepods/pod1")
	oldContainer := m.process(t, oldRoot+"/kubepods/pod1")
	m.freeze(t, oldRoot)

	// What a teardown reports of earlier runs, without failing: all of
	// theirs, nothing of the live run's.
	stale := Stale(live)
	for _, want := range []string{"directory " + killed, filepath.Base(gone) + "-node", oldRoot, goneDev} {
		if !slices.ContainsFunc(stale, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("Stale(live) = %q, want an entry naming %s", stale, want)
		}
	}
	if slices.ContainsFunc(stale, func(s string) bool { return mentions(s, live) || mentions(s, filepath.Base(live)+"-node") }) {
		t.Errorf("Stale(live) = %q, names the live run %s", stale, live)
	}

	notes := CleanStale()
	t.Logf("CleanStale:\n  %s", strings.Join(notes, "\n  "))

	killedDaemon.ended(t, "the killed run's daemon")
	killedContainer.ended(t, "the killed run's frozen container")
	goneContainer.ended(t, "the frozen container of the run whose directory is gone")
	oldContainer.ended(t, "the frozen container under the old-named cgroup")
	for _, root := range []string{filepath.Base(killed) + "-node", filepath.Base(gone) + "-node", oldRoot} {
		for _, h := range hierarchies() {
			if _, err := os.Stat(filepath.Join(h, root)); !os.IsNotExist(err) {
				t.Errorf("cgroup %s: got %v, want it removed", filepath.Join(h, root), err)
			}
		}
	}
	attached := attachedLoops()
	for dev, file := range map[string]string{killedDev: killedImage, deletedDev: deletedImage, goneDev: goneImage} {
		if attached[dev] == file {
			t.Errorf("loop device %s still attached to %s", dev, file)
		}
	}
	if left := mountsUnder(killed); len(left) > 0 {
		t.Errorf("mounts under %s: %q, want none", killed, left)
	}
	if _, err := os.Stat(killed); !os.IsNotExist(err) {
		t.Errorf("the killed run's directory: got %v, want it removed", err)
	}
	// One note for each run, saying what it cleaned; a second would say
	// what it failed to.
	for _, run := range []string{killed, gone, oldRoot} {
		if got := slices.DeleteFunc(slices.Clone(notes), func(n string) bool { return !mentions(n, run) }); len(got) != 1 {
			t.Errorf("CleanStale's notes naming %s: got %q, want one", run, got)
		}
	}

	// The live run's objects, as they were.
	if slices.ContainsFunc(notes, func(n string) bool { return mentions(n, live) || mentions(n, filepath.Base(live)+"-node") }) {
		t.Errorf("CleanStale's notes name the live run %s", live)
	}
	if !ownerAlive(live) {
		t.Errorf("the live run's directory %s or its owner file is gone", live)
	}
	liveContainer.runs(t, "the live run's container")
	liveDaemon.runs(t, "the live run's daemon")
	if got := freezerState(livePod); got != "FROZEN" {
		t.Errorf("the live run's pod cgroup: got %s, want FROZEN", got)
	}
	if got := LoopsBackedUnder(live)[liveDev]; got != liveImage {
		t.Errorf("loop device %s: got backing file %q, want %s", liveDev, got, liveImage)
	}
	if got := mountsUnder(live); !slices.Equal(got, []string{liveMount}) {
		t.Errorf("mounts under %s: got %q, want %s", live, got, liveMount)
	}

	// A run killed after it, whose name begins with the live run's: its
	// frozen pod, without a mount namespace (which would hold the live
	// run's mount), and a daemon started from its directory.
	later := live + "0"
	if exists(later) {
		t.Fatalf("%s exists", later)
	}
	laterPod := filepath.Base(later) + "-node/kubepods/pod1"
	m.cgroup(t, laterPod)
	laterContainer := m.process(t, laterPod)
	m.freeze(t, laterPod)
	laterDaemon := m.daemon(t, filepath.Join(later, "bin", "kubelet"))

	// A teardown thaws its run first, and only its run.
	if still := Thaw(live); len(still) > 0 {
		t.Errorf("Thaw(live): still frozen: %q", still)
	}
	if got := freezerState(livePod); got != "THAWED" {
		t.Errorf("the live run's pod cgroup after Thaw(live): got %s, want THAWED", got)
	}
	if got := freezerState(laterPod); got != "FROZEN" {
		t.Errorf("the later run's pod cgroup after Thaw(live): got %s, want FROZEN", got)
	}
	m.freeze(t, livePod) // for Clean to thaw

	if notes := Clean(live); len(notes) > 0 {
		t.Errorf("Clean(live) noted:\n  %s\nwant nothing", strings.Join(notes, "\n  "))
	}
	liveContainer.ended(t, "the live run's frozen container, after its Clean")
	liveDaemon.ended(t, "the live run's daemon, after its Clean")
	if left := Leftovers(live); len(left) > 0 {
		t.Errorf("after Clean(live), left: %q", left)
	}
	if attachedLoops()[liveDev] == liveImage {
		t.Errorf("loop device %s still attached to %s", liveDev, liveImage)
	}
	laterContainer.runs(t, "the later run's container, after the live run's Clean")
	laterDaemon.runs(t, "the later run's daemon, after the live run's Clean")
	if got := freezerState(laterPod); got != "FROZEN" {
		t.Errorf("the later run's pod cgroup after the live run's Clean: got %s, want FROZEN", got)
	}

	notes = CleanStale()
	t.Logf("CleanStale:\n  %s", strings.Join(notes, "\n  "))
	laterContainer.ended(t, "the later run's frozen container")
	laterDaemon.ended(t, "the later run's daemon")
	if got := slices.DeleteFunc(slices.Clone(notes), func(n string) bool { return !mentions(n, later) }); len(got) != 1 {
		t.Errorf("CleanStale's notes naming %s: got %q, want one", later, got)
	}
	for _, h := range hierarchies() {
		if _, err := os.Stat(filepath.Join(h, filepath.Base(later)+"-node")); !os.IsNotExist(err) {
			t.Errorf("cgroup %s: got %v, want it removed", filepath.Join(h, filepath.Base(later)+"-node"), err)
		}
	}
}

// TestCleanStaleLeavesOthersDirectories: anyone may make a directory named
// as a run's in /tmp, and what CleanStale reads in a run's directory
// decides what it writes (kernel tunables), kills and removes as root. A
// directory of another user's, or open to others, is not a run's: it is
// noted and left as it is, its records unread.
func TestCleanStaleLeavesOthersDirectories(t *testing.T) {
	needMachine(t)
	open := forgedRun(t, 0o755, os.Getuid())
	others := forgedRun(t, 0o700, 65534)
	notes := CleanStale()
	t.Logf("CleanStale:\n  %s", strings.Join(notes, "\n  "))
	for dir, why := range map[string]string{open: "open to others", others: "not this user's"} {
		if _, err := os.Stat(filepath.Join(dir, "host-paths-absent")); err != nil {
			t.Errorf("%s (%s): its records are gone: %v", dir, why, err)
		}
		if !slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, dir+": ") && strings.Contains(n, why) }) {
			t.Errorf("no note says %s is %s and left alone", dir, why)
		}
	}
}

// forgedRun makes a directory named as a run's, of mode perm and owner
// uid, with no owner file (as a killed run's) and the records a run
// keeps; it is removed when the test ends.
func forgedRun(t *testing.T, perm os.FileMode, uid int) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "host-paths-absent"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, -1); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCleanDetachesPoolImagesAndHolders: csi-node attaches the images of a
// pool through its container's mount of the pool, so the kernel names such
// a file relative to that mount once the container has ended ("/<image>");
// and the kubelet attaches a loop device to a raw block volume's device to
// hold it while a pod maps it. A run ended in the middle of its tests
// leaves both (seen: the pool's own device then stays too, under its
// images). Clean must detach them all.
func TestCleanDetachesPoolImagesAndHolders(t *testing.T) {
	needMachine(t)
	m := newMade(t)
	dir := m.run(t, deadOwner(t))
	pool := filepath.Join(dir, "pools", "fast")
	poolDev := m.filesystem(t, filepath.Join(dir, "pool.img"), pool)
	image := filepath.Join(pool, "pvc-1.img")
	if err := os.WriteFile(image, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 1<<20); err != nil {
		t.Fatal(err)
	}
	// Attached through a mount of the pool of a namespace that ends, as
	// csi-node's container's.
	attach := func(script string, args ...string) (string, loopID) {
		t.Helper()
		dev := attachIn(t, script, args...)
		id, _ := identity(dev)
		return dev, id
	}
	mnt := t.TempDir()
	imageDev, imageID := attach(`mount --bind "$1" "$2"; losetup -f --show "$2/pvc-1.img"`, pool, mnt)
	holder, holderID := attach(`losetup -f --show "$1"`, imageDev)
	poolID, ok := identity(poolDev)
	if !ok {
		t.Fatalf("the pool's device %s is not attached", poolDev)
	}
	if b, _ := os.ReadFile("/sys/block/" + filepath.Base(imageDev) + "/loop/backing_file"); strings.HasPrefix(string(b), dir) {
		t.Fatalf("the image's device is named %q, under the run's directory: the test makes nothing to find", b)
	}

	if notes := Clean(dir); len(notes) > 0 {
		t.Errorf("Clean: %s", strings.Join(notes, "; "))
	}
	// A device freed may be taken at once by another test's loop on this
	// kernel: still attached means still attached to the same file.
	for what, d := range map[string]struct {
		dev string
		id  loopID
	}{"the pool's image": {imageDev, imageID}, "the kubelet's holder": {holder, holderID}, "the pool": {poolDev, poolID}} {
		if now, ok := identity(d.dev); ok && now == d.id {
			t.Errorf("%s, %s, is still attached", what, d.dev)
		}
	}
}

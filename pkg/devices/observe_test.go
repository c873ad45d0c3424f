package devices

import (
	"github.com/converge-csi/converge/test/testenv/loops"

	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// TestObserveSeesRenamedMountPoint renames the directory above a mount
// point between two observations: the second must show the mount at its new
// path. The kernel announces mounts and unmounts to a poller of mountinfo
// (POLLPRI) but not renames, which change the paths mountinfo shows, so an
// observer that reused its last parse until an announced change would still
// show the old path; operations decided on it fail (an unpublish that finds
// its target "not mounted" cannot remove it: EBUSY).
func TestObserveSeesRenamedMountPoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	before, after := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	mnt := filepath.Join(before, "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Unmount(filepath.Join(after, "mnt"), syscall.MNT_DETACH)
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block"}
	paths := func() []string {
		t.Helper()
		obs, err := o.Observe()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range []string{mnt, filepath.Join(after, "mnt")} {
			if m, ok := obs.MountAt(p); ok && m.FsType == "tmpfs" {
				out = append(out, p)
			}
		}
		return out
	}
	if got := paths(); !slices.Equal(got, []string{mnt}) {
		t.Fatalf("before the rename: got %v, want [%s]", got, mnt)
	}
	if err := os.Rename(before, after); err != nil {
		t.Fatal(err)
	}
	if got, want := paths(), []string{filepath.Join(after, "mnt")}; !slices.Equal(got, want) {
		t.Fatalf("after the rename: got %v, want %v", got, want)
	}
}

// TestObserveFollowsLoopDevices detaches a loop device and attaches another
// image (most likely to the same device, the lowest free) between two
// observations by one Observer, which keeps the device's sysfs files open:
// the second observation shows the new image, since a detached device's
// descriptors fail even once it is attached again; and once the device is
// detached, the descriptors of its loop attributes are closed.
func TestObserveFollowsLoopDevices(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	images := []string{sparseImage(t, filepath.Join(dir, "a.img")), sparseImage(t, filepath.Join(dir, "b.img"))}
	var attached, detached []string
	t.Cleanup(func() {
		for _, d := range attached {
			loops.Release(d, dir)
		}
		// Their nodes, unless someone attached them since.
		for _, d := range detached {
			removeLoop(d)
		}
	})
	attach := func(img string) string {
		t.Helper()
		d, err := AttachLoop(img, true)
		if err != nil {
			t.Fatal(err)
		}
		attached = append(attached, d)
		return d
	}
	detach := func(d string) {
		t.Helper()
		if err := DetachLoop(d); err != nil {
			t.Fatal(err)
		}
		attached = slices.DeleteFunc(attached, func(a string) bool { return a == d })
		detached = append(detached, d)
	}
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block"}
	defer o.Close()
	backing := func() map[string]string {
		t.Helper()
		obs, err := o.Observe()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, l := range obs.Loops() {
			if filepath.Dir(l.BackingFile) == dir {
				out[l.Device] = l.BackingFile
			}
		}
		return out
	}
	kept := func(dev string) int {
		o.files.mu.Lock()
		defer o.files.mu.Unlock()
		n := 0
		for path := range o.files.fds {
			// Those of an attached device's attributes: its size is read
			// attached or not.
			if strings.HasPrefix(path, filepath.Join("/sys/block", filepath.Base(dev))+"/") && !strings.HasSuffix(path, "/size") {
				n++
			}
		}
		return n
	}

	dev := attach(images[0])
	for range 2 {
		if got := backing(); got[dev] != images[0] || len(got) != 1 {
			t.Fatalf("attached to a: got %v", got)
		}
	}
	if kept(dev) == 0 {
		t.Fatalf("no descriptor of %s kept", dev)
	}
	detach(dev)
	dev2 := attach(images[1])
	if dev2 != dev {
		t.Logf("b went to %s, not %s: the stale descriptors were not read", dev2, dev)
	}
	if got := backing(); got[dev2] != images[1] || len(got) != 1 {
		t.Fatalf("a detached and b attached (%s, was %s): got %v", dev2, dev, got)
	}
	detach(dev2)
	if got := backing(); len(got) != 0 {
		t.Fatalf("after the detach: got %v", got)
	}
	if n := kept(dev2); n != 0 {
		t.Errorf("%d descriptors of the detached %s kept", n, dev2)
	}
}

// sparseImage creates a sparse 1 MiB file at path to attach, and returns
// path.
func sparseImage(tb testing.TB, path string) string {
	tb.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Truncate(path, 1<<20); err != nil {
		tb.Fatal(err)
	}
	return path
}

// TestCheckMountedAtEachFilesystem mounts a fresh filesystem of each kind
// and checks that CheckMountedAt finds it at its mount point, and refuses
// the mount point once another device is mounted there. btrfs shows a stat
// a device number of its own, unlike the one mountinfo lists, so a check by
// device number failed every first btrfs stage.
func TestCheckMountedAtEachFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	for _, fs := range []string{host.FsExt4, host.FsXFS, host.FsBtrfs} {
		t.Run(fs, func(t *testing.T) {
			dir := t.TempDir()
			mnt, dev := mountFresh(t, dir, fs)
			paths := NewPaths([]string{dir})
			want, err := mountID(unix.AT_FDCWD, mnt)
			if err != nil {
				t.Fatal(err)
			}
			if id, err := paths.CheckMountedAt(dev, mnt); err != nil || id != want {
				t.Errorf("CheckMountedAt(%s, %s): %d, %v; want the mount found, with its ID %d", dev, mnt, id, err, want)
			}
			if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
			if _, err := paths.CheckMountedAt(dev, mnt); !errors.Is(err, ErrMisplacedMount) {
				t.Errorf("CheckMountedAt with tmpfs on top: got %v, want ErrMisplacedMount", err)
			}
		})
	}
}

// mountFresh makes a new filesystem of type fs (mkfs with extra options
// mkfsArgs) on a 320 MiB sparse image in dir, xfs's minimum, and mounts it
// at dir/mnt; the test's cleanup unmounts and detaches it.
func mountFresh(tb testing.TB, dir, fs string, mkfsArgs ...string) (mnt, dev string) {
	tb.Helper()
	return mountFreshSized(tb, dir, fs, 320<<20, mkfsArgs...)
}

// mountFreshSized is mountFresh on an image of size bytes.
func mountFreshSized(tb testing.TB, dir, fs string, size int64, mkfsArgs ...string) (mnt, dev string) {
	tb.Helper()
	mnt = filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		tb.Fatal(err)
	}
	img := sparseImage(tb, filepath.Join(dir, "a.img"))
	if err := os.Truncate(img, size); err != nil {
		tb.Fatal(err)
	}
	dev, err := AttachLoop(img, true)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { loops.Release(dev, dir) })
	force := map[string]string{host.FsExt4: "-F", host.FsXFS: "-f", host.FsBtrfs: "-f"}[fs]
	args := append([]string{"-q", force}, mkfsArgs...)
	if out, err := exec.Command("mkfs."+fs, append(args, dev)...).CombinedOutput(); err != nil {
		tb.Fatalf("mkfs.%s: %v: %s", fs, err, out)
	}
	if err := syscall.Mount(dev, mnt, fs, 0, ""); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	return mnt, dev
}

// TestMountTableKeepsItsDescriptor reads the mount table through one kept
// descriptor and a buffer far smaller than the table (so every read grows
// it and spans pages) while mounts come and go: each read shows the table
// as it is then, as a fresh read of the file does, and a closed table opens
// the file again.
func TestMountTableKeepsItsDescriptor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	var mnts []string
	for i := range 5 {
		m := filepath.Join(dir, fmt.Sprintf("m %d", i))
		if err := os.Mkdir(m, 0o700); err != nil {
			t.Fatal(err)
		}
		mnts = append(mnts, m)
	}
	t.Cleanup(func() {
		for _, m := range mnts {
			syscall.Unmount(m, syscall.MNT_DETACH)
		}
	})
	mt := newMountTable("/proc/self/mountinfo")
	mt.buf = make([]byte, 16)
	defer mt.close()
	check := func(want []string) {
		t.Helper()
		got, err := mt.read()
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := ReadMounts("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		// Other processes (tests of other packages, run at once) mount and
		// unmount between two reads: the reads must agree on the mounts
		// under dir, which only this test changes, and each must hold the
		// root.
		mine := func(mounts []host.Mount) []host.Mount {
			return slices.DeleteFunc(slices.Clone(mounts), func(m host.Mount) bool { return !strings.HasPrefix(m.Path, dir+"/") })
		}
		if !reflect.DeepEqual(mine(got), mine(fresh)) || !slices.ContainsFunc(got, func(m host.Mount) bool { return m.Path == "/" }) {
			t.Fatalf("kept descriptor read %d mounts, a fresh read %d:\n got %+v\nwant %+v", len(got), len(fresh), got, fresh)
		}
		// The way of a kernel before 5.8 reads the same.
		if old, err := (&mountTable{path: "/proc/self/mountinfo"}).read(); err != nil || !reflect.DeepEqual(mine(old), mine(fresh)) ||
			!slices.ContainsFunc(old, func(m host.Mount) bool { return m.Path == "/" }) {
			t.Fatalf("read until two reads agree: got %+v, %v; want %+v", old, err, fresh)
		}
		var ours []string
		for _, m := range mine(got) {
			ours = append(ours, m.Path)
		}
		if !slices.Equal(ours, want) {
			t.Fatalf("got mounts %q, want %q", ours, want)
		}
	}
	check(nil)
	for i, m := range mnts {
		if err := syscall.Mount("tmpfs", m, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		check(mnts[:i+1])
	}
	mt.close()
	if err := syscall.Unmount(mnts[0], 0); err != nil {
		t.Fatal(err)
	}
	check(mnts[1:])
}

func TestReleaseAtLeast(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"6.18.44-fc-v657", true},
		{"5.8.0", true},
		{"5.8-rc1", true},
		{"5.7.19", false},
		{"4.19.0-amd64", false},
		{"10.0", true},
		{"garbage", false},
		{"5.x", false},
	} {
		if got := releaseAtLeast(tc.release, 5, 8); got != tc.want {
			t.Errorf("releaseAtLeast(%q, 5, 8): got %v, want %v", tc.release, got, tc.want)
		}
	}
}

// TestDetachReportsABusyDevice detaches a device that another user holds
// open: the kernel only marks it, so Detach reports it not gone, and it
// goes at that user's last close.
func TestDetachReportsABusyDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to attach loop devices")
	}
	detachWhileHeld(t, sparseImage(t, filepath.Join(t.TempDir(), "busy.img")))
}

// detachWhileHeld attaches img (discards refused, as for a thick volume),
// detaches the device while it holds it open, checks that Detach reports it
// not gone and that it goes at the holder's close, and returns it.
func detachWhileHeld(t *testing.T, img string) string {
	t.Helper()
	dev, err := AttachLoop(img, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loops.Release(dev, filepath.Dir(img)) })
	holder, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	if gone, err := (LoopDevices{}).Detach(dev); err != nil || gone {
		holder.Close()
		t.Fatalf("detaching %s while it is held open: gone %v, %v; want not gone", dev, gone, err)
	}
	holder.Close()
	if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still attached after its last close: %v", dev, err)
	}
	return dev
}

// TestListLoopsWhileOthersGo lists the loop devices again and again while
// other devices are detached and removed, as a teardown of many thick
// volumes does: every listing must show every device that stays attached.
// Read from /proc/partitions, which the kernel writes a page at a time and
// resumes by index, some listings skipped one (8 of 2165 listings of 150
// devices, while 150 others went); the reconciler then took a device for
// detached and forgot a stage whose device was still there.
func TestListLoopsWhileOthersGo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	const n = 200
	dir := t.TempDir()
	var devs []string
	t.Cleanup(func() {
		for _, d := range devs {
			loops.Release(d, dir)
		}
	})
	for i := range n {
		d, err := AttachLoop(sparseImage(t, filepath.Join(dir, fmt.Sprintf("%d.img", i))), true)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, d)
	}
	going, staying := devs[:n/2], devs[n/2:]
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, d := range going {
			DetachLoop(d)
			removeLoop(d)
		}
	}()
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block"}
	defer o.Close()
	listings := 0
	for running := true; running; listings++ {
		select {
		case <-done:
			running = false // one listing more, after the last went
		default:
		}
		obs, err := o.Observe()
		if err != nil {
			t.Fatal(err)
		}
		kept := obs.Loops()
		// Opening each file anew too, less often: it is slower, and the
		// kept listing is the one that must keep up with the removals.
		var once []host.Device
		if listings%8 == 0 {
			if once, err = ListLoops("/sys/block"); err != nil {
				t.Fatal(err)
			}
		}
		for i, ls := range [][]host.Device{kept, once} {
			if ls == nil {
				continue
			}
			listed := map[string]bool{}
			for _, l := range ls {
				listed[l.Device] = l.BackingFile != ""
			}
			for _, d := range staying {
				if !listed[d] {
					t.Errorf("listing %d (%s): %s, attached throughout, is missing", listings, []string{"kept", "one-shot"}[i], d)
				}
			}
		}
	}
	t.Logf("%d listings while %d devices went", listings, len(going))
}

// TestCheckMountSeesTheRootOfItsObservation mounts a filesystem over a
// root between two observations: the mount checks after the second resolve
// beneath the new root, not the one the first observation opened, and
// a check with no observation before it resolves all the same.
func TestCheckMountSeesTheRootOfItsObservation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "a", "mnt")
	var mounted []string
	t.Cleanup(func() {
		for i := len(mounted) - 1; i >= 0; i-- {
			syscall.Unmount(mounted[i], syscall.MNT_DETACH)
		}
	})
	mountAt := func(path string) {
		t.Helper()
		if err := os.MkdirAll(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", path, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		mounted = append(mounted, path)
	}
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Paths: NewPaths([]string{root})}
	defer o.Close()
	check := func() uint64 {
		t.Helper()
		id, err := o.CheckMount(mnt)
		if err != nil || id == 0 {
			t.Fatalf("CheckMount(%s): %d, %v", mnt, id, err)
		}
		return id
	}
	mountAt(mnt)
	unobserved := check()
	if _, err := o.Observe(); err != nil {
		t.Fatal(err)
	}
	if first := check(); first != unobserved {
		t.Fatalf("the same mount checked with and without an observation: %d, then %d", unobserved, first)
	}
	// A new root over the old one, holding a mount at the same path.
	mountAt(root)
	mountAt(mnt)
	if again := check(); again != unobserved {
		t.Errorf("before the next observation: %d, want %d (the root the observation opened)", again, unobserved)
	}
	if _, err := o.Observe(); err != nil {
		t.Fatal(err)
	}
	if second := check(); second == unobserved {
		t.Errorf("after the root was mounted over and observed again, CheckMount still finds the mount beneath the old root (%d)", second)
	}
}

// TestCheckMountLeavesUnmountsBe checks a mount point without pause while
// the mount there is made and unmounted again and again: no unmount may
// fail for it. In this loop, a check that held a descriptor of the mount
// point across calls made the unmounts find it busy 7071 times in 3000; a
// check that states it from its parent, 368 times; and Unmount tries a
// busy mount again at once. In the teardown of 100 volumes, one or two
// unstages in about one run of three met a pass's check and waited out
// half a second of backoff.
func TestCheckMountLeavesUnmountsBe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "a", "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	paths := NewPaths([]string{root})
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Paths: paths}
	defer o.Close()
	if _, err := o.Observe(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	checked := make(chan int)
	go func() {
		n := 0
		defer func() { checked <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := o.CheckMount(mnt); err != nil {
				t.Error(err)
				return
			}
			n++
		}
	}()
	for i := range 1000 {
		if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		if err := paths.Unmount(mnt); err != nil {
			close(stop)
			t.Fatalf("unmount %d: %v", i, err)
		}
	}
	close(stop)
	t.Logf("%d checks during 1000 unmounts", <-checked)
}

// TestObserveVolumeReadsOnlyThoseNamed checks that the observation of
// one volume holds those of its named devices attached, as they are now,
// and no other, with the top mount at the paths named.
func TestObserveVolumeReadsOnlyThoseNamed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	a, b := sparseImage(t, filepath.Join(dir, "a.img")), sparseImage(t, filepath.Join(dir, "b.img"))
	var attached []string
	t.Cleanup(func() {
		for _, d := range attached {
			loops.Release(d, dir)
		}
	})
	for _, img := range []string{a, b} {
		d, err := AttachLoop(img, true)
		if err != nil {
			t.Fatal(err)
		}
		attached = append(attached, d)
	}
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Pools: map[string]string{"default": dir}}
	defer o.Close()
	obs, err := o.ObserveVolume(attached[:1], nil, []string{"/"})
	if err != nil {
		t.Fatal(err)
	}
	if got := obs.LoopsFor(a); len(got) != 1 || got[0].Device != attached[0] {
		t.Errorf("devices of a: got %v, want %s", got, attached[0])
	}
	if got := obs.LoopsFor(b); len(got) != 0 {
		t.Errorf("devices of b, not named: got %v, want none", got)
	}
	if _, ok := obs.MountAt("/"); !ok {
		t.Error("the root path has no mount")
	}
	if err := DetachLoop(attached[0]); err != nil {
		t.Fatal(err)
	}
	if obs, err = o.ObserveVolume(attached[:1], nil, []string{"/"}); err != nil {
		t.Fatal(err)
	}
	if got := obs.LoopsFor(a); len(got) != 0 {
		t.Errorf("devices of a once detached: got %v, want none", got)
	}
	if _, err := o.ObserveVolume([]string{"/dev/sda"}, nil, nil); err == nil {
		t.Error("a device that is no loop device was read")
	}
	// A pass's listing under way (it holds the kept descriptors while it
	// reads every device, for tens of milliseconds while devices detach)
	// does not hold up the observation of named devices.
	if _, err := o.Observe(); err != nil {
		t.Fatal(err)
	}
	o.files.mu.Lock()
	defer o.files.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := o.ObserveVolume(attached[1:], nil, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ObserveVolume waited 10 s for a listing under way")
	}
}

// pathsRead is a fileReader that notes the paths read through it.
type pathsRead struct {
	fileReader
	paths []string
}

func (p *pathsRead) read(path string) (string, bool, error) {
	p.paths = append(p.paths, path)
	return p.fileReader.read(path)
}

// TestAttachReadiesTheFirstRead attaches an image through LoopDevices with
// an observer: every attribute the observation of the new device reads is
// already open, so that a request's early start right after the stage's
// attach opens none, and it reads the device as a fresh read does.
func TestAttachReadiesTheFirstRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to attach loop devices")
	}
	img := sparseImage(t, filepath.Join(t.TempDir(), "primed.img"))
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block"}
	defer o.Close()
	dev, err := NewLoopDevices(nil, o).Attach(img, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loops.Release(dev, filepath.Dir(img)) })
	name := filepath.Base(dev)
	rec := &pathsRead{fileReader: &oneShot{buf: make([]byte, attrBuf)}}
	fresh, attached, err := readLoop("/sys/block", name, rec, nil)
	if err != nil || !attached {
		t.Fatalf("reading %s: attached %v, %v", dev, attached, err)
	}
	o.filesOnce.Do(o.keepFiles)
	o.files.mu.Lock()
	for _, p := range rec.paths {
		if o.files.fds[p] == nil {
			t.Errorf("%s is read by an observation of %s and was not opened at its attach", p, dev)
		}
	}
	o.files.mu.Unlock()
	got, err := o.files.readLoops("/sys/block", []string{dev})
	if err != nil || len(got) != 1 || got[0] != fresh {
		t.Errorf("read through the attach's descriptors: %+v, %v; want %+v", got, err, fresh)
	}
}

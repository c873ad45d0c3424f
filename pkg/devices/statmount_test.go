package devices

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// volumeMounts mounts, around a fresh filesystem of type fs at dir/mnt, what
// a volume's early start must see as a pass sees it, and returns the
// volume's device and the paths its record would name: a read-only bind of
// the filesystem at a path with a space (escaped in the mount table), a
// bind at a path no record names (someone else's mount of the volume), a
// tmpfs at a named path, and a bind of the filesystem with a tmpfs stacked
// on it; a named path with nothing mounted ends the list.
func volumeMounts(t *testing.T, fs string) (dir, dev string, named []string) {
	t.Helper()
	dir = t.TempDir()
	mnt, dev := mountFresh(t, dir, fs)
	mount := func(src, path, fstype string, flags uintptr, data string) {
		t.Helper()
		if err := os.MkdirAll(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(src, path, fstype, flags, data); err != nil {
			t.Fatalf("mount %s at %s: %v", src, path, err)
		}
		t.Cleanup(func() { syscall.Unmount(path, syscall.MNT_DETACH) })
	}
	ro := filepath.Join(dir, "pods", "a target")
	mount(mnt, ro, "", syscall.MS_BIND, "")
	if err := syscall.Mount("", ro, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	mount(mnt, filepath.Join(dir, "elsewhere"), "", syscall.MS_BIND, "")
	foreign := filepath.Join(dir, "pods", "foreign")
	mount("converge-test", foreign, "tmpfs", 0, "size=1m")
	stacked := filepath.Join(dir, "pods", "stacked")
	mount(mnt, stacked, "", syscall.MS_BIND, "")
	mount("converge-test", stacked, "tmpfs", 0, "size=1m")
	return dir, dev, []string{mnt, ro, foreign, stacked, filepath.Join(dir, "pods", "none")}
}

// TestStatMountAgreesWithMountTable checks that each mount told by
// statmount reads as the mount table's line of it, for filesystems of each
// kind converge mounts and the binds and tmpfs around them, one of them
// mounted without a source.
func TestStatMountAgreesWithMountTable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	if !newMountIndex().ready() {
		t.Skip("the kernel has no statmount with every field converge reads")
	}
	for _, fs := range []string{host.FsExt4, host.FsXFS, host.FsBtrfs} {
		t.Run(fs, func(t *testing.T) {
			dir, _, _ := volumeMounts(t, fs)
			sourceless(t, filepath.Join(dir, "sourceless"))
			table, err := ReadMounts("/proc/self/mountinfo")
			if err != nil {
				t.Fatal(err)
			}
			ids, err := listMounts(make([]uint64, 16))
			if err != nil {
				t.Fatal(err)
			}
			x := newMountIndex()
			told := map[int]host.Mount{}
			for _, id := range ids {
				m, ok, err := x.read(id)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					told[m.ID] = m
				}
			}
			ours := 0
			for _, want := range table {
				got, ok := told[want.ID]
				if _, _, err := host.Beneath(want.Path, []string{dir}); err == nil {
					ours++
				} else if !ok || got.Path != want.Path {
					continue // another test's, gone or replaced since
				}
				if got != want {
					t.Errorf("statmount: %+v\nmount table: %+v", got, want)
				}
			}
			if ours != 7 {
				t.Errorf("the mount table lists %d of the test's mounts, want 7", ours)
			}
		})
	}
}

// sourceless mounts a tmpfs made with fsmount(2) and no source at path:
// the kernel names its source "none".
func sourceless(t *testing.T, path string) {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		t.Fatal(err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(path, syscall.MNT_DETACH) })
}

// TestObserveVolumeAgreesWithObserve checks that the observation of one
// volume answers each question a volume's plan asks (the mounts of its
// filesystem, the top mount at each path its record names, its devices)
// as the observation of the whole machine does, with statmount and with
// the mount table, and after the filesystem is shut down.
func TestObserveVolumeAgreesWithObserve(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	for _, fs := range []string{host.FsExt4, host.FsXFS, host.FsBtrfs} {
		t.Run(fs, func(t *testing.T) {
			dir, dev, named := volumeMounts(t, fs)
			image := filepath.Join(dir, "a.img")
			for _, way := range []string{"statmount", "mount table", "shut down"} {
				o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Pools: map[string]string{"default": dir},
					Paths: NewPaths([]string{filepath.Join(dir, "pods")})}
				defer o.Close()
				o.filesOnce.Do(o.keepFiles)
				switch way {
				case "statmount":
					if !o.index.ready() {
						t.Log("the kernel has no statmount with every field converge reads")
					}
				case "mount table":
					o.index.usableOnce.Do(func() {}) // as a kernel without statmount
				case "shut down":
					if fs == host.FsBtrfs {
						continue
					}
					shutDown(t, named[0])
				}
				one, err := o.ObserveVolume([]string{dev}, nil, named)
				if err != nil {
					t.Fatalf("%s: %v", way, err)
				}
				all, err := o.Observe()
				if err != nil {
					t.Fatal(err)
				}
				loops := all.LoopsFor(image)
				if got := one.LoopsFor(image); len(loops) != 1 || !slices.Equal(got, loops) {
					t.Errorf("%s: devices of the image: got %+v, want %+v", way, got, loops)
				}
				if len(loops) == 0 {
					continue
				}
				if got, want := one.MountsOf(loops[0].Dev), all.MountsOf(loops[0].Dev); len(want) != 4 || !slices.Equal(got, want) {
					t.Errorf("%s: mounts of the filesystem:\ngot  %+v\nwant %+v (4)", way, got, want)
				}
				for _, p := range named {
					got, gotOK := one.MountAt(p)
					want, wantOK := all.MountAt(p)
					if got != want || gotOK != wantOK {
						t.Errorf("%s: mount at %s: got %+v (%t), want %+v (%t)", way, p, got, gotOK, want, wantOK)
					}
				}
			}
		})
	}
}

// shutDown shuts the filesystem mounted at mnt down (ext4's and xfs's
// GOINGDOWN ioctl, without flushing its log): every I/O on it fails.
func shutDown(t *testing.T, mnt string) {
	t.Helper()
	f, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const goingDown = 0x8004587d // _IOR('X', 125, __u32)
	const noLogFlush = 2
	if err := unix.IoctlSetPointerInt(int(f.Fd()), goingDown, noLogFlush); err != nil {
		t.Fatalf("shut down %s: %v", mnt, err)
	}
}

// TestObserveVolumeFindsTheTopMountALookupReaches mounts the volume's
// filesystem at a target, then moves onto it a tmpfs tree cloned before
// (open_tree), which keeps its older mount ID: the mount table lists the
// tmpfs first, under the volume's mount, while a lookup of the target
// reaches the tmpfs. The observation of the volume has the tmpfs on top,
// so that no publish counts as in place on a mount that covers it.
func TestObserveVolumeFindsTheTopMountALookupReaches(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	if !newMountIndex().ready() {
		t.Skip("the kernel has no statmount with every field converge reads")
	}
	dir := t.TempDir()
	mnt, dev := mountFresh(t, dir, host.FsExt4)
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("converge-test", src, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(src, syscall.MNT_DETACH) })
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tree)
	target := filepath.Join(dir, "pods", "target")
	if err := os.MkdirAll(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(mnt, target, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(target, syscall.MNT_DETACH) })
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(target, syscall.MNT_DETACH) })
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Paths: NewPaths([]string{filepath.Join(dir, "pods")})}
	defer o.Close()
	obs, err := o.ObserveVolume([]string{dev}, nil, []string{target})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := obs.MountAt(target); !ok || m.FsType != "tmpfs" {
		t.Errorf("top mount at the target: got %+v (%t), want the tmpfs moved there last", m, ok)
	}
}

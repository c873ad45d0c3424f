package runs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// detachTimeout bounds the wait for a run's loop devices to go: a device
// still open when detached goes at its last close (the kernel's
// autoclear), which ends with its last mount, in the namespaces of
// processes killed a moment ago.
const detachTimeout = 5 * time.Second

// MountsIn lists the mount points of a mount table (a mountinfo file) at
// or under dir, deepest first. A table that cannot be read has none.
func MountsIn(mountinfo, dir string) []string {
	mounts, err := devices.ReadMounts(mountinfo)
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range mounts {
		if m.Path == dir || strings.HasPrefix(m.Path, dir+"/") {
			out = append(out, m.Path)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// mountsUnder lists the mount points under dir (dir included) in this
// process's mount namespace, deepest first, as converge's own device layer
// reads them.
func mountsUnder(dir string) []string {
	return MountsIn("/proc/self/mountinfo", dir)
}

// LoopsBackedUnder maps each attached loop device whose backing file lies
// under dir to that file, deleted or not, and each loop device attached to
// one of those to "holds <device>". None is an empty map.
//
// csi-node attaches images in its container, through its hostPath of the
// node's state directory or a pool's: the kernel names such a file by its
// path in the container (/var/lib/converge/volumes/...) or, once the
// container has ended, beneath the hostPath (/volumes/..., or /<image> in
// a pool). Those are found in the state and pool directories of the run's
// nodes by their device and inode numbers, while the directory exists and
// the pool is mounted: Clean lists them before it unmounts. The kubelet
// attaches a loop device to a raw block volume's device to hold it while a
// pod maps it; a kubelet killed leaves it, holding the volume's.
func LoopsBackedUnder(dir string) map[string]string {
	out := map[string]string{}
	loops := listLoops()
	var roots []string
	// A node's data directory (converge/volumes) may be a filesystem of
	// its own, as the second node's is: its images are named relative to
	// it.
	for _, pattern := range []string{"converge", "converge/volumes", "pools/*", "nodes/*/converge", "nodes/*/converge/volumes", "nodes/*/pools/*"} {
		more, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, m := range more {
			if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
				roots = append(roots, m)
			}
		}
	}
	for _, l := range loops {
		if strings.HasPrefix(l.BackingFile, dir+"/") {
			out[l.Device] = l.BackingFile
			continue
		}
		for _, r := range roots {
			if path, ok := devices.ResolveBacking(l, r); ok {
				out[l.Device] = path
				break
			}
		}
	}
	// The holders, and theirs.
	for range 3 {
		held := map[loopID]string{}
		for dev := range out {
			var st unix.Stat_t
			if unix.Stat(dev, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
				held[loopID{uint64(st.Dev), st.Ino}] = dev
			}
		}
		more := false
		for _, l := range loops {
			if _, ok := out[l.Device]; ok {
				continue
			}
			if id, ok := identity(l.Device); ok && held[id] != "" {
				out[l.Device] = "holds " + held[id]
				more = true
			}
		}
		if !more {
			break
		}
	}
	return out
}

// loopID names a loop device's backing file by its device and inode
// numbers, as the kernel keeps them (LOOP_GET_STATUS64).
type loopID struct{ dev, ino uint64 }

// identity is what the loop device dev is attached to, if it is.
func identity(dev string) (loopID, bool) {
	f, err := os.Open(dev)
	if err != nil {
		return loopID{}, false
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return loopID{}, false
	}
	return loopID{info.Device, info.Inode}, true
}

// identities are the identity of each of loops, taken when they were
// listed: detachLoops detaches a device only if it is still attached to
// the same file.
func identities(loops map[string]string) map[string]loopID {
	out := map[string]loopID{}
	for dev := range loops {
		if id, ok := identity(dev); ok {
			out[dev] = id
		}
	}
	return out
}

// unmountUnder detaches (MNT_DETACH) every mount at or under dir.
func unmountUnder(dir string, note func(string, ...any)) {
	for _, m := range mountsUnder(dir) {
		// UMOUNT_NOFOLLOW: a path under the run's directory that became a
		// symlink since the mount table was read leads nowhere else.
		if err := syscall.Unmount(m, syscall.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, syscall.EINVAL) {
			note("unmount %s: %v", m, err)
		}
	}
}

// detachLoops detaches the loop devices loops lists (device to backing
// file) that are still attached to the files ids says they were when
// listed (a device freed since, by the kills or the unmounts, may hold
// another's file by now), holders first, and waits, up to timeout, until
// none of them is, detaching again those whose detach failed; it notes
// those it could not detach and those still attached then.
func detachLoops(loops map[string]string, ids map[string]loopID, timeout time.Duration, note func(string, ...any)) {
	if len(loops) == 0 {
		return
	}
	still := func() map[string]string {
		out := map[string]string{}
		for dev, file := range loops {
			if id, ok := identity(dev); ok && id == ids[dev] {
				out[dev] = file
			}
		}
		return out
	}
	failed := map[string]error{}
	detach := func(devs []string) {
		// A holder goes first: the device it holds goes at its last close.
		sort.Slice(devs, func(i, j int) bool {
			return strings.HasPrefix(loops[devs[i]], "holds ") && !strings.HasPrefix(loops[devs[j]], "holds ")
		})
		for _, dev := range devs {
			if err := devices.DetachLoop(dev); err != nil {
				failed[dev] = err
			} else {
				delete(failed, dev)
			}
		}
	}
	detach(slices.Collect(maps.Keys(still())))
	var left map[string]string
	poll.Wait(context.Background(), timeout, 100*time.Millisecond, func() error {
		left = still()
		if len(left) == 0 {
			return nil
		}
		var again []string
		for dev := range left {
			if failed[dev] != nil {
				again = append(again, dev)
			}
		}
		detach(again)
		return fmt.Errorf("%d loop devices still attached", len(left))
	})
	for dev, file := range left {
		if err := failed[dev]; err != nil {
			note("detach %s (%s): %v", dev, file, err)
			continue
		}
		note("loop device %s (%s) still attached: open elsewhere", dev, file)
	}
}

// loopMajor is the loop driver's block major number.
const loopMajor = 7

// LoopFilesystems lists those of dirs at which this process's mount
// namespace has a whole filesystem of a loop device mounted, the topmost
// mount there: a filesystem in an image file, which a node may have as a
// disk of its own, and never the machine's disk. A mount table that cannot
// be read lists none.
func LoopFilesystems(dirs ...string) []string {
	mounts, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return loopMountsAt(mounts, dirs)
}

// loopMountsAt is LoopFilesystems of the mount table mounts, in its
// order: a later mount at a path is on top of an earlier one.
func loopMountsAt(mounts []host.Mount, dirs []string) []string {
	var out []string
	for _, d := range dirs {
		top := -1
		for i, m := range mounts {
			if m.Path == d {
				top = i
			}
		}
		if top >= 0 && mounts[top].Dev.Major == loopMajor && mounts[top].Root == "/" {
			out = append(out, d)
		}
	}
	return out
}

// listLoops lists the loop devices attached. A listing fails whole when a
// device goes while it is read (other tests on the machine attach and
// remove theirs all the time), and a clean-up that took that for "none"
// would leave every device of the run attached: it lists again, a few
// times, and only then takes what it has.
func listLoops() []host.Device {
	var loops []host.Device
	var err error
	for range 10 {
		if loops, err = devices.ListLoops("/sys/block"); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return loops
}

package runs

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/devices"
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
// under dir to that file, deleted or not. None is an empty map.
//
// csi-node attaches images in its container, through its hostPath of the
// node's state directory: the kernel names such a file by its path in the
// container (/var/lib/converge/volumes/...) or, once the container has
// ended, beneath the hostPath (/volumes/...). Those are found in the
// state directories of the run's nodes by their device and inode numbers,
// while the directory exists.
func LoopsBackedUnder(dir string) map[string]string {
	out := map[string]string{}
	loops, _ := devices.ListLoops("/sys/block")
	states, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "converge"))
	states = append(states, filepath.Join(dir, "converge"))
	for _, l := range loops {
		if strings.HasPrefix(l.BackingFile, dir+"/") {
			out[l.Device] = l.BackingFile
			continue
		}
		for _, s := range states {
			if path, ok := devices.ResolveBacking(l, s); ok {
				out[l.Device] = path
				break
			}
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
// file, as listLeft lists what is attached now) and waits, up to detachTimeout, until listLeft lists none of them;
// it notes those it could not detach and those still attached then.
func detachLoops(loops map[string]string, listLeft func() map[string]string, note func(string, ...any)) {
	if len(loops) == 0 {
		return
	}
	// A device freed since loops was listed (its mount went with the
	// processes killed) may hold another's file by now: each is detached
	// only if it still holds the file listed.
	now := listLeft()
	for dev, file := range loops {
		if now[dev] != file {
			continue
		}
		if err := devices.DetachLoop(dev); err != nil {
			note("detach %s (%s): %v", dev, file, err)
		}
	}
	var left map[string]string
	poll.Wait(context.Background(), detachTimeout, 100*time.Millisecond, func() error {
		left = listLeft()
		for dev, file := range left {
			if loops[dev] != file {
				delete(left, dev) // not one of those: attached since
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%d loop devices still attached", len(left))
		}
		return nil
	})
	for dev, file := range left {
		note("loop device %s (%s) still attached: open elsewhere", dev, file)
	}
}

package devices

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/locks"
)

// Observer reads the actual state of the machine.
type Observer struct {
	// MountInfo is the mountinfo file, normally /proc/self/mountinfo.
	MountInfo string
	// SysBlock is the sysfs block directory, normally /sys/block.
	SysBlock string
	// Paths resolves mount points beneath the plugin's roots without
	// symlinks for CheckMount; nil resolves every path as it is.
	Paths *Paths
	// Pools are the data directories of the storage pools, by pool name,
	// whose loop devices and space are observed; nil for none.
	Pools map[string]string

	// files keeps the files of the loop listing open between passes, and
	// mounts the mount table's; made on first use, as is index.
	filesOnce sync.Once
	files     *keptFiles
	mounts    *mountTable
	// index reads a volume's mounts without the mount table
	// (ObserveVolume).
	index *mountIndex

	// loopFiles tells which loop devices are the data directory's
	// (backing_linux.go).
	loopFiles loopFiles

	// rootsMu guards roots: the descriptors of Paths' roots, opened anew
	// by each observation for the mount checks that follow it (one open
	// for a pass rather than one for each mount), so that the roots
	// resolved are as new as the observation.
	rootsMu locks.Mutex
	roots   rootFds
}

// Observe parses the mount table once and lists the loop devices.
func (o *Observer) Observe() (*host.Observation, error) {
	o.begin()
	mounts, err := o.mounts.readFresh()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", o.MountInfo, err)
	}
	loops, err := o.files.listLoops(o.SysBlock)
	if err != nil {
		return nil, fmt.Errorf("listing loop devices: %w", err)
	}
	o.loopFiles.forget(loops)
	return o.observation(mounts, loops), nil
}

// ObserveVolume is the observation of one volume whose loop devices are
// known (loops, as "/dev/loopN"; a static volume's device is named by its
// number in devs instead), at a cost that does not grow with the devices
// and mounts of the machine: of the loop devices, those of loops still
// attached, read anew; of the mounts, those of the filesystems on them and
// on devs, and the top mount at each of paths (the volume's staging path
// and targets) as a lookup of the path reaches it, read anew with
// statmount(2) (statmount_linux.go). A device attached since the caller
// learnt its volume's devices is not in it.
//
// Its answers about the volume are Observe's but in one way: at a path
// of paths, Observe's top mount is the one mounted last there, this one's
// the one a lookup of the path reaches. They differ where someone else's
// mount there is out of a lookup's reach (a mount on one of the path's
// parents hides it) or was put beneath (MOVE_MOUNT_BENEATH) or moved there
// from a tree cloned before (open_tree), and there a lookup's answer is
// the true one: what the kubelet and the pod find at the path.
//
// Where the mounts cannot be told without the mount table (before Linux
// 6.13, a path whose lookup fails otherwise than on nothing there, a
// mount whose strings pass 1 MiB), it is read whole, and callers at the
// same moment share one read that begins after each of them called.
func (o *Observer) ObserveVolume(loops []string, devs []host.DevNum, paths []string) (*host.Observation, error) {
	o.begin()
	attached, err := o.files.readLoops(o.SysBlock, loops)
	if err != nil {
		return nil, fmt.Errorf("reading loop devices %v: %w", loops, err)
	}
	devs = slices.Clone(devs)
	var sources []string
	for _, l := range attached {
		devs, sources = append(devs, l.Dev), append(sources, l.Device)
	}
	var mounts []host.Mount
	tops, err := o.pathTops(paths)
	if err == nil {
		mounts, err = o.index.mounts(devs, sources, tops)
	}
	if errors.Is(err, errUseMountTable) {
		klog.Background().V(4).Info("Reading the whole mount table for a volume's observation", "loopDevices", loops, "reason", err)
		mounts, err = o.mounts.readFresh()
		if err != nil {
			err = fmt.Errorf("reading %s: %w", o.MountInfo, err)
		}
	}
	if err != nil {
		return nil, err
	}
	return o.observation(mounts, attached), nil
}

// attached readies the observer to read dev, just attached, so that its
// first read opens none of its attributes (keptFiles.prime).
func (o *Observer) attached(dev string) {
	name, ok := strings.CutPrefix(dev, "/dev/")
	if !ok || !strings.HasPrefix(name, "loop") || strings.Contains(name, "/") {
		return
	}
	o.filesOnce.Do(o.keepFiles)
	o.files.prime(o.SysBlock, name)
}

// begin readies an observation: the kept files, and the roots opened
// anew for the mount checks that follow it.
func (o *Observer) begin() {
	o.filesOnce.Do(o.keepFiles)
	if o.Paths != nil {
		o.rootsMu.Lock()
		o.roots.close()
		o.roots = o.Paths.pin()
		o.rootsMu.Unlock()
	}
}

// observation builds an observation of mounts and loops, with the devices
// of the pools' images told from others' (loopFiles.own) and each pool's
// space.
func (o *Observer) observation(mounts []host.Mount, loops []host.Device) *host.Observation {
	names := slices.Sorted(maps.Keys(o.Pools))
	for _, name := range names {
		loops = o.loopFiles.own(loops, o.Pools[name])
	}
	obs := host.NewObservation(byDevice(mounts, loops), loops)
	for _, name := range names {
		if total, free, err := (&Images{Dir: o.Pools[name]}).Capacity(); err == nil {
			obs.WithPool(name, host.PoolSpace{Known: true, Total: total, Free: free})
		}
	}
	return obs
}

// Close closes the files Observe keeps open. Observe may be called again
// afterwards; it opens them anew.
func (o *Observer) Close() error {
	o.filesOnce.Do(o.keepFiles)
	o.files.close()
	o.mounts.close()
	o.rootsMu.Lock()
	o.roots.close()
	o.roots = nil
	o.rootsMu.Unlock()
	return nil
}

func (o *Observer) keepFiles() {
	o.files, o.mounts, o.index = newKeptFiles(), newMountTable(o.MountInfo), newMountIndex()
}

// byDevice gives the mounts of a filesystem that reports an anonymous
// device number (btrfs: 0:N) the number of the loop device it is on, named
// by the mount source, so that every mount is matched to its device alike.
func byDevice(mounts []host.Mount, loops []host.Device) []host.Mount {
	dev := make(map[string]host.DevNum, len(loops))
	for _, l := range loops {
		dev[l.Device] = l.Dev
	}
	for i, m := range mounts {
		if d, ok := dev[m.Source]; ok && m.Dev.Major == 0 && m.FsType == host.FsBtrfs {
			mounts[i].Dev = d
		}
	}
	return mounts
}

// CheckMount stats a mount point and returns the unique ID of the top mount
// there (0 when it cannot be told: a kernel before Linux 6.8, or a path
// beneath the roots with a symlink in it just now, which a rename racing
// the observation can make), and the error when the stat shows a corrupted
// mount (ENOTCONN, ESTALE, EIO and the others of mount-utils'
// IsCorruptedMnt); any other failure is no error, as the mount table is the
// authority on whether something is mounted there. A path beneath the roots
// is resolved without following any symlink, so the ID is never another
// mount's that a symlink led to, beneath the root as the latest Observe
// found it.
//
// The check holds the mount it checks as briefly as it can: the path's
// parent is opened, and the mount point stated from there in one call. A
// descriptor of the mount point itself, held across calls, made the
// reconciler's own unmounts of it find it busy (EBUSY) far more often
// while a pass checked it (TestCheckMountLeavesUnmountsBe).
func (o *Observer) CheckMount(path string) (uint64, error) {
	id, err := o.topMount(path)
	if err != nil && (mount.IsCorruptedMnt(err) || mount.IsCorruptedMnt(errors.Unwrap(err))) {
		return 0, err
	}
	if err != nil {
		return 0, nil
	}
	return id, nil
}

// topMount returns the unique ID of the top mount at path (0 when the
// kernel does not tell it), resolved as CheckMount says, and the error of
// the path's resolution or stat as it is.
func (o *Observer) topMount(path string) (uint64, error) {
	if _, _, berr := host.Beneath(path, o.rootsOf()); o.Paths != nil && berr == nil && !slices.Contains(o.Paths.roots, path) {
		o.rootsMu.Lock()
		dir, err := o.Paths.openIn(o.roots, filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY)
		o.rootsMu.Unlock()
		if err != nil {
			return 0, err
		}
		defer unix.Close(dir)
		return mountID(dir, filepath.Base(path))
	}
	return mountID(unix.AT_FDCWD, path)
}

// pathTops finds the top mount at each of paths, as CheckMount does (a
// path beneath the roots resolved without following any symlink): none at
// a path that is not there (ENOENT, ENOTDIR); any other failure, a symlink
// on the way or a broken mount (EIO, ENOTCONN, ESTALE), and the mount
// table, which asks no filesystem anything, is read instead
// (errUseMountTable). It runs before mountIndex's lock is taken: a lookup
// held up by a hung filesystem on the way holds up its own request alone.
func (o *Observer) pathTops(paths []string) ([]pathTop, error) {
	tops := make([]pathTop, 0, len(paths))
	for _, p := range paths {
		id, err := o.topMount(p)
		switch {
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
			id = 0
		case err != nil:
			return nil, fmt.Errorf("%w: %s: %w", errUseMountTable, p, err)
		case id == 0:
			return nil, fmt.Errorf("%w: %s: the kernel tells no unique mount ID", errUseMountTable, p)
		}
		tops = append(tops, pathTop{path: p, id: id})
	}
	return tops, nil
}

// rootsOf returns the roots of o.Paths, none without it.
func (o *Observer) rootsOf() []string {
	if o.Paths == nil {
		return nil
	}
	return o.Paths.roots
}

// mountID returns the unique ID of the top mount at path, resolved from
// dirfd; 0 when the kernel does not tell it.
func mountID(dirfd int, path string) (uint64, error) {
	var stx unix.Statx_t
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	if path == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	err := unix.Statx(dirfd, path, flags, unix.STATX_MNT_ID_UNIQUE, &stx)
	if err != nil {
		return 0, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return 0, nil
	}
	return stx.Mnt_id, nil
}

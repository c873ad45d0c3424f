package devices

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ErrMisplacedMount is returned when a mount did not land on the path it
// was made for (a path component was swapped for a symlink meanwhile).
var ErrMisplacedMount = errors.New("mount did not land on its path")

// bindAttrs maps the per-mount flags a bind mount can carry to the mount
// attributes they set and clear. The access-time flags are values of one
// field (MOUNT_ATTR__ATIME): mount_setattr takes one only with the field
// cleared, and answers EINVAL otherwise; the last one given wins. Filesystem
// options (errors=, discard, context=...) belong to the staging mount; a
// bind mount cannot change them and ignores them, as it ignores the flags
// that only undo one of these ("rw", "exec", "atime"...): a bind starts
// from the staging mount's attributes.
var bindAttrs = map[string]struct{ set, clr uint64 }{
	"ro":          {set: unix.MOUNT_ATTR_RDONLY},
	"nosuid":      {set: unix.MOUNT_ATTR_NOSUID},
	"nodev":       {set: unix.MOUNT_ATTR_NODEV},
	"noexec":      {set: unix.MOUNT_ATTR_NOEXEC},
	"nodiratime":  {set: unix.MOUNT_ATTR_NODIRATIME},
	"noatime":     {set: unix.MOUNT_ATTR_NOATIME, clr: unix.MOUNT_ATTR__ATIME},
	"strictatime": {set: unix.MOUNT_ATTR_STRICTATIME, clr: unix.MOUNT_ATTR__ATIME},
	"relatime":    {set: unix.MOUNT_ATTR_RELATIME, clr: unix.MOUNT_ATTR__ATIME},
}

// bindAttr returns the mount attributes that options ask of a bind mount.
func bindAttr(options []string) unix.MountAttr {
	var attr unix.MountAttr
	for _, o := range options {
		a := bindAttrs[o]
		attr.Attr_set = attr.Attr_set&^a.clr | a.set
		attr.Attr_clr |= a.clr
	}
	return attr
}

// fdPath names the file an O_PATH descriptor refers to, for system calls
// that take a path: the kernel resolves it to exactly that file, whatever
// happens to the path the descriptor was opened by.
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// BindMount bind mounts the directory source at the directory target, both
// resolved beneath the roots without symlinks, through file descriptors
// only: the mount is cloned from source (open_tree), gets its attributes
// while still detached (so a read-only bind is never writable, not even for
// an instant), and is attached at target (move_mount). A symlink swapped
// into either path after the check cannot redirect it.
func (p *Paths) BindMount(source, target string, options []string) (uint64, error) {
	attr := bindAttr(options)
	dst, err := p.open(target, unix.O_DIRECTORY)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dst)
	src, err := p.open(source, unix.O_DIRECTORY)
	if err != nil {
		return 0, err
	}
	tree, err := unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	// Closed at once: a descriptor open inside the source mount makes it
	// busy, and an unmount of it by someone else (a repair from outside,
	// an operator) would fail while the bind is being attached.
	unix.Close(src)
	if err != nil {
		return 0, fmt.Errorf("cloning the mount at %s: %w", source, err)
	}
	// The descriptor holds the mount; close it once attached, or the mount
	// stays busy.
	defer unix.Close(tree)
	if attr.Attr_set != 0 || attr.Attr_clr != 0 {
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return 0, refused(fmt.Errorf("setting %v on the bind mount of %s: %w", options, source, err))
		}
	}
	if err := unix.MoveMount(tree, "", dst, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return 0, fmt.Errorf("attaching the bind mount of %s at %s: %w", source, target, err)
	}
	return attached(tree)
}

// refused marks err with ErrRefused when the kernel answered EINVAL.
func refused(err error) error {
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
}

// attached returns the unique mount ID of the mount the descriptor tree
// holds, once attached: what the plugin records as its own. 0 when the
// kernel does not tell it.
func attached(tree int) (uint64, error) {
	id, err := mountID(tree, "")
	if err != nil {
		return 0, fmt.Errorf("reading the ID of the new mount: %w", err)
	}
	return id, nil
}

// Mkfile creates the empty regular file path (its parent must exist) with
// mode 0600, resolved beneath the roots without symlinks: the target of a
// raw block publish. An existing regular file is a no-op.
func (p *Paths) Mkfile(path string) error {
	parent, err := p.open(filepath.Dir(path), unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	fd, err := unix.Openat(parent, filepath.Base(path), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err := unix.Fstatat(parent, filepath.Base(path), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%s exists and is not a regular file", path)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	return unix.Close(fd)
}

// BindDevice bind mounts the device node dev (a path the plugin derived,
// not a request's) on the file target, resolved beneath the roots without
// symlinks, through descriptors as BindMount does; ro makes it read-only
// before it is attached.
func (p *Paths) BindDevice(dev, target string, ro bool) (uint64, error) {
	dst, err := p.open(target, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dst)
	tree, err := unix.OpenTree(unix.AT_FDCWD, dev, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return 0, fmt.Errorf("cloning %s: %w", dev, err)
	}
	defer unix.Close(tree)
	if ro {
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
			return 0, refused(fmt.Errorf("making the bind mount of %s read-only: %w", dev, err))
		}
	}
	if err := unix.MoveMount(tree, "", dst, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return 0, fmt.Errorf("attaching %s at %s: %w", dev, target, err)
	}
	return attached(tree)
}

// Unmount unmounts the top mount at path. The parent directory is resolved
// beneath the roots without symlinks and held by a descriptor; the last
// component is looked up in it without following a symlink. A path that is
// not mounted, or does not exist, is a no-op.
func (p *Paths) Unmount(path string) error {
	parent, err := p.open(filepath.Dir(path), unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	return unmountIn(parent, path)
}

// busyTries bounds the tries of an unmount that finds its mount busy; the
// first retry comes after busyPause, each later one after twice the pause
// before it (about 50 ms in all).
const (
	busyTries = 10
	busyPause = 100 * time.Microsecond
)

// unmountIn unmounts the top mount at the last component of path in the
// directory parent, without following a symlink there. Nothing mounted
// there, or nothing there, is a no-op. A mount found busy is tried again
// a few times at once: whatever looks at a mount (a stat of it, by the
// plugin's own passes, or a df, or udev) holds it for as long as that
// call, and a busy mount failing the operation waits out a backoff of half
// a second; a mount that stays busy (a process working in it) still fails.
func unmountIn(parent int, path string) error {
	name := fdPath(parent) + "/" + filepath.Base(path)
	err := unix.Unmount(name, unix.UMOUNT_NOFOLLOW)
	for try, pause := 1, busyPause; errors.Is(err, unix.EBUSY) && try < busyTries; try, pause = try+1, 2*pause {
		time.Sleep(pause)
		err = unix.Unmount(name, unix.UMOUNT_NOFOLLOW)
	}
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil
	default:
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
}

// ErrNotOwned is returned by UnmountOwned when the top mount at the path is
// not the mount it was asked to remove.
var ErrNotOwned = errors.New("the mount there is not the one to remove")

// UnmountOwned unmounts the top mount at path only if its unique mount ID
// is id: the plugin's own mount, found at a path no record names. Any other
// mount there is someone else's (the kubelet's subPath bind mounts, an
// operator's) and is left alone with ErrNotOwned. The path is resolved as
// for Unmount; the ID is read through the same parent descriptor right
// before the unmount. A path that is not mounted is a no-op.
func (p *Paths) UnmountOwned(path string, id uint64) error {
	parent, err := p.open(filepath.Dir(path), unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	got, err := mountID(parent, filepath.Base(path))
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if id == 0 || got != id {
		return fmt.Errorf("%w: %s holds mount %d, not %d", ErrNotOwned, path, got, id)
	}
	return unmountIn(parent, path)
}

// CheckMountedAt verifies that the directory path, resolved beneath the
// roots without symlinks, is the root of a mount of the block device dev,
// and returns that mount's unique ID (0 when the kernel does not tell it),
// read through the same descriptor: a mount stacked on the path after the
// check cannot lend its ID. It is ErrMisplacedMount when the path holds
// another mount.
//
// The mount is identified by its mount ID (statx), not by the device number
// a stat shows: btrfs gives each subvolume, the top one included, its own
// anonymous device number, which is neither dev's nor the one mountinfo
// lists for the mount.
func (p *Paths) CheckMountedAt(dev, path string) (uint64, error) {
	var devSt unix.Stat_t
	if err := unix.Stat(dev, &devSt); err != nil {
		return 0, fmt.Errorf("stat %s: %w", dev, err)
	}
	fd, err := p.open(path, unix.O_DIRECTORY)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return 0, fmt.Errorf("statx %s: %w", path, err)
	}
	var unique uint64
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE != 0 {
		unique = stx.Mnt_id
	}
	if uint64(unix.Mkdev(stx.Dev_major, stx.Dev_minor)) == devSt.Rdev {
		return unique, nil
	}
	// mountinfo lists the mounts by their old, reusable IDs.
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, fmt.Errorf("statx %s: %w", path, err)
	}
	mounts, err := ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	for _, m := range mounts {
		if stx.Mask&unix.STATX_MNT_ID != 0 && uint64(m.ID) == stx.Mnt_id {
			if m.Source == dev && m.Root == "/" {
				return unique, nil
			}
			return 0, fmt.Errorf("%w: %s holds %s (%s) at %s, not %s", ErrMisplacedMount, path, m.Source, m.FsType, m.Path, dev)
		}
	}
	return 0, fmt.Errorf("%w: %s holds device %d:%d, not %s", ErrMisplacedMount, path, stx.Dev_major, stx.Dev_minor, dev)
}

// unmountStray unmounts every mount of dev's filesystem that does not lie
// beneath the roots: a mount the plugin just made and that a swapped
// symlink carried outside. Mounts beneath the roots are left to the
// reconciler.
func unmountStray(dev string, p *Paths) error {
	var devSt unix.Stat_t
	if err := unix.Stat(dev, &devSt); err != nil {
		return fmt.Errorf("stat %s: %w", dev, err)
	}
	mounts, err := ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if uint64(unix.Mkdev(m.Dev.Major, m.Dev.Minor)) != devSt.Rdev && m.Source != dev {
			continue
		}
		if _, _, err := p.split(m.Path); err == nil {
			continue
		}
		if err := unix.Unmount(m.Path, unix.UMOUNT_NOFOLLOW); err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m.Path, err))
		}
	}
	return errors.Join(errs...)
}

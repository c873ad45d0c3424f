package devices

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// fsImmutableFL is FS_IMMUTABLE_FL (linux/fs.h), which x/sys does not
// define: no write, link, rename or removal in the inode, by root
// included, until it is cleared.
const fsImmutableFL = 0x10

// sealMark is the extended attribute that marks an inode Seal made
// immutable, so that Remove clears only what Seal set: an inode an
// administrator made immutable keeps its flag. The trusted namespace takes
// CAP_SYS_ADMIN to set or read, which no pod holds.
const sealMark = "trusted.converge.sealed"

// Seal makes the target at path (a publish's directory, or a raw block
// volume's file) immutable beneath whatever is mounted on it, so that a
// container the runtime starts while the volume is unmounted for a repair
// gets EPERM on every write instead of writing to the node's disk: the
// kubelet restarts a pod's containers without asking the driver, and the
// runtime binds the bare target into them. The target stays sealed beneath
// the volume once it is mounted again (such a container keeps its bind of
// the bare target); Remove unseals it.
//
// It acts beneath the live mount, through a non-recursive clone of the
// parent's mount, so that the target is never bare and unsealed and the
// volume's own root is never touched. Only a directory, or a regular file
// with one link, is sealed (a device node, a FIFO or a hard link to
// another file is an error), and it is marked (sealMark) before its flag
// is set. A target that is immutable already is a no-op.
func (p *Paths) Seal(path string) error {
	parentFd, err := p.open(filepath.Dir(path), unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(parentFd)
	tree, err := unix.OpenTree(parentFd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("cloning the mount of %s: %w", filepath.Dir(path), err)
	}
	defer unix.Close(tree)
	fd, err := openTarget(tree, filepath.Base(path))
	if err != nil {
		return fmt.Errorf("sealing %s: %w", path, err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return fmt.Errorf("reading the flags of %s: %w", path, err)
	}
	if flags&fsImmutableFL != 0 {
		return nil
	}
	if err := unix.Fsetxattr(fd, sealMark, []byte("1"), 0); err != nil {
		return fmt.Errorf("marking %s sealed: %w", path, err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsImmutableFL)); err != nil {
		// Unmarked again: a mark left on an inode that is not sealed
		// would let Remove clear a flag someone else sets later.
		return errors.Join(fmt.Errorf("sealing %s: %w", path, err), unix.Fremovexattr(fd, sealMark))
	}
	// A link made between openTarget's check and the flag would leave a
	// sealed inode with another name; sealed, it can take no more links.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || (st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink != 1) {
		return errors.Join(fmt.Errorf("sealing %s: %w", path, errNotSealable), err,
			unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags)), unix.Fremovexattr(fd, sealMark))
	}
	return nil
}

// unseal clears the immutable flag of name in the directory dirFd when
// Seal set it (the inode bears sealMark), so that the removal that follows
// can go on. A mount root (the volume, still mounted there), a missing
// name, an inode of another type and an inode Seal did not mark are left
// as they are; a failure is logged, and the removal then fails as it would
// have.
func unseal(dirFd int, path string) {
	if _, err := unsealAt(dirFd, filepath.Base(path)); err != nil {
		klog.Background().Error(err, "Could not unseal a target before removing it", "targetPath", path)
	}
}

// unsealAt is unseal, reporting whether it unsealed name, and its failure.
func unsealAt(dirFd int, name string) (bool, error) {
	fd, err := openTarget(dirFd, name)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, errNotSealable) || errors.Is(err, errMountRoot) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if _, err := unix.Fgetxattr(fd, sealMark, nil); err != nil {
		if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP) {
			return false, nil // not sealed by Seal
		}
		return false, fmt.Errorf("reading its mark: %w", err)
	}
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return false, fmt.Errorf("reading its flags: %w", err)
	}
	if flags&fsImmutableFL != 0 {
		if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags&^fsImmutableFL)); err != nil {
			return false, fmt.Errorf("clearing its immutable flag: %w", err)
		}
	}
	if err := unix.Fremovexattr(fd, sealMark); err != nil && !errors.Is(err, unix.ENODATA) {
		return false, fmt.Errorf("removing its mark: %w", err)
	}
	return true, nil
}

// UnsealTree unseals every target under dir that Seal sealed, following
// no symlink, so that the tree can be removed once nothing is mounted in
// it: for the clean-up of a plugin's directories after it stopped (tests,
// a test cluster's teardown). It returns how many it unsealed, and every
// failure. A missing dir is a no-op.
func UnsealTree(dir string) (int, error) {
	n := 0
	var errs []error
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir || !(d.IsDir() || d.Type().IsRegular()) {
			return nil
		}
		parent, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			return nil
		}
		defer unix.Close(parent)
		ok, err := unsealAt(parent, d.Name())
		if err != nil {
			errs = append(errs, fmt.Errorf("unsealing %s: %w", path, err))
		} else if ok {
			n++
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return n, errors.Join(append(errs, err)...)
}

// errNotSealable is an inode Seal refuses: neither a directory nor a
// regular file with one link.
var errNotSealable = errors.New("neither a directory nor a regular file with one link")

// errMountRoot is an inode that is the root of a mount: the volume itself,
// not the target beneath it.
var errMountRoot = errors.New("the root of a mount")

// openTarget opens name in the directory dirFd, without following a
// symlink, for ioctls and extended attributes: it checks the inode's type
// on an O_PATH descriptor first, and only then opens it for reading
// (through /proc/self/fd, non-blocking and never as a controlling
// terminal), so that nothing but a directory or a regular file with one
// link is ever opened. The root of a mount is errMountRoot.
func openTarget(dirFd int, name string) (int, error) {
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	pathFd, err := unix.Openat2(dirFd, name, how)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pathFd)
	var st unix.Statx_t
	if err := unix.Statx(pathFd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_NLINK, &st); err != nil {
		return -1, fmt.Errorf("statx: %w", err)
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return -1, errMountRoot
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
	case st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1:
	default:
		return -1, errNotSealable
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pathFd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening it: %w", err)
	}
	return fd, nil
}

package devices

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// kernelProbe is a kernel feature and how to find it.
type kernelProbe struct {
	KernelFeature
	// probe reports whether the running kernel has the feature, or the
	// error that kept it from telling: then the kernel's release decides.
	probe func() (bool, error)
}

// kernelProbes are the features converge uses that a kernel may lack.
// Every other call it makes (renameat2 RENAME_NOREPLACE, SEEK_DATA,
// LOOP_CTL_GET_FREE, copy_file_range, eventfd, statx) is older than the
// oldest required here; FICLONE, FIEMAP, FIFREEZE and punched holes are
// the pool's filesystem's, probed for each pool (ProbeCopyMode,
// ProbeFilesystem) or failing the operation that needs them. Each probe
// asks the kernel something that changes nothing.
var kernelProbes = []kernelProbe{
	{KernelFeature{Name: "mount_setattr", Since: KernelVersion{5, 12}, Required: true}, probeMountSetattr},
	{KernelFeature{Name: "LOOP_CONFIGURE", Since: KernelVersion{5, 8}, Required: true}, probeLoopConfigure},
	{KernelFeature{Name: "statx STATX_MNT_ID", Since: KernelVersion{5, 8}, Required: true}, func() (bool, error) { return probeStatxMask(unix.STATX_MNT_ID) }},
	{KernelFeature{Name: "openat2", Since: KernelVersion{5, 6}, Required: true}, probeOpenat2},
	{KernelFeature{Name: "fsopen", Since: KernelVersion{5, 2}, Required: true}, probeFsopen},
	{KernelFeature{Name: "fsconfig", Since: KernelVersion{5, 2}, Required: true}, func() (bool, error) { return hasSyscall(unix.FsconfigCreate(-1)) }},
	{KernelFeature{Name: "fsmount", Since: KernelVersion{5, 2}, Required: true}, probeFsmount},
	{KernelFeature{Name: "move_mount", Since: KernelVersion{5, 2}, Required: true}, probeMoveMount},
	{KernelFeature{Name: "open_tree", Since: KernelVersion{5, 2}, Required: true}, probeOpenTree},

	{KernelFeature{Name: "listmount and statmount", Since: KernelVersion{6, 13},
		Without: "each observation of one volume reads the whole mount table instead of that volume's mounts"},
		func() (bool, error) { return newMountIndex().probe(), nil }},
	{KernelFeature{Name: "statx STATX_MNT_ID_UNIQUE", Since: KernelVersion{6, 8},
		Without: "no mount's unique ID is recorded: a mount of converge's own moved to a path no record names is not unmounted, and no volume gets the SpaceRanOut condition"},
		func() (bool, error) { return probeStatxMask(unix.STATX_MNT_ID_UNIQUE) }},
	{KernelFeature{Name: "sysfs diskseq", Since: KernelVersion{5, 15},
		Without: "the number of a thick volume's loop device is removed during its unstage, not after it, and without telling it from a number made anew meanwhile"},
		probeDiskseq},
}

// CheckKernel probes the running kernel for every feature converge uses.
// It returns a *KernelError naming each required feature missing, and
// logs each optional one missing with what converge does without it. A
// probe that cannot tell (no /dev/loop-control, say) is logged, and the
// kernel's release decides for it.
func CheckKernel(logger klog.Logger) error {
	release := kernelRelease()
	results := make([]probeResult, 0, len(kernelProbes))
	for _, p := range kernelProbes {
		present, err := p.probe()
		if err != nil {
			present = p.Since.heldBy(release)
			logger.Info("Kernel feature could not be probed; the kernel's release decides", "kernel", release, "feature", p.Name, "since", "Linux "+p.Since.String(), "present", present, "err", err)
		}
		results = append(results, probeResult{feature: p.KernelFeature, present: present})
	}
	optional, err := judgeKernel(release, results)
	for _, f := range optional {
		logger.Info("Kernel lacks an optional feature; converge runs without it", "kernel", release, "feature", f.Name, "since", "Linux "+f.Since.String(), "without", f.Without)
	}
	if err == nil {
		logger.V(2).Info("Kernel has every feature converge needs", "kernel", release)
	}
	return err
}

// kernelRelease returns uname -r, "unknown" when uname fails.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// hasSyscall reports whether a system call's answer err shows that the
// kernel has it: any answer but ENOSYS. The probes call with arguments
// the kernel refuses (a descriptor of -1) or that ask for nothing.
func hasSyscall(err error) (bool, error) {
	return !errors.Is(err, unix.ENOSYS), nil
}

func probeMountSetattr() (bool, error) {
	// No attribute to set or clear: the kernel returns at once (or
	// EBADF), whatever the descriptor.
	return hasSyscall(unix.MountSetattr(-1, "", unix.AT_EMPTY_PATH, &unix.MountAttr{}))
}

func probeOpenat2() (bool, error) {
	fd, err := unix.Openat2(-1, "", &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == nil {
		unix.Close(fd)
	}
	return hasSyscall(err)
}

func probeFsopen() (bool, error) {
	// tmpfs is always registered: a name the kernel does not know would
	// make it run modprobe for "fs-<name>". The context is closed before
	// anything is created.
	fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	return hasSyscall(err)
}

func probeFsmount() (bool, error) {
	fd, err := unix.Fsmount(-1, unix.FSMOUNT_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return hasSyscall(err)
}

func probeMoveMount() (bool, error) {
	return hasSyscall(unix.MoveMount(-1, "", -1, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH))
}

func probeOpenTree() (bool, error) {
	fd, err := unix.OpenTree(-1, "", unix.AT_EMPTY_PATH|unix.OPEN_TREE_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	return hasSyscall(err)
}

// probeStatxMask reports whether statx of / answers the field mask.
func probeStatxMask(mask int) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, "/", unix.AT_STATX_SYNC_AS_STAT, mask, &stx)
	switch {
	case errors.Is(err, unix.ENOSYS):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("statx /: %w", err)
	}
	return stx.Mask&uint32(mask) != 0, nil
}

// loopProbeTries bounds the free devices probeLoopConfigure asks for when
// the one offered is removed before it opens it.
const loopProbeTries = 3

// probeLoopConfigure asks the free loop device the kernel offers to
// configure itself from no file (descriptor 2^32-1): a kernel with
// LOOP_CONFIGURE fails it with EBADF, looking the descriptor up before it
// takes any lock or claim, and one without fails it as an unknown ioctl
// (EINVAL). Nothing changes, whoever uses the device meanwhile: it is
// opened read-only, so its close makes udev probe nothing, and held for
// the two calls, during which another process's LOOP_CTL_REMOVE of it
// would fail with EBUSY as it does while udev's blkid reads it.
func probeLoopConfigure() (bool, error) {
	ctl, err := os.OpenFile(loopControl, os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Errorf("opening %s: %w", loopControl, err)
	}
	defer ctl.Close()
	for range loopProbeTries {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return false, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		f, err := os.OpenFile(dev, os.O_RDONLY, 0)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENXIO) {
			continue // removed meanwhile
		}
		if err != nil {
			return false, fmt.Errorf("opening %s: %w", dev, err)
		}
		err = unix.IoctlLoopConfigure(int(f.Fd()), &unix.LoopConfig{Fd: math.MaxUint32})
		f.Close()
		switch {
		case errors.Is(err, unix.EBADF):
			return true, nil
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOTTY):
			return false, nil
		case err == nil:
			return false, fmt.Errorf("LOOP_CONFIGURE %s without a file succeeded", dev)
		default:
			return false, fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		}
	}
	return false, fmt.Errorf("each of the %d free loop devices offered was removed before it could be opened", loopProbeTries)
}

// probeDiskseq reports whether the first block device of /sys/block has
// the sysfs attribute diskseq, which every disk has since it came.
func probeDiskseq() (bool, error) {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return false, err
	}
	if len(entries) == 0 {
		return false, errors.New("no block device in /sys/block")
	}
	_, err = os.Stat(filepath.Join("/sys/block", entries[0].Name(), "diskseq"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

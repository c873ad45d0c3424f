package devices

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"

	"github.com/converge-csi/converge/pkg/host"
)

// fsMounter is a mount.Interface whose filesystem mounts of ext4, xfs and
// btrfs go through the kernel's mount API (fsopen, fsconfig, fsmount,
// move_mount) rather than an exec of mount(8), which costs a mount
// several times what the system calls do (docs/performance.md, "Figures
// behind the code's choices"); everything else is its
// base's. It is what mount-utils' SafeFormatAndMount mounts through once it
// has made its format decision and run fsck, so that those stay
// mount-utils'.
type fsMounter struct {
	mount.Interface
	paths *Paths
	// selinux is true when the kernel enforces or audits SELinux labels.
	// Without it, the SELinux context options are dropped, as mount(8)
	// (libmount) drops them: no filesystem parser takes them.
	selinux bool
}

// NewFsMounter returns base with the mounts of ext4, xfs and btrfs made
// through the kernel's mount API at mount points resolved beneath the roots
// of paths without symlinks. selinux says whether the kernel runs SELinux
// (SELinuxEnabled).
func NewFsMounter(base mount.Interface, paths *Paths, selinux bool) mount.Interface {
	return &fsMounter{Interface: base, paths: paths, selinux: selinux}
}

// SELinuxEnabled reports whether the kernel runs SELinux, as libselinux
// tells it: selinuxfs is mounted at /sys/fs/selinux.
func SELinuxEnabled() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/selinux", &st) == nil && st.Type == unix.SELINUX_MAGIC
}

// syscallMounted are the filesystems mounted through the mount API.
var syscallMounted = []string{host.FsExt4, host.FsXFS, host.FsBtrfs}

// Mount mounts source at target (see MountSensitive).
func (m *fsMounter) Mount(source, target, fstype string, options []string) error {
	return m.MountSensitive(source, target, fstype, options, nil)
}

// MountSensitive mounts the filesystem on the device source at the
// directory target with options, through the mount API for ext4, xfs and
// btrfs, and through its base otherwise.
func (m *fsMounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	// mount-utils mounts here once its fsck, or its mkfs of a blank
	// device, is done: the filesystem is made and not yet mounted.
	// gofail: var devicesBeforeMountFilesystem struct{}
	if !slices.Contains(syscallMounted, fstype) {
		return m.Interface.MountSensitive(source, target, fstype, options, sensitive)
	}
	return m.paths.MountFilesystem(source, target, fstype, slices.Concat(options, sensitive), m.selinux)
}

// MountSensitiveWithoutSystemd is MountSensitive: no mount here runs
// through systemd.
func (m *fsMounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	return m.MountSensitive(source, target, fstype, options, sensitive)
}

// MountSensitiveWithoutSystemdWithMountFlags is MountSensitive; the mount
// flags of mount(8) (--no-canonicalize and the like) mean nothing here.
func (m *fsMounter) MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype string, options, sensitive, _ []string) error {
	return m.MountSensitive(source, target, fstype, options, sensitive)
}

// defaultOptions are options of mount(8) that ask for what a new mount is
// anyway (or only undo another option, which the policy's options never
// need): nothing is passed for them.
var defaultOptions = []string{"defaults", "rw", "suid", "dev", "exec", "atime", "norelatime", "diratime", "async", "nolazytime"}

// selinuxOptions are the SELinux context options.
var selinuxOptions = []string{"context", "fscontext", "defcontext", "rootcontext"}

// MountFilesystem mounts the filesystem of type fstype on the block device
// dev at the directory target, resolved beneath the roots without symlinks,
// with options as mount(8) takes them: a new superblock context (fsopen)
// gets the device and each filesystem option (fsconfig), the filesystem is
// made (FSCONFIG_CMD_CREATE: the kernel reads the superblock) and mounted,
// detached, with its per-mount attributes (fsmount), and the mount is
// attached at target's descriptor (move_mount): no path is resolved twice.
// What the kernel refuses as invalid wraps ErrRefused and carries the
// kernel's own message. The SELinux options are dropped when selinux is
// false, as mount(8) drops them.
func (p *Paths) MountFilesystem(dev, target, fstype string, options []string, selinux bool) error {
	dst, err := p.open(target, unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(dst)
	fsfd, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fsfd)
	fail := func(what string, err error) error {
		if msg := fsLog(fsfd); msg != "" {
			err = fmt.Errorf("%w (%s)", err, msg)
		}
		return refused(fmt.Errorf("mounting %s (%s) at %s: %s: %w", dev, fstype, target, what, err))
	}
	if err := unix.FsconfigSetString(fsfd, "source", dev); err != nil {
		return fail("source", err)
	}
	// The per-mount flags are the attributes a bind would get (the last
	// access-time flag wins); "ro" also makes the superblock read-only.
	attrs := bindAttr(options).Attr_set
	for _, o := range options {
		if !filesystemOption(o, selinux) {
			continue
		}
		if err := fsconfigOption(fsfd, o); err != nil {
			return fail("option "+o, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fail("reading the filesystem", err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, int(attrs))
	if err != nil {
		return fail("making the mount", err)
	}
	// The descriptor holds the detached mount; once attached, closing it
	// leaves the mount in place.
	defer unix.Close(mnt)
	if err := unix.MoveMount(mnt, "", dst, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching the mount of %s at %s: %w", dev, target, err)
	}
	return nil
}

// filesystemOption says whether the mount(8) option o goes to the
// filesystem (fsconfig): not an option that asks for what a new mount is
// anyway, nor a per-mount flag other than "ro" (fsmount's attributes take
// those), nor a SELinux context option where selinux is false.
func filesystemOption(o string, selinux bool) bool {
	key, _, _ := strings.Cut(o, "=")
	switch {
	case slices.Contains(defaultOptions, o):
		return false
	case slices.Contains(selinuxOptions, key) && !selinux:
		return false
	}
	_, perMount := bindAttrs[o]
	return !perMount || o == "ro"
}

// fsconfigOption gives the filesystem context fsfd the mount(8) option o:
// key=value as a string, a bare word as a flag.
func fsconfigOption(fsfd int, o string) error {
	key, value, hasValue := strings.Cut(o, "=")
	if !hasValue {
		return unix.FsconfigSetFlag(fsfd, o)
	}
	// mount(8) takes a value with commas in double quotes; the kernel
	// takes the value itself.
	if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
		value = value[1 : len(value)-1]
	}
	return unix.FsconfigSetString(fsfd, key, value)
}

// fsLog reads what the kernel logged on a filesystem context: the reason
// it gives for a refusal ("e ext4: Unrecognized mount option ...").
func fsLog(fsfd int) string {
	var lines []string
	buf := make([]byte, 1024)
	for range 16 {
		n, err := unix.Read(fsfd, buf)
		if n <= 0 || err != nil {
			break
		}
		lines = append(lines, strings.TrimSpace(string(buf[:n])))
	}
	return strings.Join(lines, "; ")
}

var _ mount.Interface = (*fsMounter)(nil)

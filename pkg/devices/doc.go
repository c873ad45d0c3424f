// Package devices is converge's only contact with the operating system:
// volume image files, loop devices (through golang.org/x/sys/unix ioctls),
// the mount table, filesystems, and path checks that never follow a
// symlink.
//
// Where mount-utils' logic is the point (the format decision from blkid,
// fsck before a read-write mount, resize), it goes through
// k8s.io/mount-utils. Where mount-utils would only exec mount(8) or
// umount(8), it makes the system call through golang.org/x/sys/unix: the
// staging mounts of ext4, xfs and btrfs through the kernel's mount API
// (fsMounter, which mount-utils mounts through once it has decided), bind
// mounts and unmounts through descriptors resolved beneath the plugin's
// roots (Paths).
//
// It knows nothing of CSI or of the desired state; it does what it is told
// and reports what it sees.
package devices

// Package devices is converge's only contact with the operating system:
// volume image files, loop devices (through golang.org/x/sys/unix ioctls),
// the mount table, filesystems (blkid, mkfs, fsck and mount through
// k8s.io/mount-utils), and path checks that never follow a symlink.
//
// It knows nothing of CSI or of the desired state; it does what it is told
// and reports what it sees.
package devices

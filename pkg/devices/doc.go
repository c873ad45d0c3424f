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
// Loop devices are the machine's, and other processes use them too
// (losetup, snap, another node plugin): AttachLoop claims the free device
// the kernel offers and, when another process takes or removes it first,
// asks again after a short, growing, jittered wait, for up to attachBudget.
//
// A thick volume's device refuses discards (queue/discard_max_bytes 0), so
// that nothing hands its space back. The kernel keeps that limit for the
// device number across detaches, and once it is 0 nothing but removing the
// number (LOOP_CTL_REMOVE) resets it: the next user of the number, converge
// or not, would get a device that passes no discards. So the detach of a
// thick device removes the number, when nothing holds the device
// (LoopDevices.Detach): at once, or, in the plugin, from a queue
// (Removals) that keeps the removal off the unstage's answer, starts the
// removals once detaches pause (20 ms without one, 250 ms at most; a thin
// attach starts them at once), and leaves alone a number that is another
// disk by then (its diskseq changed; one attached again with discards off
// is logged). Another process can still be offered the number in that
// window, a crash loses the removals not yet made, and a device someone
// holds open
// detaches at that user's last close, when converge is not there to remove
// it: either is logged, and that number keeps discards off for whoever
// takes it. converge's own thin attaches check every device they claim and
// remove such a number rather than use it.
//
// A volume's IO limits are the kernel's blk-throttle rules for its device
// in the cgroups of the pods that use it (CgroupIO): found below the
// kubelet's kubepods cgroup (below its cgroupRoot, if any) in the shapes
// the kubelet makes pods' cgroups alone, never by a pod's name elsewhere
// in the hierarchy, and written in the form of the cgroup version the io
// controller is on (v1's flat per-cgroup rules, v2's io.max).
//
// It knows nothing of CSI or of the desired state; it does what it is told
// and reports what it sees.
package devices

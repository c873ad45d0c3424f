package host

import "slices"

// The filesystems the plugin makes and mounts on volumes.
const (
	FsExt4  = "ext4"
	FsXFS   = "xfs"
	FsBtrfs = "btrfs"
)

// FsTypes are the filesystems a volume may ask for: a copy, so that no
// importer widens what a capability may name.
func FsTypes() []string { return slices.Clone(fsTypes) }

var fsTypes = []string{FsExt4, FsXFS, FsBtrfs}

// MinImageSize is the smallest image of any volume: room for an ext4
// journal.
const MinImageSize = 16 << 20

// MinSize is the smallest image a volume of filesystem fsType ("" for a
// raw block volume) is made with, in bytes: MinImageSize for ext4 and a
// raw block volume; 300 MiB for xfs, the least mkfs.xfs makes (xfsprogs
// 5.19 and later: "Filesystem must be larger than 300MB"); 256 MiB for
// btrfs, the least size the kernel resizes one to (btrfs_ioctl_resize), so
// that every growth of one can be carried out (mkfs.btrfs makes one from
// about 109 MiB, whose growth to less than 256 MiB would fail on every
// retry).
func MinSize(fsType string) int64 {
	switch fsType {
	case FsXFS:
		return 300 << 20
	case FsBtrfs:
		return 256 << 20
	}
	return MinImageSize
}

// DefaultFsType is the filesystem of a volume whose request names none:
// what the kubelet and most CSI drivers default to.
const DefaultFsType = FsExt4

// Mke2fsPrezeroed is mke2fs's extended option (e2fsprogs 1.47 and later)
// that says the device reads only zeros: mke2fs then neither zeroes the
// journal nor leaves the inode tables for the kernel to zero after the
// mount, and flags them zeroed: fewer writes, a quicker mkfs and a
// smaller thin image (docs/performance.md, "Figures behind the code's
// choices"). Given for a device that does not read
// zeros, it would let a later fsck take stale blocks for inodes: only the
// plugin, which knows whether an image holds data, sets it.
const Mke2fsPrezeroed = "assume_storage_prezeroed"

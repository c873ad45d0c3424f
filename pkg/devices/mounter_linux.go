package devices

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// Filesystem types converge creates and mounts.
const (
	FsExt4 = "ext4"
	FsXFS  = "xfs"
)

// unknownData is what mount-utils' GetDiskFormat reports for a device with
// a partition table.
const unknownData = "unknown data, probably partitions"

// ErrPartitioned is returned by DiskFormat for a device with a partition
// table: it holds data and must never be formatted.
var ErrPartitioned = errors.New("device carries a partition table")

// Mounter formats and mounts filesystems through k8s.io/mount-utils.
type Mounter struct {
	sfm *mount.SafeFormatAndMount
}

// NewMounter returns a Mounter running the system's mount, blkid, fsck and
// mkfs through exec. At most maxFormats mkfs run at once.
func NewMounter(exec utilexec.Interface, maxFormats int) *Mounter {
	return &Mounter{sfm: mount.NewSafeFormatAndMount(mount.NewWithoutSystemd(""), exec,
		mount.WithMaxConcurrentFormat(maxFormats, 10*time.Minute))}
}

// DiskFormat returns the filesystem type on dev, "" when blkid positively
// finds no filesystem and no partition table, and an error otherwise (a
// blkid failure is an error, never "empty": callers fail closed).
func (m *Mounter) DiskFormat(dev string) (string, error) {
	fs, err := m.sfm.GetDiskFormat(dev)
	if err != nil {
		return "", fmt.Errorf("probing %s: %w", dev, err)
	}
	if fs == unknownData {
		return "", fmt.Errorf("%s: %w", dev, ErrPartitioned)
	}
	return fs, nil
}

// FormatAndMount mounts the filesystem on dev at target, first running fsck
// for a read-write mount, and formats dev as fsType only if blkid finds it
// empty. The caller decides whether formatting is allowed before calling.
func (m *Mounter) FormatAndMount(dev, target, fsType string, options []string) error {
	return m.sfm.FormatAndMount(dev, target, fsType, options)
}

// BindMount bind mounts source at target and applies options (e.g. ro) with
// a remount.
func (m *Mounter) BindMount(source, target string, options []string) error {
	return m.sfm.Mount(source, target, "", append([]string{"bind"}, options...))
}

// Unmount unmounts the top mount at target. Unmounting a path that is not
// mounted is a no-op.
func (m *Mounter) Unmount(target string) error {
	return m.sfm.Unmount(target)
}

package devices

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"k8s.io/mount-utils"

	"github.com/converge-csi/converge/pkg/state"
)

// Observer reads the actual state of the machine.
type Observer struct {
	// MountInfo is the mountinfo file, normally /proc/self/mountinfo.
	MountInfo string
	// SysBlock is the sysfs block directory, normally /sys/block.
	SysBlock string
	// Partitions lists the block devices of non-zero size, normally
	// /proc/partitions; empty to visit every loop device in SysBlock.
	Partitions string
	// MountTableMaxAge lets Observe reuse the mount table it parsed last
	// while the kernel reports no mount or unmount since (POLLPRI on an
	// open mountinfo) and that parse is younger than this. The kernel does
	// not report a filesystem's own state changing (a read-only flip after
	// errors, an ext4 shutdown: only the super options show them), so this
	// bounds how late those are seen. Zero parses the table on every call.
	MountTableMaxAge time.Duration
	// Now is the clock of MountTableMaxAge; time.Now when nil.
	Now func() time.Time

	// mu guards watchFd, watching, mounts and parsedAt.
	mu       sync.Mutex
	watchFd  int // an open MountInfo, polled for changes, when watching
	watching bool
	mounts   []state.Mount
	parsedAt time.Time
}

// Observe parses the mount table (or reuses it, see MountTableMaxAge) and
// lists the loop devices.
func (o *Observer) Observe() (*state.Snapshot, error) {
	mounts, err := o.mountTable()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", o.MountInfo, err)
	}
	loops, err := ListLoops(o.SysBlock, o.Partitions)
	if err != nil {
		return nil, fmt.Errorf("listing loop devices: %w", err)
	}
	return state.NewSnapshot(byDevice(mounts, loops), loops), nil
}

// mountTable returns a copy of the mount table, parsed now unless the last
// parse may be reused: the kernel reported no change since and it is
// younger than MountTableMaxAge. The change is checked before the table is
// read, so a change during the read is reported next time: no change is
// ever missed.
func (o *Observer) mountTable() ([]state.Mount, error) {
	if o.MountTableMaxAge <= 0 {
		return ReadMounts(o.MountInfo)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	changed := true
	if !o.watching {
		// Opening marks every change so far as seen by this descriptor;
		// the parse below reads them all.
		if fd, err := unix.Open(o.MountInfo, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			o.watchFd, o.watching = fd, true
		}
	} else {
		fds := []unix.PollFd{{Fd: int32(o.watchFd), Events: unix.POLLPRI}}
		n, err := unix.Poll(fds, 0)
		changed = err != nil || n > 0 && fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0
	}
	at := now()
	if !changed && o.mounts != nil && at.Sub(o.parsedAt) < o.MountTableMaxAge {
		return slices.Clone(o.mounts), nil
	}
	mounts, err := ReadMounts(o.MountInfo)
	if err != nil {
		return nil, err
	}
	o.mounts, o.parsedAt = mounts, at
	return slices.Clone(mounts), nil
}

// Close releases the descriptor Observe polls for changes. Observe may be
// called again afterwards; it opens a new one.
func (o *Observer) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.watching {
		return nil
	}
	o.watching, o.mounts = false, nil
	return unix.Close(o.watchFd)
}

// byDevice gives the mounts of a filesystem that reports an anonymous
// device number (btrfs: 0:N) the number of the loop device it is on, named
// by the mount source, so that every mount is matched to its device alike.
func byDevice(mounts []state.Mount, loops []state.Loop) []state.Mount {
	dev := make(map[string]state.DevNum, len(loops))
	for _, l := range loops {
		dev[l.Device] = l.Dev
	}
	for i, m := range mounts {
		if d, ok := dev[m.Source]; ok && m.Dev.Major == 0 && m.FsType == FsBtrfs {
			mounts[i].Dev = d
		}
	}
	return mounts
}

// CheckMount stats a mount point and returns the error when it shows a
// corrupted mount (ENOTCONN, ESTALE, EIO and the others of mount-utils'
// IsCorruptedMnt); any other outcome is nil, as the mount table is the
// authority on whether something is mounted there.
func (o *Observer) CheckMount(path string) error {
	_, err := os.Stat(path)
	if err != nil && mount.IsCorruptedMnt(err) {
		return err
	}
	return nil
}

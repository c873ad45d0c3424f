// Package host holds what every layer knows of the host alike: the
// observation types the device layer fills and the reconciler compares
// with the records (mounts, loop devices, filesystem usage, and
// Observation, all of them at one instant), the IO limits the device
// layer applies to a volume's device (IOLimits), and the rule every host
// path the plugin acts on must pass (Beneath). It observes nothing itself
// (pkg/devices does) and imports nothing of the plugin. An Observation is
// the machine seen once; a snapshot, everywhere in converge, is a volume
// snapshot.
package host

import "sort"

// DevNum is a device number as major:minor.
type DevNum struct {
	Major, Minor uint32
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	// ID is the mount's ID in mountinfo, which the kernel reuses once the
	// mount is gone (unlike the unique mount ID that records keep).
	ID int
	// Path is the mount point, unescaped.
	Path string
	// Dev is the device number of the mounted filesystem.
	Dev DevNum
	// Root is the path inside the filesystem that is mounted; "/" for a
	// whole filesystem and for a bind mount of a whole filesystem.
	Root string
	// Source is the mount source, e.g. /dev/loop3.
	Source string
	// FsType is the filesystem type.
	FsType string
	// ReadOnly is true when the mount point is read-only.
	ReadOnly bool
	// SuperReadOnly is true when the filesystem itself is read-only, as
	// after the kernel remounted it on errors (errors=remount-ro).
	SuperReadOnly bool
	// Shutdown is true when the filesystem was shut down (every I/O on it
	// fails with EIO), as after FS_IOC_SHUTDOWN or a fatal journal error.
	Shutdown bool
}

// Device is a block device the plugin uses: a loop device attached to a
// volume's image, or a static volume's disk.
type Device struct {
	// Device is the device node, e.g. /dev/loop3.
	Device string
	// Dev is its device number.
	Dev DevNum
	// BackingFile is the file the device is attached to, by the path the
	// kernel gives it as seen from here (see devices' backing_linux.go).
	BackingFile string
	// Seq is the device's disk sequence number (sysfs diskseq), new with
	// every attachment; "" where the kernel has none.
	Seq string
	// AutoClear is true when the device goes away with its last user, as
	// after someone ran losetup -d on it while it was mounted.
	AutoClear bool
	// Size is the device's size in bytes.
	Size int64
	// BackingSize is the size of the backing file in bytes; larger than
	// Size after the file was grown and before the device was told.
	BackingSize int64
	// BackingAllocated is the space allocated to the backing file, in
	// bytes (its st_blocks): less than BackingSize where the file has
	// holes.
	BackingAllocated int64
	// Discards is true when the device passes discards on to its backing
	// file, which punches holes in it (queue/discard_max_bytes > 0).
	Discards bool
}

// Observation is the observed state of the machine at one instant: the mount
// table and the loop devices. It is built once per reconcile pass and then
// answers every per-volume question in O(1).
type Observation struct {
	// mountsAt maps a mount point to its mounts, bottom first.
	mountsAt map[string][]Mount
	// mountsOf maps a device to the mounts of its filesystem.
	mountsOf map[DevNum][]Mount
	// loops maps a backing file to its loop devices: normally one, more
	// when someone attached the file again behind the plugin's back.
	loops map[string][]Device
	// pools maps a storage pool's name to the space of its data
	// directory.
	pools map[string]PoolSpace
}

// PoolSpace is the space of the filesystem of a storage pool, which holds
// its volumes' images, as observed.
type PoolSpace struct {
	// Known is false when it was not observed.
	Known bool
	// Total is the filesystem's size and Free what it can still allocate
	// (statfs f_bavail), in bytes.
	Total, Free int64
}

// WithPool returns s with the space of pool name's data directory.
func (s *Observation) WithPool(name string, p PoolSpace) *Observation {
	if s.pools == nil {
		s.pools = map[string]PoolSpace{}
	}
	s.pools[name] = p
	return s
}

// Pool returns the space of pool name's data directory; not Known when it
// was not observed.
func (s *Observation) Pool(name string) PoolSpace { return s.pools[name] }

// NewObservation indexes mounts and loop devices.
func NewObservation(mounts []Mount, loops []Device) *Observation {
	s := &Observation{
		mountsAt: make(map[string][]Mount, len(mounts)),
		mountsOf: make(map[DevNum][]Mount, len(mounts)),
		loops:    make(map[string][]Device, len(loops)),
	}
	for _, m := range mounts {
		s.mountsAt[m.Path] = append(s.mountsAt[m.Path], m)
		s.mountsOf[m.Dev] = append(s.mountsOf[m.Dev], m)
	}
	for _, l := range loops {
		s.loops[l.BackingFile] = append(s.loops[l.BackingFile], l)
	}
	for f, ls := range s.loops {
		// Prefer a device whose filesystem is mounted, then the lowest.
		sort.Slice(ls, func(i, j int) bool {
			mi, mj := len(s.mountsOf[ls[i].Dev]) > 0, len(s.mountsOf[ls[j].Dev]) > 0
			if mi != mj {
				return mi
			}
			return ls[i].Dev.Minor < ls[j].Dev.Minor
		})
		s.loops[f] = ls
	}
	return s
}

// MountAt returns the top mount at path.
func (s *Observation) MountAt(path string) (Mount, bool) {
	ms := s.mountsAt[path]
	if len(ms) == 0 {
		return Mount{}, false
	}
	return ms[len(ms)-1], true
}

// MountsOf returns every mount of the filesystem on dev.
func (s *Observation) MountsOf(dev DevNum) []Mount { return s.mountsOf[dev] }

// LoopsFor returns the loop devices attached to backingFile, the one in
// use first.
func (s *Observation) LoopsFor(backingFile string) []Device { return s.loops[backingFile] }

// Loops returns every loop device in the observation.
func (s *Observation) Loops() []Device {
	out := make([]Device, 0, len(s.loops))
	for _, ls := range s.loops {
		out = append(out, ls...)
	}
	return out
}

// Usage is the space and inode usage of a mounted filesystem.
type Usage struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
}

package devices

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/locks"
)

// The mounts of a few filesystems, read without the mount table: listmount(2)
// lists the unique IDs of every mount of the namespace (one call, a few
// microseconds for hundreds), statmount(2) tells one mount's fields. The
// mount table is text the kernel writes out a page at a time and converge
// parses, every mount of the machine each time (docs/performance.md,
// Figures behind the code's choices): a teardown of many volumes read it for each volume's early start
// while its unmounts changed it. An early start wants the mounts of its
// volume's filesystem and what is mounted at its volume's paths; a mount's
// device never changes, and a unique ID is never reused, so the device of
// each mount is asked once (mountIndex) and only the volume's are read in
// full.

// statmount(2)'s request flags (linux/mount.h).
const (
	statmountSbBasic   = 0x1
	statmountMntBasic  = 0x2
	statmountMntRoot   = 0x8
	statmountMntPoint  = 0x10
	statmountFsType    = 0x20
	statmountMntOpts   = 0x80
	statmountFsSubtype = 0x100
	statmountSbSource  = 0x200

	// statmountWanted is what a host.Mount is made of. The first five
	// are always there; the options, subtype and source only when not
	// empty.
	statmountWanted = statmountSbBasic | statmountMntBasic | statmountMntRoot | statmountMntPoint |
		statmountFsType | statmountMntOpts | statmountFsSubtype | statmountSbSource
	statmountAlways = statmountSbBasic | statmountMntBasic | statmountMntRoot | statmountMntPoint | statmountFsType

	// lsmtRoot asks listmount(2) for every mount of the namespace.
	lsmtRoot = ^uint64(0)
	// mntIDReqSize is the size of the first struct mnt_id_req.
	mntIDReqSize = 24
	// statmountStrings is the offset of struct statmount's strings.
	statmountStrings = 512
)

// mntIDReq is struct mnt_id_req (linux/mount.h), as first published.
type mntIDReq struct {
	size    uint32
	spare   uint32
	mntID   uint64
	param   uint64
	mntNsID uint64
}

// statmountHead is the start of struct statmount (linux/mount.h): the
// fields read here, in the kernel's own byte order. A string field is the
// offset of a NUL-terminated string from statmountStrings.
type statmountHead struct {
	size           uint32
	mntOpts        uint32
	mask           uint64
	sbDevMajor     uint32
	sbDevMinor     uint32
	sbMagic        uint64
	sbFlags        uint32
	fsType         uint32
	mntID          uint64
	mntParentID    uint64
	mntIDOld       uint32
	mntParentIDOld uint32
	mntAttr        uint64
	mntPropagation uint64
	mntPeerGroup   uint64
	mntMaster      uint64
	propagateFrom  uint64
	mntRoot        uint32
	mntPoint       uint32
	mntNsID        uint64
	fsSubtype      uint32
	sbSource       uint32
}

// listMounts returns the unique IDs of every mount of the namespace, in
// buf when it is large enough.
func listMounts(buf []uint64) ([]uint64, error) {
	for {
		req := mntIDReq{size: mntIDReqSize, mntID: lsmtRoot}
		n, _, errno := unix.Syscall6(unix.SYS_LISTMOUNT, uintptr(unsafe.Pointer(&req)),
			uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(len(buf)), 0, 0, 0)
		if errno != 0 {
			return nil, fmt.Errorf("listmount: %w", errno)
		}
		if int(n) < len(buf) {
			return buf[:n], nil
		}
		buf = make([]uint64, 2*len(buf))
	}
}

// statMount asks the kernel for mount id's fields in mask, into *buf
// (grown when the strings do not fit), and returns its head; ENOENT once
// the mount is gone.
func statMount(id, mask uint64, buf *[]byte) (*statmountHead, error) {
	for {
		req := mntIDReq{size: mntIDReqSize, mntID: id, param: mask}
		_, _, errno := unix.Syscall6(unix.SYS_STATMOUNT, uintptr(unsafe.Pointer(&req)),
			uintptr(unsafe.Pointer(unsafe.SliceData(*buf))), uintptr(len(*buf)), 0, 0, 0)
		if errno == unix.EOVERFLOW && len(*buf) < 1<<20 {
			*buf = make([]byte, 2*len(*buf))
			continue
		}
		if errno != 0 {
			return nil, errno
		}
		return (*statmountHead)(unsafe.Pointer(unsafe.SliceData(*buf))), nil
	}
}

// statString returns the string at off among statmount's strings in buf.
func statString(buf []byte, off uint32) string {
	s := buf[min(len(buf), statmountStrings+int(off)):]
	if i := slices.Index(s, 0); i >= 0 {
		s = s[:i]
	}
	return string(s)
}

// mountOf makes the host.Mount of a statmount answer in buf, as the mount
// table's line of that mount reads (TestStatMountAgreesWithMountTable).
func mountOf(h *statmountHead, buf []byte) host.Mount {
	str := func(flag uint64, off uint32) string {
		if h.mask&flag == 0 {
			return ""
		}
		return statString(buf, off)
	}
	fsType := str(statmountFsType, h.fsType)
	if sub := str(statmountFsSubtype, h.fsSubtype); sub != "" {
		fsType += "." + sub
	}
	opts := str(statmountMntOpts, h.mntOpts)
	return host.Mount{
		ID:            int(h.mntIDOld),
		Path:          str(statmountMntPoint, h.mntPoint),
		Dev:           host.DevNum{Major: h.sbDevMajor, Minor: h.sbDevMinor},
		Root:          str(statmountMntRoot, h.mntRoot),
		Source:        str(statmountSbSource, h.sbSource),
		FsType:        fsType,
		ReadOnly:      h.mntAttr&unix.MOUNT_ATTR_RDONLY != 0,
		SuperReadOnly: h.sbFlags&unix.MS_RDONLY != 0 || hasOption(opts, "emergency_ro"),
		Shutdown:      hasOption(opts, "shutdown"),
	}
}

// errUseMountTable: the mounts asked for cannot be told without the mount
// table, and the caller reads it whole: the kernel lacks listmount,
// statmount or a field converge reads (before Linux 6.13), or the lookup
// of a path named fails otherwise than on nothing there (Observer.pathTops).
var errUseMountTable = errors.New("the mounts cannot be told without the mount table")

// mountIndex reads the mounts of a few filesystems, and of a few paths,
// without the mount table. It keeps the device of every mount it has seen,
// by unique ID: a mount's device never changes and its unique ID is never
// reused, so a mount is asked for its device once.
type mountIndex struct {
	// usable tells, once, whether the kernel can (errUseMountTable).
	usableOnce sync.Once
	usable     bool

	// mu guards the fields below.
	mu locks.Mutex
	// known holds the mounts of the latest listing, by unique ID in
	// ascending order, and spare the previous one's slice, reused.
	known, spare []mountDev
	ids          []uint64
	buf          []byte
}

// mountDev is what mountIndex keeps of a mount (by its unique ID): its
// filesystem's device, and for btrfs, whose mounts report an anonymous
// device number and are told by their source instead (byDevice), that
// source.
type mountDev struct {
	id  uint64
	dev host.DevNum
	// btrfsSource is a btrfs mount's source, as it was first seen: it
	// changes only when its filesystem's first device is replaced, which
	// converge's volumes, one loop device each, never are.
	btrfsSource string
}

// btrfsMagic is BTRFS_SUPER_MAGIC.
const btrfsMagic = 0x9123683e

func newMountIndex() *mountIndex {
	return &mountIndex{ids: make([]uint64, 512), buf: make([]byte, 4096)}
}

// ready reports whether the kernel lists and tells mounts with every
// field converge reads: Linux 6.13 and later, and one mount told.
func (x *mountIndex) ready() bool {
	x.usableOnce.Do(func() {
		x.usable = x.probe()
		klog.Background().V(2).Info("Observations of one volume read its mounts", "with", map[bool]string{true: "statmount", false: "the whole mount table"}[x.usable])
	})
	return x.usable
}

// pathTop is the top mount at a path, as a lookup of the path reaches it:
// by its unique ID, 0 for none.
type pathTop struct {
	path string
	id   uint64
}

// probe reports whether the kernel lists and tells mounts with every
// field converge reads.
func (x *mountIndex) probe() bool {
	if !kernelAtLeast(6, 13) {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	ids, err := listMounts(x.ids)
	if err != nil || len(ids) == 0 {
		return false
	}
	h, err := statMount(ids[0], statmountWanted, &x.buf)
	return err == nil && h.mask&statmountAlways == statmountAlways
}

// mounts returns the mounts whose filesystem is on one of devs (a btrfs
// one by its source, one of sources) and the top mount at each path of
// tops, in the mount table's order (by unique ID, the order in which they
// were mounted, where the last mount at a path is the top one), except
// that a path's top mount comes after the others at that path: the mount
// table puts a tree cloned earlier (open_tree) and moved onto the path
// since under a mount it covers, a lookup of the path does not. A mount of
// another filesystem that the path does not reach (beneath a mount on one
// of its parents) is not found, and the mount table, which a pass reads,
// still lists it.
func (x *mountIndex) mounts(devs []host.DevNum, sources []string, tops []pathTop) ([]host.Mount, error) {
	if !x.ready() {
		return nil, errUseMountTable
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	ids, err := listMounts(x.ids)
	if err != nil {
		return nil, err
	}
	x.ids = ids[:cap(ids)]
	slices.Sort(ids) // listed by unique ID already: the order of mounting
	// Both lists ascend: one walk along them finds each mount known.
	known, j := x.spare[:0], 0
	var out []host.Mount
	var uids []uint64 // the unique ID of each of out
	for _, id := range ids {
		for j < len(x.known) && x.known[j].id < id {
			j++ // gone since the latest listing
		}
		var prev *mountDev
		if j < len(x.known) && x.known[j].id == id {
			prev = &x.known[j]
		}
		d, ok, err := x.devOf(id, prev)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // gone since the listing
		}
		known = append(known, d)
		if !slices.Contains(devs, d.dev) && (d.btrfsSource == "" || !slices.Contains(sources, d.btrfsSource)) {
			continue
		}
		m, ok, err := x.read(id)
		if err != nil {
			return nil, err
		}
		if ok {
			out, uids = append(out, m), append(uids, id)
		}
	}
	x.known, x.spare = known, x.known
	return x.placeTops(out, uids, tops)
}

// devOf returns the device of mount id: prev, known from the latest
// listing, or else what statmount says of it; false when it is gone.
func (x *mountIndex) devOf(id uint64, prev *mountDev) (mountDev, bool, error) {
	if prev != nil {
		return *prev, true, nil
	}
	h, err := statMount(id, statmountSbBasic|statmountSbSource, &x.buf)
	if errors.Is(err, unix.ENOENT) {
		return mountDev{}, false, nil
	}
	if err != nil {
		return mountDev{}, false, fmt.Errorf("statmount %d: %w", id, err)
	}
	d := mountDev{id: id, dev: host.DevNum{Major: h.sbDevMajor, Minor: h.sbDevMinor}}
	if h.sbMagic == btrfsMagic && h.mask&statmountSbSource != 0 {
		d.btrfsSource = statString(x.buf, h.sbSource)
	}
	return d, true, nil
}

// placeTops adds to out (in the order of uids, their unique IDs) the top
// mount of each of tops that it lacks, and puts each top mount after
// every other at its path, as the mount table lists them.
func (x *mountIndex) placeTops(out []host.Mount, uids []uint64, tops []pathTop) ([]host.Mount, error) {
	for _, top := range tops {
		if top.id == 0 {
			continue
		}
		i, found := slices.BinarySearch(uids, top.id)
		if !found {
			m, ok, err := x.read(top.id)
			if err != nil {
				return nil, err
			}
			if !ok || m.Path != top.path {
				continue // no mount at the path: it is within another
			}
			out, uids = slices.Insert(out, i, m), slices.Insert(uids, i, top.id)
		}
		last := i
		for k := i + 1; k < len(out); k++ {
			if out[k].Path == top.path {
				last = k
			}
		}
		if last != i {
			m := out[i]
			out, uids = slices.Delete(out, i, i+1), slices.Delete(uids, i, i+1)
			out, uids = slices.Insert(out, last, m), slices.Insert(uids, last, top.id)
		}
	}
	return out, nil
}

// read returns mount id's fields; false when it is gone or out of the
// process's root (the mount table leaves it out).
func (x *mountIndex) read(id uint64) (host.Mount, bool, error) {
	h, err := statMount(id, statmountWanted, &x.buf)
	if errors.Is(err, unix.ENOENT) {
		return host.Mount{}, false, nil
	}
	if errors.Is(err, unix.EOVERFLOW) {
		return host.Mount{}, false, fmt.Errorf("%w: statmount %d: its strings pass 1 MiB", errUseMountTable, id)
	}
	if err != nil {
		return host.Mount{}, false, fmt.Errorf("statmount %d: %w", id, err)
	}
	if h.mask&statmountAlways != statmountAlways {
		return host.Mount{}, false, nil
	}
	return mountOf(h, x.buf), true, nil
}

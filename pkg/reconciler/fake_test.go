package reconciler

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// fakeWorld is an in-memory device layer: loop devices, filesystems on
// them, a mount table and directories. It implements every interface the
// reconciler consumes. Superblock state (shut down, read-only after errors)
// is shared by every mount of a device, as in the kernel.
type fakeWorld struct {
	// mu guards every field below.
	mu      sync.Mutex
	dataDir string
	// images holds the image files, by path.
	images map[string]bool
	loops  map[string]host.Device // by backing file
	// partial counts the observations of one volume (ObserveVolume).
	partial int
	fs      map[string]string // image -> filesystem type, as on disk
	mkfs    map[string]int    // image -> times formatted
	mounts  []host.Mount
	// unique maps a mount's mountinfo ID to its unique ID (see mount).
	unique  map[int]uint64
	lastUID uint64
	// freeIDs holds the mountinfo IDs given back below lastID, the
	// highest ever given: the lowest free ID is its least or lastID+1.
	freeIDs idHeap
	lastID  int
	// at maps a path to the unique IDs of the mounts there, bottom first,
	// so that a stat of a mount point need not walk the table.
	at map[string][]uint64
	// foreign holds the unique IDs of mounts someone else made (the
	// kubelet's subPath bind mounts), which the plugin must never unmount.
	foreign map[uint64]bool
	dirs    map[string]bool
	calls   []string
	// fail maps a call ("attach", "mount <target>", "bind <target>", ...)
	// to the error it returns.
	fail map[string]error
	// hold, when set for a call, blocks that call until the channel closes.
	hold map[string]chan struct{}
	// started, when not nil, receives the name of each call as it begins.
	started chan string
	// corrupt maps a mount point to the error a stat of it returns, until
	// it is unmounted.
	corrupt map[string]error
	// checks counts the CheckMounts of each path.
	checks map[string]int
	// deadSuper marks images whose superblock stays shut down across
	// remounts, as when a container still holds the filesystem.
	deadSuper map[string]bool
	// sizes holds image sizes that differ from the default 64 MiB.
	sizes map[string]int64
	// holes holds the unallocated bytes of images made sparse; every other
	// image is fully allocated.
	holes map[string]int64
	// free is the data directory's free space; pool reports it when set.
	free int64
	pool bool
	// guard is every pool's guard.
	guard capacity.Guard
	// frozen holds the images whose filesystem is frozen.
	frozen map[string]bool
	// copies makes every pool copy data, as a filesystem without
	// reflinks does (CopyMode).
	copies bool
	// snapshots maps a snapshot's ID to what it was taken of.
	snapshots map[string]fakeSnapshot
	// afterObserve, when set, runs once Observe or ObserveVolume (an early
	// start's) has made its observation.
	afterObserve func()
	// before, when set, runs as each call begins (without mu held), with
	// the backing file of the volume the call is about ("" when unknown);
	// its error fails the call before it has any effect.
	before func(name, image string) error
	// after, when set, runs once each call that passed before is done
	// (without mu held), with the call's error; what it returns is the
	// call's error, so that it can fail a call that had its effect, as
	// when the plugin dies between a mount and recording it.
	after func(name, image string, err error) error
}

func newFakeWorld() *fakeWorld {
	return &fakeWorld{
		dataDir:   "/data",
		images:    map[string]bool{},
		loops:     map[string]host.Device{},
		fs:        map[string]string{},
		mkfs:      map[string]int{},
		dirs:      map[string]bool{},
		unique:    map[int]uint64{},
		at:        map[string][]uint64{},
		foreign:   map[uint64]bool{},
		fail:      map[string]error{},
		hold:      map[string]chan struct{}{},
		started:   make(chan string, 100),
		corrupt:   map[string]error{},
		checks:    map[string]int{},
		deadSuper: map[string]bool{},
		sizes:     map[string]int64{},
		holes:     map[string]int64{},
		frozen:    map[string]bool{},
		snapshots: map[string]fakeSnapshot{},
	}
}

// fakeSnapshot is what a snapshot of the fake world was taken of.
type fakeSnapshot struct {
	// image is the image it copied.
	image string
	// frozen says whether the image's filesystem was frozen meanwhile.
	frozen bool
	// of is what it records of its volume.
	of devices.SnapshotOf
}

// Freeze freezes the filesystem mounted at path.
func (w *fakeWorld) Freeze(path string) error {
	return w.do("freeze "+path, func() string { return w.imageAt(path) }, func() error {
		image := w.imageAt(path)
		switch {
		case image == "":
			return fmt.Errorf("%s: not a mount of a loop device", path)
		case w.frozen[image]:
			return devices.ErrFrozen
		}
		w.frozen[image] = true
		return nil
	})
}

// Thaw thaws the filesystem mounted at path; not frozen, it is a no-op.
func (w *fakeWorld) Thaw(path string) error {
	return w.do("thaw "+path, func() string { return w.imageAt(path) }, func() error {
		delete(w.frozen, w.imageAt(path))
		w.autoclearLocked()
		return nil
	})
}

// Sync writes out the filesystem mounted at path (nothing to do here).
func (w *fakeWorld) Sync(path string) error {
	return w.do("sync "+path, func() string { return w.imageAt(path) }, func() error { return nil })
}

// Flush writes out an image (nothing to do here).
func (w *fakeWorld) Flush(image string) error {
	return w.do("flush "+filepath.Base(image), func() string { return image }, func() error { return nil })
}

// taken reports whether snapshot id exists in the pool of data directory
// dir: a snapshot lives beside the image it was taken of.
func (w *fakeWorld) taken(dir, id string) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.snapshots[id]
	return ok && filepath.Dir(s.image) == dir, nil
}

// take copies image, which must be the image of of.Source in the data
// directory dir, to snapshot id.
func (w *fakeWorld) take(dir, id, image string, of devices.SnapshotOf) (devices.SnapshotInfo, error) {
	return devices.SnapshotInfo{ID: id, SnapshotOf: of}, w.do("snapshot "+id, func() string { return image }, func() error {
		switch {
		case !w.images[image] || image != filepath.Join(dir, of.Source+".img"):
			return fmt.Errorf("%s: %w", image, os.ErrNotExist)
		case w.snapshots[id] != fakeSnapshot{}:
			return fmt.Errorf("snapshot %s: %w", id, os.ErrExist)
		}
		w.snapshots[id] = fakeSnapshot{image: image, frozen: w.frozen[image], of: of}
		return nil
	})
}

// do runs one call about the volume whose image imageOf returns (with mu
// held): it records the call, honours fail, hold and before, applies effect
// under mu, then runs after.
func (w *fakeWorld) do(name string, imageOf func() string, effect func() error) error {
	w.mu.Lock()
	w.calls = append(w.calls, name)
	h, err, before, after, started := w.hold[name], w.fail[name], w.before, w.after, w.started
	image := imageOf()
	w.mu.Unlock()
	if started != nil {
		started <- name
	}
	if h != nil {
		<-h
	}
	if err != nil {
		return err
	}
	if before != nil {
		if err := before(name, image); err != nil {
			return err
		}
	}
	w.mu.Lock()
	err = effect()
	w.mu.Unlock()
	if after != nil {
		return after(name, image, err)
	}
	return err
}

// imageAt returns the backing file of the device mounted at path; w.mu
// must be held.
func (w *fakeWorld) imageAt(path string) string {
	for i := len(w.mounts) - 1; i >= 0; i-- {
		if m := w.mounts[i]; m.Path == path {
			for image, l := range w.loops {
				if l.Dev == m.Dev {
					return image
				}
			}
		}
	}
	return ""
}

func (w *fakeWorld) Calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.calls...)
}

func (w *fakeWorld) Observe() (*host.Observation, error) {
	w.mu.Lock()
	loops := make([]host.Device, 0, len(w.loops))
	for _, l := range w.loops {
		loops = append(loops, l)
	}
	obs := host.NewObservation(append([]host.Mount(nil), w.mounts...), loops)
	if w.pool {
		obs.WithPool(state.DefaultPool, host.PoolSpace{Known: true, Total: 1 << 30, Free: w.free})
	}
	after := w.afterObserve
	w.mu.Unlock()
	if after != nil {
		after()
	}
	return obs, nil
}

// ObserveVolume is Observe with only the loop devices named, and of the
// mounts those of their filesystems and of devs, and the top one at each
// of paths.
func (w *fakeWorld) ObserveVolume(names []string, devs []host.DevNum, paths []string) (*host.Observation, error) {
	w.mu.Lock()
	w.partial++
	var loops []host.Device
	for _, l := range w.loops {
		if slices.Contains(names, l.Device) {
			loops = append(loops, l)
			devs = append(devs, l.Dev)
		}
	}
	// The mounts of the devices, and the top one at each path.
	var mounts []host.Mount
	for i, m := range w.mounts {
		top := !slices.ContainsFunc(w.mounts[i+1:], func(n host.Mount) bool { return n.Path == m.Path })
		if slices.Contains(devs, m.Dev) || top && slices.Contains(paths, m.Path) {
			mounts = append(mounts, m)
		}
	}
	obs := host.NewObservation(mounts, loops)
	if w.pool {
		obs.WithPool(state.DefaultPool, host.PoolSpace{Known: true, Total: 1 << 30, Free: w.free})
	}
	after := w.afterObserve
	w.mu.Unlock()
	if after != nil {
		after()
	}
	return obs, nil
}

func (w *fakeWorld) CheckMount(path string) (uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checks[path]++
	var id uint64
	if ids := w.at[path]; len(ids) > 0 {
		id = ids[len(ids)-1]
	}
	if err := w.corrupt[path]; err != nil {
		return 0, err
	}
	return id, nil
}

// mountLocked adds m to the mount table, as the kernel does: with the
// lowest free mountinfo ID (so IDs are reused at once, as in Linux) and a
// unique ID never used before; w.mu must be held.
func (w *fakeWorld) mountLocked(m host.Mount) {
	m.ID = 0
	for m.ID == 0 && len(w.freeIDs) > 0 {
		if id := heap.Pop(&w.freeIDs).(int); w.unique[id] == 0 {
			m.ID = id
		}
	}
	for m.ID == 0 {
		w.lastID++
		if w.unique[w.lastID] == 0 {
			m.ID = w.lastID
		}
	}
	w.lastUID++
	w.unique[m.ID] = w.lastUID
	w.at[m.Path] = append(w.at[m.Path], w.lastUID)
	w.mounts = append(w.mounts, m)
}

// unmountAllLocked removes every mount, as someone unmounting them all
// from outside; w.mu must be held.
func (w *fakeWorld) unmountAllLocked() {
	for len(w.mounts) > 0 {
		w.unmountLocked(len(w.mounts) - 1)
	}
}

// moveLocked moves the i-th mount to path, as a rename of a directory
// above it does; w.mu must be held.
func (w *fakeWorld) moveLocked(i int, path string) {
	uid := w.unique[w.mounts[i].ID]
	w.forgetAtLocked(w.mounts[i].Path, uid)
	w.mounts[i].Path = path
	w.at[path] = append(w.at[path], uid)
}

// forgetAtLocked drops the mount uid from the index of path.
func (w *fakeWorld) forgetAtLocked(path string, uid uint64) {
	ids := slices.DeleteFunc(w.at[path], func(id uint64) bool { return id == uid })
	if len(ids) == 0 {
		delete(w.at, path)
	} else {
		w.at[path] = ids
	}
}

// idHeap is a min-heap of mountinfo IDs.
type idHeap []int

func (h idHeap) Len() int           { return len(h) }
func (h idHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h idHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *idHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *idHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// removeSubPathsLocked unmounts the foreign mounts under pod's
// volume-subpaths directory, as the kubelet does before it unpublishes;
// w.mu must be held.
func (w *fakeWorld) removeSubPathsLocked(pod string) {
	for i := len(w.mounts) - 1; i >= 0; i-- {
		if strings.HasPrefix(w.mounts[i].Path, pod+"/volume-subpaths/") {
			w.unmountLocked(i)
		}
	}
}

// unmountLocked removes the i-th mount, and with it an auto-clearing
// device it was the last user of; w.mu must be held.
func (w *fakeWorld) unmountLocked(i int) {
	w.forgetAtLocked(w.mounts[i].Path, w.unique[w.mounts[i].ID])
	delete(w.unique, w.mounts[i].ID)
	heap.Push(&w.freeIDs, w.mounts[i].ID)
	w.mounts = append(w.mounts[:i], w.mounts[i+1:]...)
	w.autoclearLocked()
}

func (w *fakeWorld) UnmountOwned(target string, id uint64) error {
	return w.do("unmount "+target, func() string { return w.imageAt(target) }, func() error {
		for i := len(w.mounts) - 1; i >= 0; i-- {
			if w.mounts[i].Path == target {
				if w.unique[w.mounts[i].ID] != id {
					return fmt.Errorf("%s holds another mount: %w", target, devices.ErrNotOwned)
				}
				w.unmountLocked(i)
				delete(w.corrupt, target)
				w.autoclearLocked()
				return nil
			}
		}
		return nil
	})
}

func (w *fakeWorld) Path(id string) string { return filepath.Join(w.dataDir, id+".img") }

func (w *fakeWorld) IDOf(path string) (string, bool) {
	if filepath.Dir(path) != w.dataDir {
		return "", false
	}
	return strings.CutSuffix(filepath.Base(path), ".img")
}

// Blank reports an image with no filesystem nor partition table on it as
// holding no data: the fake world knows no other data.
func (w *fakeWorld) blank(image string) (bool, error) {
	var blank bool
	err := w.do("blank", func() string { return image }, func() error {
		if !w.images[image] {
			return fmt.Errorf("%s: %w", image, os.ErrNotExist)
		}
		blank = w.fs[image] == ""
		return nil
	})
	return blank, err
}

// Size returns the size of volume id's image in the default pool.
func (w *fakeWorld) Size(id string) (int64, error) { return w.size(w.Path(id)) }

// size returns the size of an image file.
func (w *fakeWorld) size(image string) (int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.images[image] {
		return 0, os.ErrNotExist
	}
	return w.sizeLocked(image), nil
}

// sizeLocked returns the size of an image file; w.mu must be held.
func (w *fakeWorld) sizeLocked(image string) int64 {
	if n, ok := w.sizes[image]; ok {
		return n
	}
	return 64 << 20
}

// growImage grows volume id's image file, as a pool's GrowImage does for
// the reconciler; devices attached to it see the new size only after Grow.
func (w *fakeWorld) growImageOf(id, image string, size int64) (int64, error) {
	err := w.do("grow image "+id, func() string { return image }, func() error {
		if !w.images[image] {
			return state.NotFound(id)
		}
		if size > w.sizeLocked(image) {
			w.growImageLocked(image, size)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	s, _ := w.size(image)
	return s, nil
}

// growImage grows an image file from outside, as an operator's truncate
// does; devices attached to it see the new size only after Grow.
func (w *fakeWorld) growImage(image string, size int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.growImageLocked(image, size)
}

// growImageLocked grows an image file; w.mu must be held.
func (w *fakeWorld) growImageLocked(image string, size int64) {
	w.sizes[image] = size
	if l, ok := w.loops[image]; ok {
		l.BackingSize, l.BackingAllocated = size, w.allocatedLocked(image)
		w.loops[image] = l
	}
}

// allocatedLocked returns the space allocated to an image: all of it but
// for the holes a test made; w.mu must be held.
func (w *fakeWorld) allocatedLocked(image string) int64 {
	return w.sizeLocked(image) - w.holes[image]
}

func (w *fakeWorld) SetDiscards(dev string, on bool) error {
	name := "discards off"
	if on {
		name = "discards on"
	}
	return w.do(name, func() string { return w.imageOf(dev) }, func() error {
		for k, l := range w.loops {
			if l.Device == dev {
				l.Discards = on
				w.loops[k] = l
			}
		}
		return nil
	})
}

// reserve allocates the holes of an image.
func (w *fakeWorld) reserve(image string) error {
	return w.do("reserve", func() string { return image }, func() error {
		if !w.images[image] {
			return os.ErrNotExist
		}
		if w.holes[image] > w.free {
			return fmt.Errorf("reserving: %w", syscall.ENOSPC)
		}
		w.free -= w.holes[image]
		delete(w.holes, image)
		if l, ok := w.loops[image]; ok {
			l.BackingAllocated = w.allocatedLocked(image)
			w.loops[image] = l
		}
		return nil
	})
}

func (w *fakeWorld) Grow(dev string) error {
	return w.do("grow "+dev, func() string { return w.imageOf(dev) }, func() error {
		for k, l := range w.loops {
			if l.Device == dev {
				l.Size = l.BackingSize
				w.loops[k] = l
			}
		}
		return nil
	})
}

func (w *fakeWorld) BindDevice(dev, target string, ro bool) (uint64, error) {
	var id uint64
	err := w.do("binddev "+target, func() string { return w.imageOf(dev) }, func() error {
		if !w.dirs[filepath.Dir(target)] {
			return fmt.Errorf("%s: %w", filepath.Dir(target), os.ErrNotExist)
		}
		w.dirs[target] = true // the file
		w.mountLocked(host.Mount{Path: target, Dev: host.DevNum{Major: 0, Minor: 5}, Root: "/" + filepath.Base(dev), Source: "udev", FsType: "devtmpfs", ReadOnly: ro})
		id = w.lastUID
		return nil
	})
	return id, err
}

func (w *fakeWorld) GrowUnmounted(_ context.Context, dev, fsType string) error {
	return w.do("grow unmounted "+fsType, func() string { return w.imageOf(dev) }, func() error { return nil })
}

func (w *fakeWorld) Resize(_ context.Context, dev, mountPath string) error {
	return w.do("resize "+mountPath, func() string { return w.imageOf(dev) }, func() error { return nil })
}

// minorOf numbers the loop device of an image from its name, so that
// device names do not depend on the order concurrent attaches run in.
func minorOf(image string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(image))
	return h.Sum32()
}

func (w *fakeWorld) Attach(image string, discards bool) (string, error) {
	var dev string
	err := w.do("attach", func() string { return image }, func() error {
		n := minorOf(image)
		size := w.sizeLocked(image)
		l := host.Device{Device: fmt.Sprintf("/dev/loop%d", n), Dev: host.DevNum{Major: 7, Minor: n}, BackingFile: image, Size: size, BackingSize: size,
			BackingAllocated: w.allocatedLocked(image), Discards: discards}
		w.loops[image] = l
		dev = l.Device
		return nil
	})
	return dev, err
}

func (w *fakeWorld) Detach(dev string) (bool, error) {
	gone := true
	err := w.do("detach", func() string { return w.imageOf(dev) }, func() error {
		for k, l := range w.loops {
			if l.Device != dev {
				continue
			}
			if len(w.mountsOfLocked(l.Dev)) > 0 {
				// The kernel only marks a busy device; it goes away with
				// its last mount.
				l.AutoClear = true
				w.loops[k] = l
				gone = false
				continue
			}
			delete(w.loops, k)
		}
		return nil
	})
	return gone && err == nil, err
}

func (w *fakeWorld) Keep(dev string) error {
	return w.do("keep "+dev, func() string { return w.imageOf(dev) }, func() error {
		for k, l := range w.loops {
			if l.Device == dev {
				l.AutoClear = false
				w.loops[k] = l
			}
		}
		return nil
	})
}

// partitionTable in fakeWorld.fs stands for a device that carries a
// partition table rather than a filesystem.
const partitionTable = "<partition table>"

// unfinishedXfs in fakeWorld.fs stands for the start of an xfs whose mkfs
// never finished: blkid names it xfs, and no kernel mounts it.
const unfinishedXfs = "<unfinished xfs>"

func (w *fakeWorld) DiskFormat(_ context.Context, dev string) (devices.Probe, error) {
	var fs string
	err := w.do("blkid", func() string { return w.imageOf(dev) }, func() error {
		fs = w.fs[w.imageOf(dev)]
		if fs == partitionTable {
			fs = ""
			return fmt.Errorf("%s: %w", dev, devices.ErrPartitioned)
		}
		return nil
	})
	if fs == unfinishedXfs {
		return devices.Probe{Device: dev, Type: "xfs", Unfinished: true}, err
	}
	return devices.Probe{Device: dev, Type: fs}, err
}

// imageOf returns the backing file of a device; w.mu must be held.
func (w *fakeWorld) imageOf(dev string) string {
	for image, l := range w.loops {
		if l.Device == dev {
			return image
		}
	}
	return ""
}

// mountsOfLocked returns the mounts of a device; w.mu must be held.
func (w *fakeWorld) mountsOfLocked(num host.DevNum) []host.Mount {
	var out []host.Mount
	for _, m := range w.mounts {
		if m.Dev == num {
			out = append(out, m)
		}
	}
	return out
}

func (w *fakeWorld) FormatAndMount(_ context.Context, probe devices.Probe, target, fsType string, options, mkfsOptions []string) (uint64, error) {
	dev := probe.Device
	var id uint64
	err := w.do("mount "+target, func() string { return w.imageOf(dev) }, func() error {
		image := w.imageOf(dev)
		if image == "" {
			return fmt.Errorf("no device %s", dev)
		}
		num := w.loops[image].Dev
		if w.fs[image] == partitionTable {
			// As mount-utils: something is there, so no mkfs; the mount
			// of the type asked for fails.
			return fmt.Errorf("mount %s: wrong fs type", dev)
		}
		if w.fs[image] == unfinishedXfs && probe.Type != "" {
			// As the kernel: an xfs whose mkfs never finished.
			return fmt.Errorf("mount %s: Offline file system operation in progress", dev)
		}
		if w.fs[image] == "" || w.fs[image] == unfinishedXfs {
			// mount-utils formats what its blkid (the probe) finds
			// empty, forcing mkfs.xfs over an unfinished one.
			w.calls = append(w.calls, "mkfs "+dev)
			w.fs[image] = fsType
			w.mkfs[image]++
		}
		m := host.Mount{Path: target, Dev: num, Root: "/", Source: dev, FsType: w.fs[image], Shutdown: w.deadSuper[image]}
		if others := w.mountsOfLocked(num); len(others) > 0 {
			// Mounting a mounted device again gets the same superblock.
			m.Shutdown, m.SuperReadOnly = m.Shutdown || others[0].Shutdown, others[0].SuperReadOnly
		}
		w.mountLocked(m)
		id = w.lastUID
		return nil
	})
	return id, err
}

func (w *fakeWorld) BindMount(source, target string, options []string) (uint64, error) {
	var id uint64
	err := w.do("bind "+target, func() string { return w.imageAt(source) }, func() error {
		for i := len(w.mounts) - 1; i >= 0; i-- {
			if m := w.mounts[i]; m.Path == source {
				m.Path = target
				w.mountLocked(m)
				id = w.lastUID
				return nil
			}
		}
		return fmt.Errorf("%s is not mounted", source)
	})
	return id, err
}

func (w *fakeWorld) Unmount(target string) error {
	return w.do("unmount "+target, func() string { return w.imageAt(target) }, func() error {
		for i := len(w.mounts) - 1; i >= 0; i-- {
			if w.mounts[i].Path == target {
				w.unmountLocked(i)
				delete(w.corrupt, target)
				w.autoclearLocked()
				return nil
			}
		}
		return nil
	})
}

// autoclearLocked detaches auto-clearing devices that lost their last
// mount; w.mu must be held.
func (w *fakeWorld) autoclearLocked() {
	for k, l := range w.loops {
		// A frozen filesystem lives on unmounted, holding its device.
		if l.AutoClear && len(w.mountsOfLocked(l.Dev)) == 0 && !w.frozen[k] {
			delete(w.loops, k)
		}
	}
}

// damage sets superblock flags on every mount of image's filesystem, as
// the kernel does after an error (read-only) or a shutdown.
func (w *fakeWorld) damage(image string, shutdown, readOnly bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.loops[image]
	for i := range w.mounts {
		if w.mounts[i].Dev == l.Dev {
			w.mounts[i].Shutdown = w.mounts[i].Shutdown || shutdown
			w.mounts[i].SuperReadOnly = w.mounts[i].SuperReadOnly || readOnly
		}
	}
}

func (w *fakeWorld) CheckDir(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirs[path] {
		return fmt.Errorf("%s: %w", path, os.ErrNotExist)
	}
	return nil
}

func (w *fakeWorld) Mkdir(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirs[filepath.Dir(path)] {
		return os.ErrNotExist
	}
	w.dirs[path] = true
	return nil
}

// Seal records that the target at path was sealed; nothing else in the
// fake world tells a sealed target from another.
func (w *fakeWorld) Seal(path string) error {
	return w.do("seal "+path, func() string { return "" }, func() error { return nil })
}

func (w *fakeWorld) Remove(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.mounts {
		if m.Path == path {
			return errors.New("EBUSY")
		}
	}
	delete(w.dirs, path)
	return nil
}

var (
	_ Observer    = (*fakeWorld)(nil)
	_ Loops       = (*fakeWorld)(nil)
	_ Filesystems = (*fakeWorld)(nil)
	_ Paths       = (*fakeWorld)(nil)
	_ Pool        = fakePool{}
	_ Loops       = devices.LoopDevices{}
	_ Filesystems = (*devices.Mounter)(nil)
	_ Paths       = (*devices.Paths)(nil)
	_ Observer    = (*devices.Observer)(nil)
)

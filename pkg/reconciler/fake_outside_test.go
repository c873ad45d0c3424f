package reconciler

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// What someone other than the plugin does to the fake world (a fault, the
// kubelet's directories, an administrator's mount), and what tests read of
// it: each a method that takes the world's lock, so that no test writes
// its maps. Only the simulator's invariant checks (sim_test.go) read the
// maps themselves, under the lock, for one consistent view of the world.

// failOn makes call ("attach", "mount <target>", "bind <target>", ...)
// fail with err; nil makes it work again.
func (w *fakeWorld) failOn(call string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		delete(w.fail, call)
		return
	}
	w.fail[call] = err
}

// setCopies makes every pool copy data, as a filesystem without
// reflinks does.
func (w *fakeWorld) setCopies() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.copies = true
}

// setSize makes image size bytes large, all allocated.
func (w *fakeWorld) setSize(image string, size int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sizes[image] = size
}

// holdOn blocks call until the channel closes.
func (w *fakeWorld) holdOn(call string, until chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hold[call] = until
}

// corruptMount makes a stat of the mount point at path fail with err
// until it is unmounted; nil heals it.
func (w *fakeWorld) corruptMount(path string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		delete(w.corrupt, path)
		return
	}
	w.corrupt[path] = err
}

// killSuperblock makes image's superblock stay shut down across remounts
// (dead), as when a container still holds the filesystem; false revives
// it.
func (w *fakeWorld) killSuperblock(image string, dead bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !dead {
		delete(w.deadSuper, image)
		return
	}
	w.deadSuper[image] = true
}

// setFs puts a filesystem of fsType on image, as made elsewhere; ""
// leaves it without one.
func (w *fakeWorld) setFs(image, fsType string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if fsType == "" {
		delete(w.fs, image)
		return
	}
	w.fs[image] = fsType
}

// makeDirs creates directories, as the kubelet does.
func (w *fakeWorld) makeDirs(paths ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range paths {
		w.dirs[p] = true
	}
}

// makeImages makes the images of volumes ids, as CreateVolume does.
func (w *fakeWorld) makeImages(ids ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		w.images[w.Path(id)] = true
	}
}

// makeImagesIn makes the images of volumes ids in pool.
func (w *fakeWorld) makeImagesIn(pool string, ids ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dir := fakePool{w: w, name: pool}.dir()
	for _, id := range ids {
		w.images[filepath.Join(dir, id+".img")] = true
	}
}

// setHoles makes n bytes of image unallocated.
func (w *fakeWorld) setHoles(image string, n int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holes[image] = n
}

// setFree gives the data directory n free bytes, which the pool then
// reports.
func (w *fakeWorld) setFree(n int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pool, w.free = true, n
}

// setGuard gives every pool guard g.
func (w *fakeWorld) setGuard(g capacity.Guard) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.guard = g
}

// autoClear sets the auto-clear flag of image's loop device, as a detach
// of a device that someone holds open does: it stays while they do.
func (w *fakeWorld) autoClear(image string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l, ok := w.loops[image]; ok {
		l.AutoClear = true
		w.loops[image] = l
	}
}

// detachInUse detaches image's loop device from outside as losetup -d
// does: it goes at once unless mounted, else with its last mount.
func (w *fakeWorld) detachInUse(image string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l, ok := w.loops[image]; ok {
		l.AutoClear = true
		w.loops[image] = l
		w.autoclearLocked()
	}
}

// detachOutside detaches image's loop device from outside.
func (w *fakeWorld) detachOutside(image string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.loops, image)
}

// addLoop attaches a device under key (a backing file, or another key for
// a second device of one image) from outside.
func (w *fakeWorld) addLoop(key string, l host.Device) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.loops[key] = l
}

// unmountAll removes every mount, as someone unmounting them all from
// outside.
func (w *fakeWorld) unmountAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unmountAllLocked()
}

// mountOutside adds m to the mount table, as someone else's mount; foreign
// marks it one the plugin must never unmount (the kubelet's subPath
// binds).
func (w *fakeWorld) mountOutside(m host.Mount, foreign bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mountLocked(m)
	if foreign {
		w.foreign[w.unique[w.mounts[len(w.mounts)-1].ID]] = true
	}
}

// unmountLast removes the latest mount, as its maker does.
func (w *fakeWorld) unmountLast() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unmountLocked(len(w.mounts) - 1)
}

// moveMounts moves every mount at path to to, as a rename of a directory
// above it does, and reports whether one moved. A stat of path no longer
// meets a corrupt mount.
func (w *fakeWorld) moveMounts(path, to string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	moved := false
	for i := range w.mounts {
		if w.mounts[i].Path == path {
			w.moveLocked(i, to)
			moved = true
		}
	}
	if moved {
		delete(w.corrupt, path)
	}
	return moved
}

// bindSubPath bind mounts the filesystem mounted at target at path, as the
// kubelet does for a container's subPath: a mount of the plugin's
// filesystem that is not the plugin's. It reports whether target had a
// mount to bind.
func (w *fakeWorld) bindSubPath(target, path string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.mounts) - 1; i >= 0; i-- {
		if m := w.mounts[i]; m.Path == target {
			m.Path, m.Root = path, "/data"
			w.mountLocked(m)
			w.foreign[w.unique[w.mounts[len(w.mounts)-1].ID]] = true
			return true
		}
	}
	return false
}

// unmountOne unmounts the mount pick chooses of the n in the table, as
// someone else does, and returns its path ("" when there is none).
func (w *fakeWorld) unmountOne(pick func(n int) int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.mounts) == 0 {
		return ""
	}
	i := pick(len(w.mounts))
	path := w.mounts[i].Path
	delete(w.corrupt, path)
	w.unmountLocked(i)
	return path
}

// goStale makes the mount at path fail its stat with ESTALE, as a mount
// whose filesystem went away does, and reports whether a volume was
// mounted there.
func (w *fakeWorld) goStale(path string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.imageAt(path) == "" {
		return false
	}
	w.corrupt[path] = syscall.ESTALE
	return true
}

// removePodDir removes the kubelet's directory pod (with target, the
// mount point in it) and its subPath binds, as the kubelet does with a pod
// it is done with, unless a volume is still mounted at target. It reports
// whether it removed it.
func (w *fakeWorld) removePodDir(pod, target string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.imageAt(target) != "" || !w.dirs[pod] {
		return false
	}
	w.removeSubPathsLocked(pod)
	delete(w.dirs, target)
	delete(w.dirs, pod)
	return true
}

// wipe removes the filesystem of image, as a wipe does, or replaces it by
// a partition table; it reports whether there was a filesystem to wipe.
func (w *fakeWorld) wipe(image string, partition bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if fs := w.fs[image]; fs == "" || fs == partitionTable {
		return false
	}
	delete(w.fs, image)
	if partition {
		w.fs[image] = partitionTable
	}
	return true
}

// sizeOf is image's size.
func (w *fakeWorld) sizeOf(image string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sizeLocked(image)
}

// removeSubPaths unmounts the subPath binds under pod, as the kubelet
// does before it unpublishes.
func (w *fakeWorld) removeSubPaths(pods ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, pod := range pods {
		w.removeSubPathsLocked(pod)
	}
}

// addSnapshot makes snapshot id of image, as one taken before.
func (w *fakeWorld) addSnapshot(id, image string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.snapshots[id] = fakeSnapshot{image: image}
}

// loop returns the device attached to image.
func (w *fakeWorld) loop(image string) (host.Device, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l, ok := w.loops[image]
	return l, ok
}

// loopKeys lists the attached devices by backing file, sorted.
func (w *fakeWorld) loopKeys() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(maps.Keys(w.loops))
}

// mountTable returns a copy of the mount table, oldest first.
func (w *fakeWorld) mountTable() []host.Mount {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.mounts)
}

// topMount returns the latest mount at path.
func (w *fakeWorld) topMount(path string) (host.Mount, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.mounts) - 1; i >= 0; i-- {
		if w.mounts[i].Path == path {
			return w.mounts[i], true
		}
	}
	return host.Mount{}, false
}

// fsOf is the filesystem on image, "" for none.
func (w *fakeWorld) fsOf(image string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fs[image]
}

// mkfsCount is how many times image was formatted.
func (w *fakeWorld) mkfsCount(image string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mkfs[image]
}

// takeChecks returns how many times each of paths was checked since the
// last takeChecks, and starts counting anew.
func (w *fakeWorld) takeChecks(paths ...string) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int, len(paths))
	for i, p := range paths {
		out[i] = w.checks[p]
	}
	clear(w.checks)
	return out
}

// snapshotOf returns what snapshot id was taken of.
func (w *fakeWorld) snapshotOf(id string) (fakeSnapshot, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.snapshots[id]
	return s, ok
}

// frozenImages lists the images whose filesystem is frozen, sorted.
func (w *fakeWorld) frozenImages() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(maps.Keys(w.frozen))
}

// flipDiscards turns the discards of image's device the other way, as an
// administrator writing its sysfs file does, and returns what they were.
func (w *fakeWorld) flipDiscards(image string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.loops[image]
	was := l.Discards
	l.Discards = !was
	w.loops[image] = l
	return was
}

// fakePool is one storage pool of the fake world: the default pool's data
// directory is the world's, another's is beside it. It honours the pool: an
// image or snapshot of another pool is not there, as on a real node.
type fakePool struct {
	w    *fakeWorld
	name string
}

// fakePools returns the fake world's pools named names, the default pool
// first: the reconciler's Config.Pools.
func fakePools(w *fakeWorld, names ...string) map[string]Pool {
	out := map[string]Pool{state.DefaultPool: fakePool{w: w, name: state.DefaultPool}}
	for _, n := range names {
		out[n] = fakePool{w: w, name: n}
	}
	return out
}

// dir is the pool's data directory.
func (p fakePool) dir() string {
	if p.name == state.DefaultPool {
		return p.w.dataDir
	}
	return p.w.dataDir + "-" + p.name
}

func (p fakePool) Image(id string) string { return filepath.Join(p.dir(), id+".img") }

func (p fakePool) IDOf(path string) (string, bool) {
	if filepath.Dir(path) != p.dir() {
		return "", false
	}
	return strings.CutSuffix(filepath.Base(path), ".img")
}

func (p fakePool) ImageSize(id string) (int64, error) { return p.w.size(p.Image(id)) }
func (p fakePool) Reserve(id string) error            { return p.w.reserve(p.Image(id)) }
func (p fakePool) Blank(id string) (bool, error)      { return p.w.blank(p.Image(id)) }
func (p fakePool) Taken(id string) (bool, error)      { return p.w.taken(p.dir(), id) }
func (p fakePool) Flush(image string) error           { return p.w.Flush(image) }
func (p fakePool) GrowImage(id string, size int64) (int64, error) {
	return p.w.growImageOf(id, p.Image(id), size)
}
func (p fakePool) Take(_ context.Context, id, image string, of devices.SnapshotOf, _ time.Time) (devices.SnapshotInfo, error) {
	return p.w.take(p.dir(), id, image, of)
}

func (p fakePool) DeleteSnapshot(id string) error {
	return p.w.do("delete snapshot "+id, func() string { return "" }, func() error {
		if s, ok := p.w.snapshots[id]; ok && filepath.Dir(s.image) == p.dir() {
			delete(p.w.snapshots, id)
		}
		return nil
	})
}

// CopyMode is reflink unless the world's copies copy data (copies).
func (p fakePool) CopyMode() devices.CopyMode {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	if p.w.copies {
		return devices.CopySparse
	}
	return devices.CopyReflink
}

func (p fakePool) ImageAllocated(id string) (int64, error) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	image := p.Image(id)
	if !p.w.images[image] {
		return 0, os.ErrNotExist
	}
	return p.w.sizeLocked(image) - p.w.holes[image], nil
}

// Guard is the world's guard of every pool.
func (p fakePool) Guard() capacity.Guard {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.w.guard
}

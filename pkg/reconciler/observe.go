package reconciler

import (
	"fmt"
	"path/filepath"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// actual is the observed state of one volume, derived from an observation.
type actual struct {
	// loop is the loop device attached to the volume's image, if any.
	loop *host.Device
	// extraLoops names further devices attached to the same image.
	extraLoops []string
	// idleExtraLoops are the extra devices that nothing mounts: harmless
	// to detach, and in the way of the stage.
	idleExtraLoops []string
	// stagingMount is the top mount at the staging path, if any.
	stagingMount *host.Mount
	// stageInPlace is true when the stage the record asks for is there on
	// the machine: stagingMount is the whole filesystem of the volume's
	// device or, for a raw block volume, the device is attached. It says
	// nothing of whether the filesystem is usable (unusable) or the record
	// withdrew the stage.
	stageInPlace bool
	// targets maps each recorded target path to its top mount, if any.
	targets map[string]*host.Mount
	// strays lists the plugin's own mounts of the volume's filesystem at
	// paths the record does not name, moved there by a rename; they are
	// unmounted.
	strays []stray
	// unknownMounts lists the mounts of the volume's filesystem inside the
	// roots whose unique ID could not be read this pass (a rename racing
	// the observation put a symlink in the path): they may be the plugin's
	// own, so no intent is forgotten while they are there.
	unknownMounts []string
	// mountIDs maps the staging path and each target that holds the
	// volume's mount to that mount's unique ID (0 when unknown).
	mountIDs map[string]uint64
	// foreignMounts lists the other mounts of the volume's filesystem at
	// paths the record does not name: someone else's (the kubelet's subPath
	// bind mounts, an operator's), never touched, and they block unstage.
	foreignMounts []string
	// deviceMounts counts the mounts of the volume's device, wherever
	// they are (the staging mount included).
	deviceMounts int
	// snapshotsTaken holds the IDs of the snapshots asked of the volume
	// that exist.
	snapshotsTaken map[string]bool

	// unusable says why the staged filesystem cannot be used (shut down, or
	// its mount point fails with EIO, ESTALE, ENOTCONN); "" when it can.
	unusable string
	// errorsRO is true when the kernel made the filesystem of a read-write
	// stage read-only, after errors.
	errorsRO bool
	// unusableTargets maps a published target whose mount point fails to
	// the error.
	unusableTargets map[string]string
	// block is true for a raw block volume: in place means attached, and a
	// publish is a bind mount of the device node.
	block bool
	// static is true for a volume on an existing block device (loop is
	// that device, when it is there): it is never attached nor detached.
	static bool
	// home is the volume's storage pool, resolved once per pass (plan):
	// every call about its image and snapshots goes there.
	home Pool
	// pool is the space of the data directory, and poolGuard the free
	// space below which it is nearly full.
	pool      host.PoolSpace
	poolGuard int64
	// poolName names the pool, for the conditions.
	poolName string
	// podsGone maps each live raw block publish whose pod's directory is
	// gone to that directory (podgone.go).
	podsGone map[string]string
	// io is what the pass saw of the IO limits in force for the device
	// in the cgroups of the pods that publish the volume; nil for a
	// volume whose record never asked for limits (nothing is read).
	io *ioActual
}

// poolFullBelow is the free space of the data directory below which the
// next write to a hole of a thin image may fail.
const poolFullBelow = 1 << 20

// poolLow reports whether the data directory's free space is below the
// guard.
func (a *actual) poolLow() bool { return a.pool.Known && capacity.NearlyFull(a.pool.Free, a.poolGuard) }

// poolFull reports whether the data directory is full: writes to the holes
// of images fail.
func (a *actual) poolFull() bool { return a.pool.Known && a.pool.Free < poolFullBelow }

// holes returns how much of the volume's image is not allocated.
func (a *actual) holes() int64 {
	if a.loop == nil || a.static {
		return 0
	}
	return max(0, a.loop.BackingSize-a.loop.BackingAllocated)
}

// published reports whether target holds a bind mount of the volume: of
// its filesystem, or for a raw block volume of its device node (a file of
// devtmpfs whose path there is the device's name).
func (a *actual) published(target string) bool {
	m := a.targets[target]
	if m == nil || a.loop == nil {
		return false
	}
	if a.block {
		return m.Root == "/"+filepath.Base(a.loop.Device) && (m.FsType == "devtmpfs" || m.FsType == "tmpfs")
	}
	return m.Dev == a.loop.Dev && m.Root == "/"
}

// anyPublished reports whether any target of v holds a bind mount of the
// volume.
func (a *actual) anyPublished(v *state.Volume) bool {
	for t := range v.Publishes {
		if a.published(t) {
			return true
		}
	}
	return false
}

// stray is the plugin's own mount at a path no record names.
type stray struct {
	path string
	// id is the mount's unique ID.
	id uint64
}

// checkMount stats a mount point and returns the unique ID of the top mount
// there (0 when unknown), and the error of a corrupted mount.
type checkMount func(path string) (uint64, error)

// observeVolume derives v's actual state from obs. image is the volume's
// backing file; check probes the mount points of the volume's filesystem;
// roots are the directories the plugin mounts in. A mount of the volume at
// a path the record does not name is a stray only if the record holds its
// unique ID: only a mount the plugin made is its own.
// A static volume's device, resolved by the caller, is staticDev.
func observeVolume(v *state.Volume, image string, obs *host.Observation, check checkMount, roots []string, staticDev *host.Device) *actual {
	a := &actual{targets: make(map[string]*host.Mount, len(v.Publishes)), mountIDs: map[string]uint64{}}
	a.observeDevice(v, image, obs, staticDev)
	a.observeStage(v, obs, check)
	a.observeTargets(v, obs, check)
	if a.loop != nil {
		mounts := obs.MountsOf(a.loop.Dev)
		a.deviceMounts = len(mounts)
		a.sortOtherMounts(v, mounts, check, roots)
	}
	return a
}

// observeDevice finds the volume's device: staticDev for a static volume,
// otherwise the loop device attached to image that is in use, with any
// further device attached to it (extraLoops; idleExtraLoops when nothing
// mounts one and it does not go away by itself). loop stays nil when
// there is none.
func (a *actual) observeDevice(v *state.Volume, image string, obs *host.Observation, staticDev *host.Device) {
	if v.Stage != nil && v.Stage.Device != "" {
		a.static, a.loop = true, staticDev
		return
	}
	ls := obs.LoopsFor(image)
	if len(ls) == 0 {
		return
	}
	a.loop = &ls[0]
	for _, l := range ls[1:] {
		a.extraLoops = append(a.extraLoops, l.Device)
		if len(obs.MountsOf(l.Dev)) == 0 && !l.AutoClear {
			a.idleExtraLoops = append(a.idleExtraLoops, l.Device)
		}
	}
}

// observeStage tells whether the stage v's record names is in place: for
// a raw block stage, the device is attached; for a filesystem, the top
// mount at the staging path is the whole filesystem of the device. An
// in-place filesystem is checked (check, except for a withdrawn stage)
// and is unusable when shut down or when its mount point fails; errorsRO
// when the kernel made a read-write stage read-only. A volume with no
// stage recorded is left as it is.
func (a *actual) observeStage(v *state.Volume, obs *host.Observation, check checkMount) {
	if v.Stage == nil {
		return
	}
	if v.Stage.Access == state.AccessBlock {
		// Nothing is mounted for a raw block stage: the device is it.
		a.block, a.stageInPlace = true, a.loop != nil
		return
	}
	m, ok := obs.MountAt(v.Stage.Path)
	if !ok {
		return
	}
	a.stagingMount = &m
	a.stageInPlace = a.loop != nil && m.Dev == a.loop.Dev && m.Root == "/"
	if !a.stageInPlace {
		return
	}
	switch {
	case m.Shutdown:
		a.unusable = "the filesystem was shut down (every I/O fails)"
	case v.Stage.Deleting:
		// Nothing reads a withdrawn stage's mount ID or state
		// (diff and condition stop at the withdrawal), and a
		// check is three system calls a pass: a teardown of
		// many volumes runs pass after pass.
	default:
		id, err := check(m.Path)
		if err != nil {
			a.unusable = fmt.Sprintf("the staging mount is corrupted: %v", err)
		}
		a.mountIDs[m.Path] = id
	}
	a.errorsRO = m.SuperReadOnly && !v.Stage.MountsReadOnly()
}

// observeTargets finds the top mount at each target the record names,
// and checks each that holds the volume's live publish: one whose mount
// point fails is in unusableTargets. A target with nothing mounted is
// absent from targets.
func (a *actual) observeTargets(v *state.Volume, obs *host.Observation, check checkMount) {
	for target := range v.Publishes {
		m, ok := obs.MountAt(target)
		if !ok {
			continue
		}
		a.targets[target] = &m
		// A withdrawn publish is not checked either: its unpublish
		// unmounts whatever is there, and nothing reads its ID.
		if !a.published(target) || m.Shutdown || v.Publishes[target].Deleting {
			continue
		}
		id, err := check(target)
		if err != nil {
			if a.unusableTargets == nil {
				a.unusableTargets = map[string]string{}
			}
			a.unusableTargets[target] = err.Error()
		}
		a.mountIDs[target] = id
	}
}

// sortOtherMounts sorts the mounts of the volume's filesystem at paths
// its record does not name: the plugin's own (strays: inside the roots,
// with a unique ID the record holds), those whose owner cannot be told this
// pass (unknown), and everyone else's (foreign).
func (a *actual) sortOtherMounts(v *state.Volume, mounts []host.Mount, check checkMount, roots []string) {
	for _, m := range mounts {
		if v.Stage != nil && m.Path == v.Stage.Path {
			continue
		}
		if _, ok := v.Publishes[m.Path]; ok {
			continue
		}
		if _, _, err := host.Beneath(m.Path, roots); err == nil {
			// Only the plugin's own mount is a stray; outside the roots
			// there is none.
			id, _ := check(m.Path)
			if id != 0 && recorded(v, id) {
				a.strays = append(a.strays, stray{path: m.Path, id: id})
				continue
			}
			if id == 0 {
				a.unknownMounts = append(a.unknownMounts, m.Path)
				continue
			}
		}
		a.foreignMounts = append(a.foreignMounts, m.Path)
	}
}

// recorded reports whether v's record holds the unique mount ID id.
func recorded(v *state.Volume, id uint64) bool {
	if v.Stage != nil && v.Stage.MountID == id {
		return true
	}
	for _, p := range v.Publishes {
		if p.MountID == id {
			return true
		}
	}
	return false
}

// releasePending reports whether the volume's device was detached and
// stays attached until its last user (another mount namespace, the
// kubelet's own loop device over a block volume) closes it.
func (a *actual) releasePending() bool {
	return a.loop != nil && a.loop.AutoClear && (a.block || !a.stageInPlace) && !a.static
}

// orphans returns, for every loop device attached to an image of the data
// directory whose volume has no stage recorded, the actual state to
// release. The write-ahead rule (a stage is forgotten only once its device is
// verified detached) makes every such device a leftover: of a crash before
// the record was written, of a lost store, or of someone else's losetup.
func orphans(obs *host.Observation, pools map[string]Pool, hasStage map[string]bool) map[string]*actual {
	out := map[string]*actual{}
	for _, l := range obs.Loops() {
		id, home, ok := imageOf(pools, l.BackingFile)
		if !ok || hasStage[id] {
			continue
		}
		if _, seen := out[id]; seen {
			continue // one device of an image at a time
		}
		a := &actual{loop: &l, home: home}
		for _, m := range obs.MountsOf(l.Dev) {
			a.foreignMounts = append(a.foreignMounts, m.Path)
		}
		out[id] = a
	}
	return out
}

// imageOf returns the volume whose image path is, and the pool that holds
// it; false when path is no pool's image.
func imageOf(pools map[string]Pool, path string) (string, Pool, bool) {
	for _, p := range pools {
		if id, ok := p.IDOf(path); ok {
			return id, p, true
		}
	}
	return "", nil, false
}

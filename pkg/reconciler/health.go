package reconciler

import (
	"fmt"
	"strings"
	"time"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// unusablePaths lists the live stage's and publishes' paths where the
// volume cannot be used now, and of those the publishes that were
// fulfilled and broke (broken).
func unusablePaths(v *state.Volume, a *actual, lost func(key state.IntentKey, gen int64) bool) (unusable, broken []string) {
	if !a.stageInPlace || a.unusable != "" {
		unusable = append(unusable, v.Stage.Path)
	}
	for _, t := range v.Targets() {
		p := v.Publishes[t]
		if p.Deleting {
			continue
		}
		switch {
		case !a.published(t):
			unusable = append(unusable, t)
			if lost(state.PublishKey(t), p.Generation) {
				broken = append(broken, t)
			}
		case a.unusableTargets[t] != "":
			unusable = append(unusable, t)
			broken = append(broken, t)
		case a.unusable != "":
			unusable = append(unusable, t)
		}
	}
	return unusable, broken
}

// condition decides the condition of v, the one place it is decided: from
// its record, what a pass observed of it (a), whether each intent was seen
// fulfilled (lost reports whether the intent of that generation was), and
// the latest failure of its operations (f, nil if none). Only a live stage
// has a condition. A lost filesystem comes first (DATA_LOSS); then what
// was observed (observed); then operations that keep failing (failing).
// The reconciler records the result (report), and NodeGetVolumeStats,
// NodeGetVolumeHealth, the metrics and the status page only read it.
func condition(v *state.Volume, a *actual, lost func(key state.IntentKey, gen int64) bool, f *failure) state.Condition {
	st := v.Stage
	if st == nil || st.Deleting {
		return state.Condition{}
	}
	c := observed(v, a, lost)
	if f == nil {
		return c
	}
	if f.act.key() == state.StageKey && f.act.generation == st.Generation {
		if dl, ok := state.LostFilesystem(f.err); ok {
			dl.Unusable = c.Unusable
			return dl
		}
	}
	if c.Abnormal {
		return c
	}
	return failing(v, c, f)
}

// observed derives the health of v, whose stage is live, from its actual
// state: abnormal when a live intent that was fulfilled is not any more
// (the plugin is repairing it), or when the volume's filesystem or device
// is damaged. Intents being set up or torn down are normal. The first
// problem found is reported, in the order an operator should look at them.
func observed(v *state.Volume, a *actual, lost func(key state.IntentKey, gen int64) bool) state.Condition {
	var c state.Condition
	st := v.Stage
	var broken []string
	c.Unusable, broken = unusablePaths(v, a, lost)
	abnormal := func(reason contract.Reason, format string, args ...any) state.Condition {
		c.Abnormal, c.Health, c.Reason, c.Message = true, state.Inaccessible, reason, fmt.Sprintf(format, args...)
		return c
	}
	degraded := func(reason contract.Reason, format string, args ...any) state.Condition {
		c = abnormal(reason, format, args...)
		c.Health = state.Degraded
		return c
	}
	stageLost := lost(state.StageKey, st.Generation)
	// Damage to the device or the staging mount leaves the volume usable
	// where a bind mount of it is still in place.
	staging := abnormal
	if a.anyPublished(v) {
		staging = degraded
	}
	switch {
	case len(a.extraLoops) > 0:
		return staging(contract.DeviceAttachedTwice, "the image of volume %s is attached more than once (%s); it is not mounted until the extra devices are detached",
			v.ID, strings.Join(append([]string{a.loop.Device}, a.extraLoops...), ", "))
	case stageLost && a.loop == nil:
		return abnormal(contract.DeviceDetached, "the loop device of volume %s is gone; attaching and mounting it again", v.ID)
	case stageLost && a.stagingMount == nil && !a.block:
		return staging(contract.StagingMountMissing, "nothing is mounted at the staging path %s; mounting volume %s again", st.Path, v.ID)
	case a.stagingMount != nil && !a.stageInPlace && !a.block:
		return staging(contract.StagingPathTaken, "the staging path %s holds another mount (%s)", st.Path, a.stagingMount.Source)
	case a.unusable != "" && len(a.foreignMounts) > 0:
		return abnormal(contract.FilesystemUnusable, "volume %s: %s; it cannot be remounted while it is also mounted at %s", v.ID, a.unusable, strings.Join(a.foreignMounts, ", "))
	case a.unusable != "":
		return abnormal(contract.FilesystemUnusable, "volume %s: %s; unmounting and mounting it again", v.ID, a.unusable)
	case a.errorsRO && ranOutUnder(v, a):
		return degraded(contract.FilesystemReadOnly, "the filesystem of volume %s went read-only after errors, after its storage pool ran out of space under it at %s; it is checked and mounted again once no pod uses it",
			v.ID, v.Stage.SpaceRanOutAt.UTC().Format(time.RFC3339))
	case a.errorsRO:
		return degraded(contract.FilesystemReadOnly, "the filesystem of volume %s went read-only after errors; it is checked and mounted again once no pod uses it", v.ID)
	case a.loop != nil && a.loop.AutoClear:
		return degraded(contract.DeviceDetachPending, "loop device %s of volume %s was detached from outside while in use; keeping it attached", a.loop.Device, v.ID)
	case len(broken) > 0 && a.unusableTargets[broken[0]] != "":
		return abnormal(contract.PublishMountUnusable, "the mount of volume %s at %s is corrupted (%s); mounting it again", v.ID, broken[0], a.unusableTargets[broken[0]])
	case len(broken) > 0:
		return abnormal(contract.PublishMountMissing, "volume %s is not mounted at %s; mounting it", v.ID, broken[0])
	}
	if reason, msg := spaceProblem(v, a); reason != "" {
		return degraded(reason, "%s", msg)
	}
	if msg := ioProblem(v, a); msg != "" {
		return degraded(contract.IOLimitsNotApplied, "%s", msg)
	}
	return c
}

// ranOutUnder reports whether the data directory ran out of space under
// the volume's current staging mount.
func ranOutUnder(v *state.Volume, a *actual) bool {
	id := v.Stage.SpaceRanOutUnder
	return id != 0 && id == a.mountIDs[v.Stage.Path]
}

// spaceProblem reports a volume whose writes may fail for want of space
// in the data directory: a thin volume while the data directory is full
// (writes to its image's holes fail) or nearly full; a volume under whose
// current staging mount the data directory ran out of space (its writes
// failed, and its filesystem is not trusted until it is checked); and a
// volume that is not thin whose image has holes the data directory has no
// room for.
func spaceProblem(v *state.Volume, a *actual) (reason contract.Reason, message string) {
	h := a.holes()
	switch {
	case v.Thin() && a.poolFull() && h > 0:
		return contract.PoolFull, fmt.Sprintf("pool %s is full (%d bytes free): writes to the %d bytes of thin volume %s that hold no data yet fail; free space in the pool or move volumes to another node",
			a.poolName, a.pool.Free, h, v.ID)
	case ranOutUnder(v, a):
		return contract.SpaceRanOut, fmt.Sprintf("pool %s ran out of space at %s under volume %s: any write to its unallocated blocks failed (ENOSPC at fsync) and its filesystem may have lost metadata writes; it is checked when it is next mounted: stop the pods using it, so that it is unstaged, checked and staged again",
			a.poolName, v.Stage.SpaceRanOutAt.UTC().Format(time.RFC3339), v.ID)
	case v.Thin() && a.poolLow():
		return contract.PoolNearlyFull, fmt.Sprintf("pool %s has %d bytes free, below the guard of %d bytes: thin volume %s (%d bytes not yet allocated) may fail writes once it is full; no volume is created or grown in it until it has room",
			a.poolName, a.pool.Free, a.poolGuard, v.ID, h)
	case !v.Thin() && h > 0 && (!a.pool.Known || h > a.pool.Free):
		return contract.SpaceNotReserved, fmt.Sprintf("%d bytes of the image of volume %s are not allocated and pool %s has %d bytes free: writes to them fail once it is full; they are allocated when it has room",
			h, v.ID, a.poolName, a.pool.Free)
	}
	return "", ""
}

// repeatedFailures is how many failures in a row of one operation make a
// volume DEGRADED: one or two are the ordinary retries of a busy node.
const repeatedFailures = 3

// failing adds to the normal condition c of v what the latest failure of
// its operations (f) says: a growth that failed or keeps failing, or any
// operation failing repeatedly (DEGRADED).
func failing(v *state.Volume, c state.Condition, f *failure) state.Condition {
	switch {
	case f.act.key() == state.ExpandKey && f.final:
		c.Abnormal, c.Health, c.Reason = true, state.Degraded, contract.GrowFailed
		c.Message = fmt.Sprintf("%s of volume %s failed (%s); tried again when the expansion is asked for again; its mounts and data are untouched",
			f.act, v.ID, f.err.Message)
	case f.act.key() == state.ExpandKey:
		c.Abnormal, c.Health, c.Reason = true, state.Degraded, contract.GrowFailed
		c.Message = fmt.Sprintf("growing volume %s failed %d times (%s); retrying at %s; its mounts are untouched",
			v.ID, f.attempts, f.err.Message, f.next.Format(time.RFC3339))
	case f.attempts >= repeatedFailures:
		c.Abnormal, c.Health, c.Reason = true, state.Degraded, contract.OperationFailing
		c.Message = fmt.Sprintf("%s of volume %s failed %d times in a row (%s); retrying at %s",
			f.act, v.ID, f.attempts, f.err.Message, f.next.Format(time.RFC3339))
	}
	return c
}

package reconciler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// snapshots returns the steps of the snapshots asked of v: take each that
// does not exist yet, and forget the intent of each that does (taken by an
// operation that a crash stopped before it forgot it).
func snapshots(v *state.Volume, a *actual) []action {
	var acts []action
	for _, id := range v.SnapshotIDs() {
		in := v.Snapshots[id]
		gen := in.Generation
		if a.snapshotsTaken[id] {
			acts = append(acts, action{kind: actForgetSnapshot, target: id, generation: gen, reason: "snapshot taken"})
			continue
		}
		if in.Group != nil {
			acts = append(acts, action{kind: actTakeGroupSnapshot, target: id, generation: gen,
				reason: fmt.Sprintf("group snapshot %s of %d volumes asked for", in.Group.ID, len(in.Group.Members))})
			continue
		}
		acts = append(acts, action{kind: actTakeSnapshot, target: id, generation: gen, reason: "snapshot asked for"})
	}
	return acts
}

// takenSnapshots observes which of the snapshots asked of v exist: a
// group snapshot when every member's does. One that cannot be told counts
// as not taken: taking it tells why.
func takenSnapshots(v *state.Volume, in Pool) map[string]bool {
	if len(v.Snapshots) == 0 {
		return nil
	}
	taken := make(map[string]bool, len(v.Snapshots))
	for id, s := range v.Snapshots {
		if s.Group == nil {
			taken[id], _ = in.Taken(id)
			continue
		}
		taken[id] = true
		for _, snap := range s.Group.Members {
			if ok, _ := in.Taken(snap); !ok {
				taken[id] = false
				break
			}
		}
	}
	return taken
}

// takeSnapshot copies v's image to the snapshot act.target, stamped with
// the filesystem v carries and how its data may have been written
// (Volume.WrittenAs), with its filesystem frozen meanwhile (frozenWhile),
// and forgets the intent.
func (r *Reconciler) takeSnapshot(ctx context.Context, v *state.Volume, a *actual, act action) error {
	if a.static {
		return staticRefused(v, "")
	}
	image := a.home.Image(v.ID)
	err, berr, _ := r.frozenWhile([]member{{v: v, a: a}}, func() error {
		of := devices.SnapshotOf{Source: v.ID, FsType: v.Formatted, Access: string(v.WrittenAs())}
		_, err := a.home.Take(ctx, act.target, image, of, r.cfg.Clock.Now())
		// The snapshot is taken (unless err) and the volume still frozen.
		// gofail: var reconcilerSnapshotAfterCopy struct{}
		return err
	})
	if berr != nil {
		return errors.Join(err, berr)
	}
	if !errors.Is(err, os.ErrExist) { // else taken by an attempt that did not forget its intent
		if err := takeRefused(err, act.target, v.ID, ""); err != nil {
			return err
		}
	}
	// Taken and thawed; the snapshot's intent is not yet forgotten.
	// gofail: var reconcilerSnapshotAfterTake struct{}
	return r.recordKernelState(v.ID, func(cur *state.Volume) error {
		cur.ForgetSnapshot(act.target, act.generation)
		return nil
	})
}

// staticRefused is the refusal of a snapshot of v, (a member of group
// snapshot group, if not ""), a volume on a block device of its own: it
// has no image to copy.
func staticRefused(v *state.Volume, group string) error {
	of := ""
	if group != "" {
		of = " of group snapshot " + group
	}
	return classified.Terminalf(classified.KindFailedPrecondition, "volume %s%s is on the block device %s; only volumes on images of a storage pool have snapshots", v.ID, of, v.Stage.Device)
}

// takeRefused is what a failure err of Pool.Take, copying volume's image
// to snapshot (for group snapshot group, if not ""), ends the step with:
// no image, no room, or the error itself; nil for none.
func takeRefused(err error, snapshot, volume, group string) error {
	of := ""
	if group != "" {
		of = " (group snapshot " + group + ")"
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return classified.Terminalf(classified.KindNotFound, "volume %s%s has no image to take a snapshot of", volume, of)
	case state.NoSpace(err):
		return classified.Terminalf(classified.KindResourceExhausted, "no room in the storage pool for snapshot %s of volume %s%s: %v", snapshot, volume, of, err)
	default:
		return fmt.Errorf("taking snapshot %s of volume %s%s: %w", snapshot, volume, of, err)
	}
}

// frozenWhile runs fn, which copies the images of ms, with the filesystems
// of those in use frozen (freezes), so that the copies hold them clean and
// at one instant: each is written out first (writeOut), then frozen in the
// order of ms, each freeze recorded first so that a crash thaws it at the
// next pass, and all are thawed in reverse order, whether fn succeeded,
// failed or was cancelled. A raw block volume and a read-only filesystem
// are copied as they are. It returns fn's error (nil when fn did not run);
// the failure to write out, freeze or thaw (fn did not run when it is not
// a thaw's), which ends the step as it is: the record keeps a member's
// Frozen when its thaw failed, and the next pass thaws it; and how long
// the filesystems were frozen, which goes to the Recorder.
func (r *Reconciler) frozenWhile(ms []member, fn func() error) (fnErr, err error, frozenFor time.Duration) {
	for _, m := range ms {
		if err := r.writeOut(m.v, m.a, m.a.home.Image(m.v.ID)); err != nil {
			return nil, err, 0
		}
	}
	thawAll, at, err := r.freezeAll(ms)
	if err != nil {
		return nil, err, 0
	}
	fnErr = fn()
	err = thawAll()
	if !at.IsZero() {
		frozenFor = r.cfg.Clock.Since(at)
		r.cfg.Recorder.Frozen(frozenFor)
	}
	return fnErr, err, frozenFor
}

// freezes reports whether a copy of v's image freezes its filesystem
// first: when it is staged in place, writable, and a filesystem (a raw
// block device cannot be frozen).
func freezes(v *state.Volume, a *actual) bool {
	return liveStage(v, a) && !a.block
}

// liveStage reports whether v is staged in place and writable: its pods
// may be writing to it while a copy of its image is made.
func liveStage(v *state.Volume, a *actual) bool {
	st := v.Stage
	return st != nil && !st.Deleting && a != nil && a.stageInPlace && !st.MountsReadOnly()
}

// writeOut writes out what v wrote, when a copy of image, v's image,
// freezes its filesystem (freezes): what is in the image's page cache
// written out before the freeze, the freeze and the copy have only what
// comes meanwhile.
func (r *Reconciler) writeOut(v *state.Volume, a *actual, image string) error {
	if !freezes(v, a) {
		return nil
	}
	if err := r.cfg.Paths.Sync(v.Stage.Path); err != nil {
		return fmt.Errorf("syncing %s: %w", v.Stage.Path, err)
	}
	if err := a.home.Flush(image); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("flushing the image of %s: %w", v.ID, err)
	}
	return nil
}

// freeze freezes v's filesystem for a copy of its image when the copy
// freezes it (freezes), after writeOut: it records the freeze (v.Frozen),
// so that a crash before the thaw is undone by the next pass (actThaw),
// and freezes. It returns the thaw, which thaws the
// filesystem and clears the record (the record keeps v.Frozen when the
// thaw fails), and when the freeze began; a nil thaw when there was
// nothing to freeze. On an error nothing is left frozen nor recorded so.
func (r *Reconciler) freeze(v *state.Volume, a *actual) (thaw func() error, at time.Time, err error) {
	if !freezes(v, a) {
		return nil, time.Time{}, nil
	}
	path := v.Stage.Path
	if err := r.recordKernelState(v.ID, func(cur *state.Volume) error { cur.Frozen = path; return nil }); err != nil {
		return nil, time.Time{}, err
	}
	// Recorded as frozen, and not frozen yet.
	// gofail: var reconcilerSnapshotBeforeFreeze struct{}
	at = r.cfg.Clock.Now()
	err = r.cfg.Paths.Freeze(path)
	// Frozen (unless err), and recorded so: the next pass thaws it.
	// gofail: var reconcilerSnapshotAfterFreeze struct{}
	if err != nil {
		if errors.Is(err, devices.ErrFrozen) {
			// Someone else's freeze: not ours to thaw, nor to copy
			// under; wait for it to end.
			err = fmt.Errorf("the filesystem of volume %s is frozen by someone else: %w", v.ID, err)
		}
		if cerr := r.clearFrozen(v.ID, path); cerr != nil {
			return nil, time.Time{}, errors.Join(err, cerr)
		}
		return nil, time.Time{}, err
	}
	return func() error {
		if err := r.cfg.Paths.Thaw(path); err != nil {
			// The record keeps v.Frozen: the next pass thaws it.
			return fmt.Errorf("thawing %s: %w", path, err)
		}
		// Thawed, and still recorded as frozen.
		// gofail: var reconcilerSnapshotAfterThaw struct{}
		return r.clearFrozen(v.ID, path)
	}, at, nil
}

// thaw thaws the filesystem at path that v's record says a snapshot froze,
// and clears the record. The filesystem is thawed only while it is v's
// staging mount: anything else there is not the plugin's to thaw. While
// the stage is wanted and not in place, diff holds the thaw back until it
// is (thawAwaitsStage).
func (r *Reconciler) thaw(v *state.Volume, a *actual, path string) error {
	if st := v.Stage; st != nil && st.Path == path && a.stageInPlace && !a.block {
		if err := r.cfg.Paths.Thaw(path); err != nil {
			return fmt.Errorf("thawing %s: %w", path, err)
		}
	}
	// The repair has thawed it; the record still says frozen.
	// gofail: var reconcilerThawAfterThaw struct{}
	return r.clearFrozen(v.ID, path)
}

// clearFrozen records that the filesystem at path is no longer frozen by
// the plugin. A crash of the machine thaws every filesystem, so it need not
// wait for the disk, nor does setting it.
func (r *Reconciler) clearFrozen(id, path string) error {
	return r.recordKernelState(id, func(cur *state.Volume) error {
		if cur.Frozen == path {
			cur.Frozen = ""
		}
		return nil
	})
}

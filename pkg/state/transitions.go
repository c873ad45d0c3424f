package state

import (
	"strings"
	"time"

	"github.com/converge-csi/converge/pkg/classified"
)

// The transitions the reconciler makes to a record once an operation has
// ended. Each applies only to the intent of the generation the operation
// served, and reports whether it changed anything: an intent that changed
// meanwhile (a new request, a withdrawal) is the newer truth, and is left
// as it is. They run inside Store.Update and do no I/O.

// ForgetPublish drops the withdrawn publish at target of generation gen,
// once its mount is verified gone.
func (v *Volume) ForgetPublish(target string, gen int64) bool {
	if p := v.Publishes[target]; p != nil && p.Deleting && p.Generation == gen {
		delete(v.Publishes, target)
		return true
	}
	return false
}

// ForgetStage drops the withdrawn stage of generation gen, and the
// expansion asked of it (the image keeps its size), once its device is
// verified released.
func (v *Volume) ForgetStage(gen int64) bool {
	if st := v.Stage; st != nil && st.Deleting && st.Generation == gen {
		v.Stage, v.Expand = nil, nil
		return true
	}
	return false
}

// RecordSpaceRanOut records that the data directory was seen full under
// the staging mount mountID of the live stage of generation gen (the one
// its record names), at time at unless it was seen before.
func (v *Volume) RecordSpaceRanOut(gen int64, mountID uint64, at time.Time) bool {
	st := v.Stage
	if st == nil || st.Deleting || st.Generation != gen || st.MountID != mountID {
		return false
	}
	if st.SpaceRanOutUnder != mountID {
		st.SpaceRanOutUnder, st.SpaceRanOutAt = mountID, at
	}
	return true
}

// RecordMountID records id as the unique ID of the mount of the live stage
// (target "") or publish at target of generation gen.
func (v *Volume) RecordMountID(target string, gen int64, id uint64) bool {
	if target == "" {
		if st := v.Stage; st != nil && !st.Deleting && st.Generation == gen {
			st.MountID = id
			return true
		}
		return false
	}
	if p := v.Publishes[target]; p != nil && !p.Deleting && p.Generation == gen {
		p.MountID = id
		return true
	}
	return false
}

// WithdrawStage withdraws the live stage of generation gen, whose set-up
// failed for good, and with it the live publishes on top of it, which can
// no longer be fulfilled; it returns those publishes' generations by target.
func (v *Volume) WithdrawStage(gen int64) (publishes map[string]int64, ok bool) {
	st := v.Stage
	if st == nil || st.Deleting || st.Generation != gen {
		return nil, false
	}
	st.Deleting = true
	publishes = map[string]int64{}
	for t, p := range v.Publishes {
		if !p.Deleting {
			p.Deleting = true
			publishes[t] = p.Generation
		}
	}
	return publishes, true
}

// WithdrawPublish withdraws the live publish at target of generation gen,
// whose set-up failed for good.
func (v *Volume) WithdrawPublish(target string, gen int64) bool {
	if p := v.Publishes[target]; p != nil && !p.Deleting && p.Generation == gen {
		p.Deleting = true
		return true
	}
	return false
}

// WithdrawIdleStage withdraws the live stage of a volume that has no
// publish nor snapshot under way, for its deletion: the CO deletes a
// volume once its claim is gone, which no pod then publishes, and a stage
// left is one the kubelet is about to withdraw (it unstages after the
// unpublish) or one it forgot. It forgets a raw block volume whose pod it
// deleted while the plugin was down (it cannot rebuild it from its
// links), and a volume of either kind whose pod it tore down just before
// it restarted, as after a reboot, and never unstaged: it rebuilds a
// volume from its pods' directories alone, and the teardown removed
// them. It reports whether it withdrew the stage.
func (v *Volume) WithdrawIdleStage() bool {
	if !v.IdleStage() || v.Stage.Deleting {
		return false
	}
	v.Stage.Deleting = true
	return true
}

// IdleStage reports whether the volume has a stage, live or being
// withdrawn, with no publish nor snapshot under way and no freeze: one
// WithdrawIdleStage withdraws, or did.
func (v *Volume) IdleStage() bool {
	st := v.Stage
	return st != nil && len(v.Publishes) == 0 && len(v.Snapshots) == 0 && v.Frozen == ""
}

// KeepStaged cancels the withdrawal of the stage of generation gen, whose
// unstage was refused for good: the volume stays staged.
func (v *Volume) KeepStaged(gen int64) bool {
	if st := v.Stage; st != nil && st.Deleting && st.Generation == gen {
		st.Deleting = false
		return true
	}
	return false
}

// ForgetSnapshot drops the intent of snapshot id of generation gen: taken,
// or failed for good.
func (v *Volume) ForgetSnapshot(id string, gen int64) bool {
	if s := v.Snapshots[id]; s != nil && s.Generation == gen {
		delete(v.Snapshots, id)
		if len(v.Snapshots) == 0 {
			v.Snapshots = nil
		}
		return true
	}
	return false
}

// StartRemoval marks the volume as being removed, unless an intent still
// uses it (FAILED_PRECONDITION, naming where).
func (v *Volume) StartRemoval() error {
	if v.Stage != nil {
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s is staged at %s", v.ID, v.Stage.Path)
	}
	if len(v.Publishes) > 0 {
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s is published at %s", v.ID, strings.Join(v.Targets(), ", "))
	}
	if len(v.Snapshots) > 0 {
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s: snapshot %s is being taken", v.ID, strings.Join(v.SnapshotIDs(), ", "))
	}
	v.Removing = true
	return nil
}

// FinishRemoval forgets the volume once its image is gone: what the record
// held (the provenance, the size, the provisioning and the IO limits) no
// longer describes anything.
func (v *Volume) FinishRemoval() {
	*v = Volume{ID: v.ID, Generation: v.Generation, Stage: v.Stage, Publishes: v.Publishes, Expand: v.Expand, Snapshots: v.Snapshots, Frozen: v.Frozen}
}

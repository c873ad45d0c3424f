package reconciler

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/state"
)

// actionKind is what an operation does. Everything the reconciler knows of
// a kind is its entry in kinds.
type actionKind int

const (
	actUnpublish actionKind = iota
	actUnstage
	actStage
	actPublish
	actRelease
	actUnmountTarget
	actUnmountStaging
	actKeepDevice
	actUnmountStray
	actGrowDevice
	actGrowFs
	actDetachExtra
	actRecordMount
	actReserve
	actSetDiscards
	actRecordSpaceRanOut
	actGrowImage
	actGrowFsOffline
	actTakeSnapshot
	actForgetSnapshot
	actThaw
	actTakeGroupSnapshot
	actSetIOLimits
	actClearIOLimits
	actWithdrawOrphan

	// kindCount is the number of kinds; kinds has an entry for each.
	kindCount
)

// intent names the intent an action serves, which keys its result and its
// final.
type intent int

const (
	// forStage: the stage (and the release of an orphan, which has none).
	forStage intent = iota + 1
	// forPublish: the publish at the action's target.
	forPublish
	// forExpand: the expansion.
	forExpand
	// forStageOrPublish: the stage when the action has no target, else
	// the publish at its target.
	forStageOrPublish
	// forSnapshot: the snapshot whose ID is the action's target.
	forSnapshot
	// forIOLimits: the volume's IO limits.
	forIOLimits
)

// kindSpec is everything the reconciler knows of one kind of action.
type kindSpec struct {
	name string
	// teardown: it removes something; a pass starts teardowns first.
	teardown bool
	// repair: it undoes damage done to a live volume. Repairs back off
	// even when they succeed (see executor.blocked), so that damage that
	// comes straight back, such as a shut-down filesystem that a container
	// still holds, cannot make the loop churn.
	repair bool
	// counted: a success is counted as a repair in the metrics (every
	// repair, and the kinds that undo what someone did from outside).
	counted bool
	// fulfils: a success fulfils its intent by itself (a stage leaves the
	// filesystem mounted or the device attached, a publish the bind
	// mount). Other kinds are one step of several, or serve an intent
	// that is fulfilled when it is gone.
	fulfils bool
	// drifts: what it makes, someone else may undo (a cgroup's rules,
	// which a kubelet or an operator may rewrite): done where the diff saw
	// it undone (action.drift), it is a repair of that drift, counted and
	// backed off as a repair is. Done where it was never seen (a new
	// container's cgroup), it is no repair.
	drifts bool
	// slow: it may take long (mkfs, fsck, resize), so it runs in the slow
	// pool.
	slow bool
	// serves is the intent the action serves.
	serves intent
	// final is what a terminal failure does to that intent: held,
	// heldAndAnswered, withdrawn or keptStaged. (Any failure that is not
	// terminal is retried with backoff.)
	final effect
	// run performs the action on the volume whose record (v) and actual
	// state (a) the pass saw; the commands it runs end with ctx.
	run func(ctx context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error
}

// kinds is the table of action kinds. init fills it: its run functions
// reach code that reads it, which a variable's initializer may not.
var kinds [kindCount]kindSpec

func init() { kinds = kindTable() }

func kindTable() [kindCount]kindSpec {
	return [kindCount]kindSpec{
		actUnpublish: {name: "unpublish", teardown: true, serves: forPublish, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error {
				return r.unpublish(v, a, act.target)
			}},
		actUnstage: {name: "unstage", teardown: true, serves: forStage, final: keptStaged,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, _ action) error {
				return r.unstage(v, a)
			}},
		actStage: {name: "stage", fulfils: true, slow: true, serves: forStage, final: withdrawn,
			run: func(ctx context.Context, r *Reconciler, v *state.Volume, a *actual, _ action) error {
				return r.stage(ctx, v, a)
			}},
		actPublish: {name: "publish", fulfils: true, serves: forPublish, final: withdrawn,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error {
				return r.publish(v, a, act.target)
			}},
		// Unmounts and detaches a loop device of the data directory that no
		// stage references.
		actRelease: {name: "release orphan", teardown: true, counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, _ *state.Volume, a *actual, _ action) error {
				return r.release(a)
			}},
		// Unmounts an unusable publish mount and keeps the publish, so that a
		// later pass mounts it again.
		actUnmountTarget: {name: "unmount unusable target", teardown: true, repair: true, counted: true, serves: forPublish, final: held,
			run: func(ctx context.Context, r *Reconciler, _ *state.Volume, _ *actual, act action) error {
				return r.unmountTarget(klog.FromContext(ctx), act.target)
			}},
		// Unmounts an unusable staging mount and keeps the stage, so that a
		// later pass mounts it again (after fsck).
		actUnmountStaging: {name: "unmount unusable staging", teardown: true, repair: true, counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, _ *actual, _ action) error {
				return r.unmountStaging(v)
			}},
		// Clears the auto-clear flag that a losetup -d from outside set on the
		// volume's loop device.
		actKeepDevice: {name: "keep device", counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, _ *state.Volume, a *actual, _ action) error {
				return r.keepDevice(a)
			}},
		// Unmounts the plugin's own mount of the volume's filesystem found at a
		// path no record names (target is that path, mountID the mount).
		actUnmountStray: {name: "unmount stray", teardown: true, repair: true, counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, _ *state.Volume, _ *actual, act action) error {
				return r.unmountStray(act.target, act.mountID)
			}},
		// Grows the image to the size the expansion asks for, within what
		// the data directory can promise.
		actGrowImage: {name: "grow image", slow: true, serves: forExpand, final: heldAndAnswered,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, _ action) error {
				return r.growImage(v, a)
			}},
		// Grows an ext4 that nothing uses while it is unmounted: unmounts
		// the staging mount, checks and grows the filesystem, and mounts it
		// again.
		actGrowFsOffline: {name: "grow filesystem offline", slow: true, serves: forExpand, final: heldAndAnswered,
			run: func(ctx context.Context, r *Reconciler, v *state.Volume, a *actual, _ action) error {
				return r.growFsOffline(ctx, v, a)
			}},
		// Makes the loop device take its grown image's size.
		actGrowDevice: {name: "grow device", serves: forExpand, final: heldAndAnswered,
			run: func(_ context.Context, r *Reconciler, _ *state.Volume, a *actual, _ action) error {
				return r.growDevice(a)
			}},
		// Grows the staged filesystem to fill its device.
		actGrowFs: {name: "grow filesystem", slow: true, serves: forExpand, final: heldAndAnswered,
			run: func(ctx context.Context, r *Reconciler, v *state.Volume, a *actual, _ action) error {
				return r.growFs(ctx, v, a)
			}},
		// Detaches a second, unmounted loop device of the volume's image
		// (target is the device).
		actDetachExtra: {name: "detach extra device", teardown: true, repair: true, counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, _ *state.Volume, _ *actual, act action) error {
				_, err := r.cfg.Loops.Detach(act.target)
				return err
			}},
		// Records the unique ID of the mount at the staging path (target "")
		// or at a target, so that the plugin knows it as its own wherever it
		// goes later.
		actRecordMount: {name: "record mount", serves: forStageOrPublish, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, _ *actual, act action) error {
				return r.recordMount(v.ID, act)
			}},
		// Allocates the holes of the image of a volume that is not thin.
		actReserve: {name: "reserve space", repair: true, counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, _ action) error {
				return r.reserve(v, a)
			}},
		// Makes the device of a thin volume pass discards, and that of any
		// other refuse them.
		actSetDiscards: {name: "set discards", repair: true, counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, _ action) error {
				return r.cfg.Loops.SetDiscards(a.loop.Device, v.Thin())
			}},
		// Copies the volume's image to the snapshot whose ID is the
		// target, its filesystem frozen meanwhile when it is staged, and
		// forgets the intent.
		actTakeSnapshot: {name: "take snapshot", fulfils: true, slow: true, serves: forSnapshot, final: withdrawn,
			run: func(ctx context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error {
				return r.takeSnapshot(ctx, v, a, act)
			}},
		// Takes the group snapshot whose intent the volume (the group's
		// leader) keeps under the ID target: every member's filesystem
		// frozen, every image copied, every filesystem thawed; the
		// operation holds every member volume (action.members).
		actTakeGroupSnapshot: {name: "take group snapshot", fulfils: true, slow: true, serves: forSnapshot, final: withdrawn,
			run: func(ctx context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error {
				return r.takeGroupSnapshot(ctx, v, a, act)
			}},
		// Forgets the intent of a snapshot that exists (taken before a
		// crash let the intent be forgotten).
		actForgetSnapshot: {name: "forget snapshot intent", serves: forSnapshot, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, _ *actual, act action) error {
				return r.recordKernelState(v.ID, func(cur *state.Volume) error {
					cur.ForgetSnapshot(act.target, act.generation)
					return nil
				})
			}},
		// Thaws the filesystem a snapshot froze (target: its staging
		// path), which a crash left frozen.
		actThaw: {name: "thaw", repair: true, counted: true, serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error {
				return r.thaw(v, a, act.target)
			}},
		// Sets the volume's IO limits in every cgroup of the pod of the
		// publish at target, where they differ (zero limits remove them).
		actSetIOLimits: {name: "set io limits", drifts: true, serves: forIOLimits, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error {
				return r.applyIOLimits(a, act.target, v.WantsIOLimits())
			}},
		// Removes the rules for the volume's device from the cgroups of
		// the pod of the withdrawn publish at target; tried once, so
		// that it never holds the unpublish (clearIOLimits).
		actClearIOLimits: {name: "clear io limits", teardown: true, serves: forPublish, final: held,
			run: func(ctx context.Context, r *Reconciler, v *state.Volume, a *actual, act action) error {
				return r.clearIOLimits(ctx, v, a, act.target)
			}},
		// Withdraws a raw block publish whose pod the kubelet forgot
		// (podgone.go).
		actWithdrawOrphan: {name: "withdraw orphaned publish", teardown: true, counted: true, serves: forPublish, final: held,
			run: func(ctx context.Context, r *Reconciler, v *state.Volume, _ *actual, act action) error {
				return r.withdrawOrphan(ctx, v, act)
			}},
		// Records that the data directory ran out of space under the
		// staging mount, which the volume then reports until it is
		// mounted again.
		actRecordSpaceRanOut: {name: "record space ran out", serves: forStage, final: held,
			run: func(_ context.Context, r *Reconciler, v *state.Volume, _ *actual, act action) error {
				_, err := r.cfg.Store.Update(v.ID, func(cur *state.Volume) error {
					cur.RecordSpaceRanOut(act.generation, act.mountID, r.cfg.Clock.Now())
					return nil
				})
				return err
			}},
	}
}

func (k actionKind) spec() *kindSpec { return &kinds[k] }

func (k actionKind) String() string { return kinds[k].name }

// key returns the intent the action serves.
func (a action) key() state.IntentKey {
	switch a.kind.spec().serves {
	case forStage:
		return state.StageKey
	case forExpand:
		return state.ExpandKey
	case forStageOrPublish:
		if a.target == "" {
			return state.StageKey
		}
	case forSnapshot:
		return state.SnapshotKey(a.target)
	case forIOLimits:
		return state.IOLimitsKey
	}
	return state.PublishKey(a.target)
}

package reconciler

import (
	"fmt"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// action is one step toward the desired state of a volume.
type action struct {
	kind actionKind
	// target is the publish target path (publish and unpublish only).
	target string
	// generation is the generation of the intent the action serves.
	generation int64
	// mountID is the unique ID of the mount a stray unmount removes or a
	// record mount records.
	mountID uint64
	// reason says why the diff chose the action, for the logs.
	reason string
	// drift: the diff saw undone what a pass had seen the action's kind
	// make at this generation (a cgroup seen holding the volume's IO
	// limits lost or changed them: a hand edit, a kubelet's rewrite), so
	// the action repairs a drift (kindSpec.drifts). Something made for
	// the first time (a new container's cgroup) is no drift.
	drift bool
	// members are the other volumes a group snapshot holds, with what the
	// pass saw of them, set when the pass starts it (groupMembers): the
	// operation runs only while none of them runs one, and holds them all.
	members []member
}

// member is one volume a group snapshot holds besides its leader.
type member struct {
	v *state.Volume
	a *actual
}

// volumes returns the IDs of the volumes an action of volume id holds
// while it runs: id, and a group snapshot's other members.
func (a action) volumes(id string) []string {
	ids := []string{id}
	for _, m := range a.members {
		ids = append(ids, m.v.ID)
	}
	return ids
}

func (a action) String() string {
	if a.target != "" {
		return fmt.Sprintf("%s %s", a.kind, a.target)
	}
	return a.kind.String()
}

// stageReady reports whether v's stage is fulfilled: its filesystem is
// mounted at the staging path and usable. A filesystem that went read-only
// after errors still counts (it is reported, not ready for new publishes).
func stageReady(v *state.Volume, a *actual) bool {
	return v.Stage != nil && !v.Stage.Deleting && a.stageInPlace && (a.block || v.Formatted != "") && a.unusable == ""
}

// publishReady reports whether the publish of v at target is fulfilled:
// bind mounted, usable, and its pod held to the volume's IO limits when
// the pod has a cgroup (podLimited), so that a publish answers only once
// its pod's IO is limited. A pod with no cgroup yet does not hold the
// publish back: the kubelet makes a pod's cgroup before it mounts its
// volumes, but a static pod or a test's harness may make none.
func publishReady(v *state.Volume, a *actual, target string) bool {
	p := v.Publishes[target]
	return p != nil && !p.Deleting && stageReady(v, a) && a.published(target) && a.unusableTargets[target] == "" && podLimited(v, a, target)
}

// diff compares v with its actual state and returns the actions that lead to
// the desired state, in the order they must run: a thaw of what a snapshot
// left frozen, withdrawn publishes (their pods' IO limits removed first),
// then a withdrawn stage (only once no publish is left), then the stage,
// then the publishes (only on top of a ready stage, each pod's IO limits
// set before its bind mount), then the snapshots asked for. An empty result means
// converged.
func diff(v *state.Volume, a *actual) []action {
	var acts []action
	if v.Frozen != "" && !thawAwaitsStage(v, a) {
		acts = append(acts, action{kind: actThaw, target: v.Frozen, reason: "a snapshot froze the filesystem and did not record its thaw"})
	}
	acts = append(acts, diffMounts(v, a)...)
	return append(acts, snapshots(v, a)...)
}

// thawAwaitsStage reports whether the thaw of what a snapshot left frozen
// waits for the stage to mount the volume again. An unmount does not end
// a freeze: the frozen filesystem lives on (the freeze holds it), pinning
// its device, and a new mount of that device is that filesystem. So while
// the staging mount is not in place, the thaw waits for the stage, if
// wanted, to mount it again, and thaws there, reaching the volume's
// filesystem; a stage withdrawn meanwhile keeps the record while the
// volume's device is still attached, so that a stage asked again thaws
// it. Only a device gone shows the freeze over (a reboot's), and the
// record is cleared.
func thawAwaitsStage(v *state.Volume, a *actual) bool {
	st := v.Stage
	if a.block || a.stageInPlace || st == nil || st.Path != v.Frozen {
		return false
	}
	return !st.Deleting || a.loop != nil
}

// diffMounts returns the actions of diff that build or tear down the
// volume's devices and mounts.
func diffMounts(v *state.Volume, a *actual) []action {
	targets := v.Targets()
	// A mount whose owner cannot be told this pass (a rename racing the
	// observation) may be the plugin's own: nothing is forgotten until the
	// next pass can tell, and nothing is published, since it may be that
	// very publish moved (a second bind on top of it would take its place
	// in the record and leave it no one's). Waiting is no failure, so it
	// backs nothing off.
	hold := len(a.unknownMounts) > 0
	acts := takeDowns(v, a, targets, hold)
	st := v.Stage
	if st == nil {
		return acts
	}
	for _, d := range a.idleExtraLoops {
		acts = append(acts, action{kind: actDetachExtra, target: d, generation: st.Generation, reason: "the image is attached more than once; this device is not mounted"})
	}
	if st.Deleting {
		return append(acts, unstageWhenFree(v, a, hold)...)
	}
	if a.stageInPlace && (a.unusable != "" || a.errorsRO) {
		return append(acts, repairStaging(v, a, targets)...)
	}
	if !stageReady(v, a) {
		return append(acts, action{kind: actStage, generation: st.Generation, reason: stageReason(v, a)})
	}
	if a.loop.AutoClear {
		acts = append(acts, action{kind: actKeepDevice, generation: st.Generation, reason: "loop device was detached from outside while in use"})
	}
	// A pod's IO limits before its bind mount: its first IO is limited.
	acts = append(acts, ioLimitSteps(v, a)...)
	acts = append(acts, publishSteps(v, a, targets, hold)...)
	// Recording comes after the publishes, so that it never delays one.
	acts = append(acts, recordMounts(v, a, targets)...)
	acts = append(acts, grow(v, a)...)
	acts = append(acts, reserve(v, a)...)
	return append(acts, spaceRanOut(v, a)...)
}

// takeDowns returns the unmounts that come before anything of the stage,
// whatever state it is in: the plugin's own mounts that moved to a path no
// record names (strays), then the publishes the kubelet withdrew, unless
// hold (a mount whose owner cannot be told this pass) keeps every
// withdrawal waiting, then the withdrawal of the raw block publishes whose
// pod the kubelet forgot (podgone.go). A stray comes first: a publish or
// stage whose recorded mount is somewhere else is not forgotten before
// that mount is gone, or nothing would know it as the plugin's any more.
func takeDowns(v *state.Volume, a *actual, targets []string, hold bool) []action {
	var acts []action
	for _, m := range a.strays {
		acts = append(acts, action{kind: actUnmountStray, target: m.path, mountID: m.id, reason: "the plugin's own mount of the volume, moved to a path no record names"})
	}
	// A withdrawn publish's pod loses the volume's IO limits before the
	// unpublish forgets which pod it was.
	acts = append(acts, ioLimitRemovals(v, a)...)
	for _, t := range targets {
		if p := v.Publishes[t]; p.Deleting && !hold {
			acts = append(acts, action{kind: actUnpublish, target: t, generation: p.Generation, reason: "publish withdrawn"})
		}
	}
	return append(acts, orphanedPublishes(v, a)...)
}

// unstageWhenFree returns the unstage of v's withdrawn stage once nothing
// holds it: no publish left in the record, no detached device still
// waiting for its last user, and no mount whose owner cannot be told
// (hold); nothing until then. A device detached while something still
// holds it open (another mount namespace, the kubelet's own loop device on
// a block volume) goes away with its last user: the plan waits for that,
// rather than detach it again and again.
func unstageWhenFree(v *state.Volume, a *actual, hold bool) []action {
	if len(v.Publishes) > 0 || a.releasePending() || hold {
		return nil
	}
	return []action{{kind: actUnstage, generation: v.Stage.Generation, reason: unstageReason(a)}}
}

// publishSteps returns, for each publish the record keeps on v's ready stage,
// the step it needs: the unmount of a target whose mount point fails, so
// that the next pass mounts it anew, or the bind mount of a target that
// does not hold it yet (none while hold keeps publishes waiting). A
// published target with a working mount needs none.
func publishSteps(v *state.Volume, a *actual, targets []string, hold bool) []action {
	var acts []action
	for _, t := range targets {
		p := v.Publishes[t]
		if msg := a.unusableTargets[t]; msg != "" && !p.Deleting {
			acts = append(acts, action{kind: actUnmountTarget, target: t, generation: p.Generation, reason: "target mount is corrupted: " + msg})
			continue
		}
		if !p.Deleting && !a.published(t) && !hold {
			reason := "target not mounted"
			if a.targets[t] != nil {
				reason = "target holds another mount"
			}
			acts = append(acts, action{kind: actPublish, target: t, generation: p.Generation, reason: reason})
		}
	}
	return acts
}

// spaceRanOut returns the step that records a full data directory under a
// staged filesystem whose image has holes: writes to them fail (ENOSPC at
// fsync), and a filesystem may lose metadata writes and find out later, so
// the volume is reported until its filesystem is mounted again, after a
// check, even once there is room again.
func spaceRanOut(v *state.Volume, a *actual) []action {
	st := v.Stage
	id := a.mountIDs[st.Path]
	if a.static || a.block || id == 0 || id != st.MountID || id == st.SpaceRanOutUnder || !a.poolFull() || a.holes() == 0 {
		return nil
	}
	return []action{{kind: actRecordSpaceRanOut, mountID: id, generation: st.Generation,
		reason: fmt.Sprintf("the storage pool is full (%d bytes free) and %d bytes of the image are not allocated", a.pool.Free, a.holes())}}
}

// reserve returns the step that keeps a staged volume's space as its
// provisioning says: a thin volume's device passes discards, so that the
// space its filesystem frees goes back to the data directory; any other
// volume's device refuses them, and its image's holes (of a volume made
// sparse before provisioning was recorded, or punched while its device
// passed discards) are filled once the data directory has room for them.
func reserve(v *state.Volume, a *actual) []action {
	if a.static {
		return nil
	}
	gen := v.Stage.Generation
	switch h := a.holes(); {
	case a.loop.Discards && !v.Thin():
		return []action{{kind: actSetDiscards, generation: gen, reason: "the device of a thick volume passes discards, which punch holes in its image"}}
	case !a.loop.Discards && v.Thin():
		return []action{{kind: actSetDiscards, generation: gen, reason: "the device of a thin volume refuses discards, which would give space back"}}
	case v.Thin():
		return nil
	case h > 0 && a.pool.Known && h <= a.pool.Free:
		return []action{{kind: actReserve, generation: gen, reason: fmt.Sprintf("%d bytes of the image are not allocated", h)}}
	}
	return nil
}

// recordMounts returns the steps that record the unique IDs of the
// volume's mounts at the paths its record names, where only the plugin
// mounts: after it made them, and after a restart for mounts made before
// the record kept IDs.
func recordMounts(v *state.Volume, a *actual, targets []string) []action {
	var acts []action
	st := v.Stage
	if id := a.mountIDs[st.Path]; id != 0 && id != st.MountID {
		acts = append(acts, action{kind: actRecordMount, mountID: id, generation: st.Generation, reason: "staging mount not recorded"})
	}
	for _, t := range targets {
		p := v.Publishes[t]
		if id := a.mountIDs[t]; id != 0 && id != p.MountID && !p.Deleting && a.published(t) {
			acts = append(acts, action{kind: actRecordMount, target: t, mountID: id, generation: p.Generation, reason: "target mount not recorded"})
		}
	}
	return acts
}

// grow returns the step that brings a ready stage to the size its expansion
// asks for: first the image, then the device, then the filesystem (not for
// a read-only stage, which cannot be resized online). A device smaller than
// its image, or a filesystem smaller than its device, is grown whether or
// not an expansion asks for it (an expansion interrupted by a restart).
func grow(v *state.Volume, a *actual) []action {
	var gen int64
	if v.Expand != nil {
		gen = v.Expand.Generation
	}
	l := a.loop
	switch {
	case v.Expand != nil && !a.static && l.BackingSize < v.Expand.Bytes:
		return []action{{kind: actGrowImage, generation: gen, reason: fmt.Sprintf("expansion asks for %d bytes, image is %d", v.Expand.Bytes, l.BackingSize)}}
	case l.Size < l.BackingSize:
		return []action{{kind: actGrowDevice, generation: gen, reason: fmt.Sprintf("image is %d bytes, device %d", l.BackingSize, l.Size)}}
	case v.Stage.Access == state.AccessMount && !v.Stage.MountsReadOnly() && !a.errorsRO && v.FsSize < l.Size:
		reason := fmt.Sprintf("device is %d bytes, filesystem last grown to %d", l.Size, v.FsSize)
		if unused(v, a) && a.stagingMount.FsType == host.FsExt4 {
			return []action{{kind: actGrowFsOffline, generation: gen, reason: reason + "; ext4 that nothing uses grows unmounted"}}
		}
		return []action{{kind: actGrowFs, generation: gen, reason: reason}}
	}
	return nil
}

// unused reports whether nothing but the staging mount holds v's staged
// filesystem: no publish desired or mounted, no mount of anyone else's and
// none whose owner is unknown. The staging mount may then come and go (the
// kubelet's next publish waits for it).
func unused(v *state.Volume, a *actual) bool {
	return a.stageInPlace && len(v.Publishes) == 0 && len(a.foreignMounts) == 0 && len(a.unknownMounts) == 0 && len(a.strays) == 0
}

// expandReady reports whether v's expansion is fulfilled: the device and
// (for a filesystem) the filesystem reached the size asked for.
func expandReady(v *state.Volume, a *actual) bool {
	e := v.Expand
	if e == nil || !stageReady(v, a) || a.loop.Size < e.Bytes {
		return false
	}
	return v.Stage.Access == state.AccessBlock || v.Stage.MountsReadOnly() || v.FsSize >= e.Bytes
}

// repairStaging returns the steps that take down a staged filesystem that
// is unusable or went read-only after errors, so that the stage mounts it
// again (with fsck). A shut-down or corrupted filesystem is dead under every
// mount: its bind mounts go first, then the staging mount. A filesystem that
// only went read-only still serves reads, so it is taken down only once no
// bind mount of it is left. Foreign mounts hold the superblock, and a new
// mount would get the same broken one, so they stop the repair (reported).
func repairStaging(v *state.Volume, a *actual, targets []string) []action {
	st := v.Stage
	if a.unusable != "" {
		var acts []action
		for _, t := range targets {
			if !v.Publishes[t].Deleting && a.published(t) {
				acts = append(acts, action{kind: actUnmountTarget, target: t, generation: v.Publishes[t].Generation, reason: a.unusable})
			}
		}
		if len(acts) > 0 || len(a.foreignMounts) > 0 {
			return acts
		}
		return []action{{kind: actUnmountStaging, generation: st.Generation, reason: a.unusable}}
	}
	if a.anyPublished(v) || len(a.foreignMounts) > 0 {
		return nil
	}
	return []action{{kind: actUnmountStaging, generation: st.Generation, reason: "the filesystem went read-only after errors; remounting it after fsck"}}
}

func stageReason(v *state.Volume, a *actual) string {
	switch {
	case a.loop == nil:
		return "device not attached"
	case a.stagingMount == nil:
		return "staging path not mounted"
	case !a.stageInPlace:
		return "staging path holds another mount"
	case v.Formatted == "":
		return "filesystem provenance not recorded"
	}
	return ""
}

func unstageReason(a *actual) string {
	switch {
	case a.stageInPlace && !a.block:
		return "staging mount present"
	case a.loop != nil && !a.static:
		return "device attached"
	}
	return "verified gone"
}

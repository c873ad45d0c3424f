package reconciler

import (
	"fmt"

	"github.com/converge-csi/converge/pkg/state"
)

// actionKind is what an operation does.
type actionKind int

const (
	actUnpublish actionKind = iota
	actUnstage
	actStage
	actPublish
	// actRelease unmounts and detaches a loop device of the data directory
	// that no stage intent references.
	actRelease
)

var actionNames = [...]string{"unpublish", "unstage", "stage", "publish", "release orphan"}

func (k actionKind) String() string { return actionNames[k] }

// teardown reports whether the kind removes something.
func (k actionKind) teardown() bool { return k == actUnpublish || k == actUnstage || k == actRelease }

// action is one step toward the desired state of a volume.
type action struct {
	kind actionKind
	// target is the publish target path (publish and unpublish only).
	target string
	// generation is the generation of the intent the action serves.
	generation int64
	// reason says why the diff chose the action, for the logs.
	reason string
}

// key returns the intent the action serves.
func (a action) key() state.IntentKey {
	if a.kind == actStage || a.kind == actUnstage || a.kind == actRelease {
		return state.StageKey
	}
	return state.PublishKey(a.target)
}

// slow reports whether the action may take long (mkfs, fsck) and so runs in
// the slow pool.
func (a action) slow() bool { return a.kind == actStage }

func (a action) String() string {
	if a.target != "" {
		return fmt.Sprintf("%s %s", a.kind, a.target)
	}
	return a.kind.String()
}

// actual is the observed state of one volume, derived from a snapshot.
type actual struct {
	// loop is the loop device attached to the volume's image, if any.
	loop *state.Loop
	// extraLoops names further devices attached to the same image, which
	// only someone else can have made.
	extraLoops []string
	// stagingMount is the top mount at the staging path, if any.
	stagingMount *state.Mount
	// staged is true when stagingMount is the volume's filesystem.
	staged bool
	// targets maps each recorded target path to its top mount, if any.
	targets map[string]*state.Mount
	// foreignMounts lists mounts of the volume's device at paths the record
	// does not name.
	foreignMounts []string
}

// published reports whether target holds a bind mount of the volume.
func (a *actual) published(target string) bool {
	m := a.targets[target]
	return m != nil && a.loop != nil && m.Dev == a.loop.Dev && m.Root == "/"
}

// observeVolume derives v's actual state from snap. image is the volume's
// backing file.
func observeVolume(v *state.Volume, image string, snap *state.Snapshot) *actual {
	a := &actual{targets: make(map[string]*state.Mount, len(v.Publishes))}
	if ls := snap.LoopsFor(image); len(ls) > 0 {
		a.loop = &ls[0]
		for _, l := range ls[1:] {
			a.extraLoops = append(a.extraLoops, l.Device)
		}
	}
	if v.Stage != nil {
		if m, ok := snap.MountAt(v.Stage.Path); ok {
			a.stagingMount = &m
			a.staged = a.loop != nil && m.Dev == a.loop.Dev && m.Root == "/"
		}
	}
	for target := range v.Publishes {
		if m, ok := snap.MountAt(target); ok {
			a.targets[target] = &m
		}
	}
	if a.loop != nil {
		for _, m := range snap.MountsOf(a.loop.Dev) {
			if v.Stage != nil && m.Path == v.Stage.Path {
				continue
			}
			if _, ok := v.Publishes[m.Path]; ok {
				continue
			}
			a.foreignMounts = append(a.foreignMounts, m.Path)
		}
	}
	return a
}

// stageReady reports whether v's stage is fulfilled.
func stageReady(v *state.Volume, a *actual) bool {
	return v.Stage != nil && !v.Stage.Deleting && a.staged && v.Formatted != ""
}

// diff compares v with its actual state and returns the actions that lead to
// the desired state, in the order they must run: withdrawn publishes, then a
// withdrawn stage (only once no publish is left), then the stage, then the
// publishes (only on top of a ready stage). An empty result means converged.
func diff(v *state.Volume, a *actual) []action {
	var acts []action
	targets := v.Targets()
	for _, t := range targets {
		if p := v.Publishes[t]; p.Deleting {
			acts = append(acts, action{kind: actUnpublish, target: t, generation: p.Generation, reason: "publish withdrawn"})
		}
	}
	st := v.Stage
	if st == nil {
		return acts
	}
	if st.Deleting {
		if len(v.Publishes) == 0 {
			acts = append(acts, action{kind: actUnstage, generation: st.Generation, reason: unstageReason(a)})
		}
		return acts
	}
	if !stageReady(v, a) {
		return append(acts, action{kind: actStage, generation: st.Generation, reason: stageReason(v, a)})
	}
	for _, t := range targets {
		if p := v.Publishes[t]; !p.Deleting && !a.published(t) {
			reason := "target not mounted"
			if a.targets[t] != nil {
				reason = "target holds another mount"
			}
			acts = append(acts, action{kind: actPublish, target: t, generation: p.Generation, reason: reason})
		}
	}
	return acts
}

func stageReason(v *state.Volume, a *actual) string {
	switch {
	case a.loop == nil:
		return "device not attached"
	case a.stagingMount == nil:
		return "staging path not mounted"
	case !a.staged:
		return "staging path holds another mount"
	case v.Formatted == "":
		return "filesystem provenance not recorded"
	}
	return ""
}

func unstageReason(a *actual) string {
	switch {
	case a.staged:
		return "staging mount present"
	case a.loop != nil:
		return "device attached"
	}
	return "verified gone"
}

// orphans returns, for every loop device attached to an image of the data
// directory whose volume has no stage recorded, the actual state to
// release. The write-ahead rule (a stage is forgotten only once its device is
// verified detached) makes every such device a leftover: of a crash before
// the record was written, of a lost store, or of someone else's losetup.
func orphans(snap *state.Snapshot, images Images, staged map[string]bool) map[string]*actual {
	out := map[string]*actual{}
	for _, l := range snap.Loops() {
		id, ok := images.IDOf(l.BackingFile)
		if !ok || staged[id] {
			continue
		}
		if _, seen := out[id]; seen {
			continue // one device of an image at a time
		}
		a := &actual{loop: &l}
		for _, m := range snap.MountsOf(l.Dev) {
			a.foreignMounts = append(a.foreignMounts, m.Path)
		}
		out[id] = a
	}
	return out
}

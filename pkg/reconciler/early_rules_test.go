package reconciler

import (
	"errors"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/state"
)

// The rules that span volumes, which an early start keeps beside the
// passes (early.go), one test each at least; TestEarlyStartAndPassNeverOverlap
// runs them all at once.

// wantKick fails the test unless a pass was asked for (and takes the ask).
func (h *harness) wantKick(what string) {
	h.t.Helper()
	select {
	case <-h.r.kick:
	default:
		h.t.Errorf("%s asked for no pass", what)
	}
}

// count returns how many calls named call were made.
func (h *harness) count(call string) int {
	n := 0
	for _, c := range h.world.Calls() {
		if c == call {
			n++
		}
	}
	return n
}

// heldPublish starts the early start, stages volume id and asks for its
// publish, whose bind mount waits until release is closed.
func (h *harness) heldPublish(id string) (target string, release chan struct{}) {
	h.t.Helper()
	h.startEarly()
	staging := h.staged(id)
	_, target = h.volume(id)
	release = make(chan struct{})
	h.world.holdOn("bind "+target, release)
	h.update(id, func(v *state.Volume) { _ = v.RequestPublish(staging, target, publishSpec()) })
	return target, release
}

// TestPassWaitsForAnEarlyStartedOperation holds "one operation per
// volume" from the pass's side (TestEarlyStartWaitsForItsVolume holds it
// from the early start's): while a publish an early start began runs, a
// pass that plans the same publish starts nothing on the volume.
func TestPassWaitsForAnEarlyStartedOperation(t *testing.T) {
	h := newHarness(t)
	target, release := h.heldPublish("v")
	go h.r.Start("v")
	waitFor(t, h.world.started, "bind "+target)
	if n, err := h.r.Pass(t.Context()); err != nil || n != 0 {
		t.Errorf("a pass beside an early-started publish started %d operations (%v), want none", n, err)
	}
	close(release)
	h.r.wait()
	if got := h.count("bind " + target); got != 1 {
		t.Errorf("bind mounts of %s: got %d, want 1", target, got)
	}
}

// TestEarlyStartLooksAgainAfterAnOperationEndsDuringItsObservation holds
// "no decision on an observation older than what it decides about": a
// publish ends while the early start observes its volume (the observation
// shows no bind mount yet); the early start must look again, not bind a
// second time.
func TestEarlyStartLooksAgainAfterAnOperationEndsDuringItsObservation(t *testing.T) {
	h := newHarness(t)
	target, release := h.heldPublish("v")
	if n, _ := h.r.Pass(t.Context()); n != 1 {
		t.Fatalf("pass started %d operations, want the publish", n)
	}
	waitFor(t, h.world.started, "bind "+target)
	h.world.afterObserve = func() {
		// The early start has seen no bind mount; now the publish ends.
		h.world.afterObserve = nil
		close(release)
		h.r.wait()
	}
	h.r.Start("v")
	h.r.wait()
	if got := h.count("bind " + target); got != 1 {
		t.Errorf("bind mounts of %s: got %d, want 1 (an early start acted on a stale observation)", target, got)
	}
}

// TestOrphanedDeviceIsReleasedOnlyByAPass holds "an orphaned device is
// released only by a pass": an early start of the volume releases
// nothing, and a pass releases it only through the volume's claim, taken
// with its observation's epoch, so that an operation of the volume that
// holds it, or ended after that observation (a stage that adopted the
// device), keeps it.
func TestOrphanedDeviceIsReleasedOnlyByAPass(t *testing.T) {
	h := newHarness(t)
	h.startEarly()
	image := h.world.Path("a")
	if _, err := h.world.Attach(image, false); err != nil {
		t.Fatal(err)
	}
	attached := func() bool { _, ok := h.world.loop(image); return ok }
	h.update("a", func(v *state.Volume) { v.Formatted = "ext4" }) // a record, and no stage
	h.r.Start("a")
	h.r.wait()
	if !attached() {
		t.Fatal("an early start released the orphaned device")
	}
	// An operation of a (as a stage that adopts the device) holds it, or
	// ended, after the pass's observation.
	var held func()
	for _, tc := range []struct {
		name   string
		during func()
	}{
		{"an operation holds the volume", func() {
			c, _ := h.r.claims.Try(h.r.claims.Epoch(), "a")
			held = c.Release
		}},
		{"an operation ended after the observation", func() {
			c, _ := h.r.claims.Try(h.r.claims.Epoch(), "a")
			c.Release()
		}},
	} {
		h.world.afterObserve = func() { h.world.afterObserve = nil; tc.during() }
		if n, _ := h.r.Pass(t.Context()); n != 0 || !attached() {
			t.Errorf("%s: the pass started %d operations, device attached %v; want none, attached", tc.name, n, attached())
		}
		if held != nil {
			held()
			held = nil
		}
		h.r.wait()
	}
	// A pass that observed after those operations releases it.
	if n, _ := h.r.Pass(t.Context()); n != 1 {
		t.Errorf("a pass with the volume free started %d operations, want its release", n)
	}
	h.r.wait()
	if attached() {
		t.Error("the orphaned device is still attached after a pass with the volume free")
	}
}

// TestEarlyStartTearsDownPublishesBeforeTheStage holds "a volume's
// publishes torn down before its stage" for early starts (the stage
// before its publishes: TestEarlyStartLeavesTheStageToThePass, where a
// publish asked on a lost stage binds nothing): the unpublish and the
// unstage asked in one record, as a restart finds them, each early start
// takes the next step in that order.
func TestEarlyStartTearsDownPublishesBeforeTheStage(t *testing.T) {
	h := newHarness(t)
	h.startEarly()
	staging, target := h.stagedAndPublished("v")
	n := len(h.world.Calls())
	h.update("v", func(v *state.Volume) {
		_ = v.RequestUnpublish(target)
		if err := v.RequestUnstage(staging); err != nil {
			t.Fatal(err)
		}
	})
	for range 2 { // the unpublish's request, then the unstage's
		h.r.Start("v")
		h.r.wait()
	}
	got := h.callsSince(n)
	unpublish, unstage := strings.Index(got, "unmount "+target), strings.Index(got, "unmount "+staging)
	if unpublish < 0 || unstage < 0 || unstage < unpublish {
		t.Errorf("calls of two early starts: got %s, want the target unmounted, then the staging mount", got)
	}
}

// TestEarlyStartLeavesAGroupSnapshotToThePass holds "a group snapshot
// starts only from a pass": an early start of its leader freezes and
// copies nothing and asks for a pass.
func TestEarlyStartLeavesAGroupSnapshotToThePass(t *testing.T) {
	h := newHarness(t)
	h.startEarly()
	h.staged("a")
	h.staged("b")
	h.askGroup("g", "a", "b")
	rec := &countingRecorder{ops: map[string]int{}}
	h.r.cfg.Recorder = rec
	n := len(h.world.Calls())
	h.r.Start("a")
	h.r.wait()
	if got := h.callsSince(n); got != "" {
		t.Errorf("an early start of the group's leader called %s; want nothing", got)
	}
	h.wantKick("the early start of a group's leader")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ops) != 0 || rec.early[EarlyLeftToPass] != 1 {
		t.Errorf("the early start of the group's leader ran %v, did %v; want nothing run, left to the pass", rec.ops, rec.early)
	}
}

// TestEarlyStartOfAMemberWaitsForItsGroup holds "a group snapshot waits
// for its members' own work" from the other side: while the group holds
// its member b, b's early start starts nothing, and the group's end
// starts b's step, with no pass.
func TestEarlyStartOfAMemberWaitsForItsGroup(t *testing.T) {
	h := newHarness(t)
	h.startEarly()
	h.staged("a")
	sb := h.staged("b")
	_, tb := h.volume("b")
	copied := make(chan struct{})
	h.world.holdOn("snapshot g-a", copied)
	h.askGroup("g", "a", "b")
	if n, err := h.r.Pass(t.Context()); err != nil || n != 1 {
		t.Fatalf("pass: %d operations started (%v), want the group", n, err)
	}
	waitFor(t, h.world.started, "snapshot g-a")
	h.update("b", func(v *state.Volume) { _ = v.RequestPublish(sb, tb, publishSpec()) })
	h.r.Start("b")
	if _, ok := h.world.topMount(tb); ok {
		t.Error("b was published while the group held it")
	}
	close(copied)
	h.eventually("b published after the group, with no pass", func() bool {
		_, ok := h.world.topMount(tb)
		return ok
	})
}

// withdrawnBlockStage starts the early start, stages volume id as a raw
// block device (attached, nothing mounted: its unstage is the detach
// alone), settles, and withdraws the stage; its record then holds nothing
// else, so the unstage's end deletes it.
func (h *harness) withdrawnBlockStage(id string) {
	h.t.Helper()
	h.startEarly()
	staging, _ := h.volume(id)
	h.update(id, func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Stage.Access = state.AccessBlock
	})
	h.runUntilIdle()
	if _, ok := h.world.loop(h.world.Path(id)); !ok {
		h.t.Fatal("the raw block stage attached no device")
	}
	h.update(id, func(v *state.Volume) { v.Stage.Deleting = true })
}

// TestEarlyStartIgnoresAReleaseThePassForgot holds "no decision on an
// observation older than an operation that ended" when a pass forgot that
// operation's release: an unstage ends while the early start observes its
// volume (the observation still shows the device), its end deletes the
// volume's record, and a whole pass runs, which no longer records the
// volume and forgets its release. The early start must still find its
// observation stale, not detach a second time.
func TestEarlyStartIgnoresAReleaseThePassForgot(t *testing.T) {
	h := newHarness(t)
	h.withdrawnBlockStage("v")
	release := make(chan struct{})
	h.world.holdOn("detach", release)
	if n, err := h.r.Pass(t.Context()); err != nil || n != 1 {
		t.Fatalf("pass started %d operations (%v), want the unstage", n, err)
	}
	waitFor(t, h.world.started, "detach")
	observed := 0
	h.world.afterObserve = func() {
		// The early start has seen the device attached; now the unstage
		// ends, the record goes, and a pass forgets the release.
		h.world.afterObserve = nil
		close(release)
		h.r.wait()
		if _, err := h.store.Get("v"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("record of v after its unstage: %v, want it deleted", err)
		}
		if n, err := h.r.Pass(t.Context()); err != nil || n != 0 {
			t.Errorf("a pass after the unstage started %d operations (%v), want none", n, err)
		}
		h.r.wait()
		observed++
	}
	h.r.Start("v")
	h.r.wait()
	if observed != 1 {
		t.Fatalf("the early start observed %d times during the unstage, want 1", observed)
	}
	if got := h.count("detach"); got != 1 {
		t.Errorf("detaches of v: got %d, want 1 (an early start acted on an observation older than the unstage's end)", got)
	}
}

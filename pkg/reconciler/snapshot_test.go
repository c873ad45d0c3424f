package reconciler

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// askSnapshot records the intent of snapshot id of volume vol and returns
// its generation.
func (h *harness) askSnapshot(vol, id string) int64 {
	h.t.Helper()
	v := h.update(vol, func(v *state.Volume) {
		if v.Snapshots == nil {
			v.Snapshots = map[string]*state.SnapshotIntent{}
		}
		v.Snapshots[id] = &state.SnapshotIntent{}
	})
	return v.Snapshots[id].Generation
}

// wantSnapshotDone fails unless snapshot id of vol was taken (frozen as
// wantFrozen says), its intent forgotten, and nothing is left frozen or
// marked frozen.
func (h *harness) wantSnapshotDone(vol, id string, wantFrozen bool) {
	h.t.Helper()
	got, ok := h.world.snapshotOf(id)
	if !ok || got.image != h.world.Path(vol) || got.frozen != wantFrozen {
		h.t.Errorf("snapshot %s: got %+v (taken %v), want a copy of %s taken frozen %v", id, got, ok, h.world.Path(vol), wantFrozen)
	}
	v, err := h.store.Get(vol)
	if errors.Is(err, state.ErrNotFound) {
		v, err = &state.Volume{ID: vol}, nil // nothing else was recorded
	}
	if err != nil {
		h.t.Fatal(err)
	}
	if v.Snapshots != nil || v.Frozen != "" {
		h.t.Errorf("record after the snapshot: intents %v, frozen %q; want neither", v.Snapshots, v.Frozen)
	}
	if frozen := h.world.frozenImages(); len(frozen) != 0 {
		h.t.Errorf("frozen after the snapshot: %v", frozen)
	}
}

// wantSnapshotAccess fails unless snapshot id records that its volume's
// data was written as want.
func (h *harness) wantSnapshotAccess(id string, want state.AccessType) {
	h.t.Helper()
	if got, _ := h.world.snapshotOf(id); got.of.Access != string(want) {
		h.t.Errorf("snapshot %s records its volume written as %q, want %q", id, got.of.Access, want)
	}
}

// TestSnapshotFreezesAStagedFilesystem takes snapshots of a volume that is
// staged and published, of one only created, and of a raw block volume:
// only the staged filesystem is frozen, for the copy alone. Each snapshot
// records how its volume was written (Volume.WrittenAs): the filesystem
// the plugin formatted as mount; the volume the plugin never formatted,
// whose record predates the access it was made for, and the raw block
// volume as block.
func TestSnapshotFreezesAStagedFilesystem(t *testing.T) {
	t.Run("staged", func(t *testing.T) {
		h := newHarness(t)
		staging, _ := h.stagedAndPublished("v1")
		n := len(h.world.Calls())
		h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if got, want := h.callsSince(n), fmt.Sprintf("sync %[1]s,flush v1.img,freeze %[1]s,snapshot s1,thaw %[1]s", staging); got != want {
			t.Errorf("calls: got %s, want %s", got, want)
		}
		h.wantSnapshotDone("v1", "s1", true)
		h.wantSnapshotAccess("s1", state.AccessMount)
	})
	t.Run("not staged", func(t *testing.T) {
		h := newHarness(t)
		h.volume("v1")
		h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if got := h.callsSince(0); got != "snapshot s1" {
			t.Errorf("calls: got %s, want snapshot s1", got)
		}
		h.wantSnapshotDone("v1", "s1", false)
		h.wantSnapshotAccess("s1", state.AccessBlock)
	})
	t.Run("raw block", func(t *testing.T) {
		h := newHarness(t)
		staging, _ := h.volume("v1")
		h.update("v1", func(v *state.Volume) {
			v.Stage = stageSpec(staging)
			v.Stage.Access = state.AccessBlock
		})
		h.runUntilIdle()
		n := len(h.world.Calls())
		h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if got := h.callsSince(n); got != "snapshot s1" {
			t.Errorf("calls: got %s, want snapshot s1", got)
		}
		h.wantSnapshotDone("v1", "s1", false)
		h.wantSnapshotAccess("s1", state.AccessBlock)
	})
}

// TestSnapshotFailures checks that a failed copy thaws the filesystem and
// is retried; that a copy that can never succeed (no image) withdraws the
// intent with its final; that a freeze someone else holds is waited out,
// never thawed by the plugin; and that a snapshot taken before a crash
// let its intent be forgotten is not taken again.
func TestSnapshotFailures(t *testing.T) {
	t.Run("copy fails, then succeeds", func(t *testing.T) {
		h := newHarness(t)
		h.staged("v1")
		h.world.failOn("snapshot s1", errors.New("EIO"))
		h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if frozen := h.world.frozenImages(); len(frozen) != 0 {
			t.Errorf("frozen after a failed copy: %v", frozen)
		}
		if r, _ := h.store.Result("v1", state.SnapshotKey("s1")); r.Err == nil || r.Attempts != 1 {
			t.Errorf("result after a failed copy: got %+v, want the failure reported", r)
		}
		h.world.failOn("snapshot s1", nil)
		h.clock.Step(DefaultBackoffInitial)
		h.runUntilIdle()
		h.wantSnapshotDone("v1", "s1", true)
	})
	t.Run("no image", func(t *testing.T) {
		h := newHarness(t)
		gen := h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if f := h.store.TerminalFailureFor("v1", state.SnapshotKey("s1"), gen); f == nil || f.Kind != classified.KindNotFound {
			t.Errorf("final: got %v, want NOT_FOUND", f)
		}
		if v, err := h.store.Get("v1"); err == nil && v.Snapshots != nil {
			t.Errorf("intent kept after a final: %+v", v.Snapshots)
		}
	})
	t.Run("frozen by someone else", func(t *testing.T) {
		h := newHarness(t)
		staging := h.staged("v1")
		if err := h.world.Freeze(staging); err != nil {
			t.Fatal(err)
		}
		n := len(h.world.Calls())
		h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if got, want := h.callsSince(n), "sync "+staging+",flush v1.img,freeze "+staging; got != want {
			t.Errorf("calls under someone else's freeze: got %s, want %s (nothing thawed, nothing copied)", got, want)
		}
		if !slices.Contains(h.world.frozenImages(), h.world.Path("v1")) {
			t.Error("the plugin thawed someone else's freeze")
		}
		if v, _ := h.store.Get("v1"); v.Frozen != "" {
			t.Errorf("record marks the filesystem frozen by the plugin: %q", v.Frozen)
		}
		if err := h.world.Thaw(staging); err != nil {
			t.Fatal(err)
		}
		h.clock.Step(DefaultBackoffInitial)
		h.runUntilIdle()
		h.wantSnapshotDone("v1", "s1", true)
	})
	t.Run("thaw fails", func(t *testing.T) {
		// A failed thaw ends the step as it is, whatever the copy
		// answered: here a copy that, thawed, would withdraw the intent
		// (no image) is retried, the record keeps the freeze, and the
		// next pass thaws the filesystem before the snapshot is taken.
		h := newHarness(t)
		staging := h.staged("v1")
		h.world.failOn("snapshot s1", fmt.Errorf("v1.img: %w", os.ErrNotExist))
		h.world.failOn("thaw "+staging, errors.New("EIO"))
		gen := h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if f := h.store.TerminalFailureFor("v1", state.SnapshotKey("s1"), gen); f != nil {
			t.Errorf("final after a failed thaw: got %v, want the step retried", f)
		}
		if v, _ := h.store.Get("v1"); v.Frozen != staging || v.Snapshots["s1"] == nil {
			t.Errorf("record after a failed thaw: frozen %q, intents %v; want frozen %q and the intent kept", v.Frozen, v.Snapshots, staging)
		}
		h.world.failOn("snapshot s1", nil)
		h.world.failOn("thaw "+staging, nil)
		h.clock.Step(DefaultBackoffInitial)
		h.runUntilIdle()
		h.wantSnapshotDone("v1", "s1", true)
	})
	t.Run("taken before a crash", func(t *testing.T) {
		h := newHarness(t)
		h.volume("v1")
		h.world.addSnapshot("s1", h.world.Path("v1"))
		h.askSnapshot("v1", "s1")
		h.runUntilIdle()
		if got := h.callsSince(0); got != "" {
			t.Errorf("calls: got %s, want none", got)
		}
		h.wantSnapshotDone("v1", "s1", false)
	})
}

// TestFrozenByACrashIsThawed starts from what a crash between a freeze and
// its thaw leaves (the filesystem frozen, the record saying so): the first
// pass thaws it before anything else, and clears the record.
func TestFrozenByACrashIsThawed(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.stagedAndPublished("v1")
	if err := h.world.Freeze(staging); err != nil {
		t.Fatal(err)
	}
	h.update("v1", func(v *state.Volume) { v.Frozen = staging })
	n := len(h.world.Calls())
	h.runUntilIdle()
	if got, want := h.callsSince(n), "thaw "+staging; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
	if v, _ := h.store.Get("v1"); v.Frozen != "" || len(h.world.frozenImages()) != 0 {
		t.Errorf("after the pass: record frozen %q, world frozen %v; want neither", v.Frozen, h.world.frozenImages())
	}
}

// frozenAndUnmounted stages and publishes volume id, then leaves what a
// crash between a freeze and its thaw leaves (the filesystem frozen, the
// record saying so), and unmounts the volume's mounts from outside.
func (h *harness) frozenAndUnmounted(id string) (staging, target string) {
	h.t.Helper()
	staging, target = h.stagedAndPublished(id)
	if err := h.world.Freeze(staging); err != nil {
		h.t.Fatal(err)
	}
	h.update(id, func(v *state.Volume) { v.Frozen = staging })
	h.world.unmountAll()
	return staging, target
}

// TestFrozenAndUnmountedIsThawedOnceStagedAgain starts from a crash between
// a freeze and its thaw, after which someone unmounted the volume's
// mounts (a soak's reboot, lazily): an unmount does not end a freeze, and
// the filesystem lives on, frozen, on its device, which the next stage
// mounts again. The thaw waits for that stage and thaws there; cleared
// while nothing was mounted, it left the volume's writes blocked for good
// (soak seed 6588253597532072024).
func TestFrozenAndUnmountedIsThawedOnceStagedAgain(t *testing.T) {
	h := newHarness(t)
	staging, target := h.frozenAndUnmounted("v1")
	n := len(h.world.Calls())
	h.runUntilIdle()
	if v, _ := h.store.Get("v1"); v.Frozen != "" || len(h.world.frozenImages()) != 0 {
		t.Errorf("after the passes: record frozen %q, world frozen %v; want neither", v.Frozen, h.world.frozenImages())
	}
	// Nothing binds the pod to the filesystem before it is thawed: its
	// writes would block.
	calls := h.world.Calls()[n:]
	mount, thaw, bind := slices.Index(calls, "mount "+staging), slices.Index(calls, "thaw "+staging), slices.Index(calls, "bind "+target)
	if mount < 0 || thaw < mount || bind < thaw {
		t.Errorf("calls %v: want the stage's mount, then the thaw, then the bind", calls)
	}
}

// TestFrozenAndWithdrawnIsThawedWhenStagedAgain: as above, but the stage
// is withdrawn before the volume is staged again (its pod deleted while the
// node was down, then another started there). The frozen filesystem holds
// the volume's device, so the record of the freeze is kept while the stage
// is withdrawn; cleared then, the stage asked again mounted the frozen
// filesystem with nothing left to thaw it.
func TestFrozenAndWithdrawnIsThawedWhenStagedAgain(t *testing.T) {
	h := newHarness(t)
	staging, target := h.frozenAndUnmounted("v1")
	h.world.detachInUse(h.world.Path("v1"))
	h.request("v1", func(v *state.Volume) error { return v.RequestUnpublish(target) })
	h.request("v1", func(v *state.Volume) error { return v.RequestUnstage(staging) })
	for range 5 {
		h.pass()
	}
	if v, _ := h.store.Get("v1"); v.Frozen != staging {
		t.Errorf("while withdrawn, the device held by the frozen filesystem: record frozen %q, want %q", v.Frozen, staging)
	}
	h.request("v1", func(v *state.Volume) error { return v.RequestStage(stageSpec(staging)) })
	h.runUntilIdle()
	if v, _ := h.store.Get("v1"); v.Frozen != "" || len(h.world.frozenImages()) != 0 {
		t.Errorf("staged again: record frozen %q, world frozen %v; want neither", v.Frozen, h.world.frozenImages())
	}
}

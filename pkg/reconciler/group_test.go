package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// askGroup records, on the record of its leader (the first of vols), the
// intent of group snapshot id of vols, each member's snapshot named
// <id>-<volume>, and returns its generation.
func (h *harness) askGroup(id string, vols ...string) int64 {
	h.t.Helper()
	g := &state.GroupIntent{ID: id, Members: map[string]string{}}
	for _, v := range vols {
		g.Members[v] = id + "-" + v
	}
	leader := g.VolumeIDs()[0]
	v := h.update(leader, func(v *state.Volume) {
		if v.Snapshots == nil {
			v.Snapshots = map[string]*state.SnapshotIntent{}
		}
		v.Snapshots[g.Members[leader]] = &state.SnapshotIntent{Group: g}
	})
	return v.Snapshots[g.Members[leader]].Generation
}

// TestGroupFreezesEveryMemberBeforeTheFirstCopy takes a group snapshot of
// three volumes, two staged and one only created: both staged filesystems
// are written out, then frozen in volume ID order (nothing but the freezes
// between them), copied, and thawed in reverse order; the member nothing
// writes is copied after the thaw. Every member records its group, and the
// intent is forgotten.
func TestGroupFreezesEveryMemberBeforeTheFirstCopy(t *testing.T) {
	h := newHarness(t)
	sb, _ := h.stagedAndPublished("b")
	sa := h.staged("a")
	h.volume("c")
	n := len(h.world.Calls())
	h.askGroup("g", "c", "b", "a")
	h.runUntilIdle()
	want := strings.Join([]string{
		"sync " + sa, "flush a.img", "sync " + sb, "flush b.img",
		"freeze " + sa, "freeze " + sb,
		"snapshot g-a", "snapshot g-b",
		"thaw " + sb, "thaw " + sa,
		"snapshot g-c",
	}, ",")
	if got := h.callsSince(n); got != want {
		t.Errorf("calls:\n got %s\nwant %s", got, want)
	}
	for _, m := range []struct {
		vol    string
		frozen bool
	}{{"a", true}, {"b", true}, {"c", false}} {
		got, ok := h.world.snapshotOf("g-" + m.vol)
		if !ok || got.image != h.world.Path(m.vol) || got.frozen != m.frozen || got.of.Group != "g" {
			t.Errorf("snapshot g-%s: got %+v (taken %v), want a copy of %s, frozen %v, in group g", m.vol, got, ok, m.vol, m.frozen)
		}
	}
	for _, vol := range []string{"a", "b"} {
		if v, _ := h.store.Get(vol); v.Snapshots != nil || v.Frozen != "" {
			t.Errorf("record of %s after the group: intents %v, frozen %q; want neither", vol, v.Snapshots, v.Frozen)
		}
	}
	if frozen := h.world.frozenImages(); len(frozen) != 0 {
		t.Errorf("frozen after the group: %v", frozen)
	}
}

// TestGroupMemberFailure fails the copy of the second member: every
// member is thawed, the first member's copy is removed (nothing half
// made), and the retry takes the whole group.
func TestGroupMemberFailure(t *testing.T) {
	h := newHarness(t)
	sa, sb := h.staged("a"), h.staged("b")
	h.world.failOn("snapshot g-b", errors.New("EIO"))
	h.askGroup("g", "a", "b")
	h.r.wait()
	if _, err := h.r.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.r.wait()
	if _, ok := h.world.snapshotOf("g-a"); ok {
		t.Error("the first member's copy is left after the second failed")
	}
	if frozen := h.world.frozenImages(); len(frozen) != 0 {
		t.Errorf("frozen after a failed member: %v", frozen)
	}
	for _, vol := range []string{"a", "b"} {
		if v, _ := h.store.Get(vol); v.Frozen != "" {
			t.Errorf("%s recorded frozen at %s after the failure", vol, v.Frozen)
		}
	}
	h.world.failOn("snapshot g-b", nil)
	h.clock.Step(DefaultBackoffMax)
	n := len(h.world.Calls())
	h.runUntilIdle()
	if got := h.callsSince(n); !strings.Contains(got, "snapshot g-a,snapshot g-b,thaw "+sb+",thaw "+sa) {
		t.Errorf("retry: got calls %s, want both members copied, then both thawed", got)
	}
	for _, id := range []string{"g-a", "g-b"} {
		if _, ok := h.world.snapshotOf(id); !ok {
			t.Errorf("snapshot %s not taken by the retry", id)
		}
	}
}

// TestGroupWaitsForItsMembers checks that a group snapshot does not start
// while an operation of any member runs, and that no operation of a
// member starts while the group's runs.
func TestGroupWaitsForItsMembers(t *testing.T) {
	h := newHarness(t)
	h.staged("a")
	sb, tb := h.volume("b")
	// b's stage is held in its mount.
	hold := make(chan struct{})
	h.world.holdOn("mount "+sb, hold)
	h.update("b", func(v *state.Volume) { v.Stage = stageSpec(sb) })
	if _, err := h.r.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.askGroup("g", "a", "b")
	n, err := h.r.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h.world.snapshotOf("g-a"); ok || n != 0 {
		t.Errorf("the group started while its member b was being staged (%d operations started)", n)
	}
	close(hold)
	h.r.wait()
	// Now the group holds b: b's publish waits for it.
	copied := make(chan struct{})
	h.world.holdOn("snapshot g-a", copied)
	if n, err := h.r.Pass(context.Background()); err != nil || n != 1 {
		t.Fatalf("pass once b is staged: %d operations started (%v), want the group", n, err)
	}
	waitFor(t, h.world.started, "snapshot g-a")
	h.update("b", func(v *state.Volume) { v.Publishes = map[string]*state.Publish{tb: publishSpec()} })
	if _, err := h.r.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(mountPaths(h.world), tb) {
		t.Error("b was published while the group held it")
	}
	close(copied)
	h.runUntilIdle()
	if !slices.Contains(mountPaths(h.world), tb) {
		t.Error("b not published after the group")
	}
	if _, ok := h.world.snapshotOf("g-b"); !ok {
		t.Error("group not taken")
	}
}

// TestGroupRefusals checks what a group cannot hold: a member staged as a
// raw block device (nothing can freeze it), and, in a pool that copies
// data, members in use holding more than GroupCopyLimit. Both withdraw the
// intent with FAILED_PRECONDITION, leave nothing frozen and copy nothing.
func TestGroupRefusals(t *testing.T) {
	t.Run("raw block member", func(t *testing.T) {
		h := newHarness(t)
		h.staged("a")
		sb, _ := h.volume("b")
		h.update("b", func(v *state.Volume) {
			v.Stage = stageSpec(sb)
			v.Stage.Access = state.AccessBlock
		})
		h.runUntilIdle()
		gen := h.askGroup("g", "a", "b")
		h.runUntilIdle()
		h.wantGroupRefused(gen, "raw block")
	})
	t.Run("too much to copy frozen", func(t *testing.T) {
		h := newHarness(t)
		h.staged("a")
		h.staged("b")
		h.world.setCopies()
		h.world.setSize(h.world.Path("a"), GroupCopyLimit)
		gen := h.askGroup("g", "a", "b")
		h.runUntilIdle()
		h.wantGroupRefused(gen, fmt.Sprint(GroupCopyLimit))
	})
	t.Run("copying data within the limit", func(t *testing.T) {
		h := newHarness(t)
		h.staged("a")
		h.staged("b")
		h.world.setCopies()
		h.askGroup("g", "a", "b")
		h.runUntilIdle()
		if _, ok := h.world.snapshotOf("g-b"); !ok {
			t.Error("a group within the limit was not taken")
		}
	})
}

// wantGroupRefused fails unless group g of a and b was withdrawn with
// FAILED_PRECONDITION saying what, copied nothing and left nothing frozen.
func (h *harness) wantGroupRefused(gen int64, what string) {
	h.t.Helper()
	f := h.store.TerminalFailureFor("a", state.SnapshotKey("g-a"), gen)
	if f == nil || f.Kind != classified.KindFailedPrecondition || !strings.Contains(f.Message, what) {
		h.t.Errorf("final: got %v, want FAILED_PRECONDITION saying %q", f, what)
	}
	if _, ok := h.world.snapshotOf("g-a"); ok {
		h.t.Error("a member was copied")
	}
	if frozen := h.world.frozenImages(); len(frozen) != 0 {
		h.t.Errorf("frozen: %v", frozen)
	}
}

// TestGroupRemovesWhatACrashLeft checks that a member copied by an attempt
// a crash stopped is removed by the next attempt before anything else,
// also when that attempt is refused for good: no half group is left.
func TestGroupRemovesWhatACrashLeft(t *testing.T) {
	h := newHarness(t)
	h.staged("a")
	sb, _ := h.volume("b")
	h.update("b", func(v *state.Volume) {
		v.Stage = stageSpec(sb)
		v.Stage.Access = state.AccessBlock
	})
	h.runUntilIdle()
	// What the crashed attempt copied.
	if _, err := h.world.take(h.world.dataDir, "g-a", h.world.Path("a"), devices.SnapshotOf{Source: "a", Group: "g"}); err != nil {
		t.Fatal(err)
	}
	gen := h.askGroup("g", "a", "b")
	h.runUntilIdle()
	h.wantGroupRefused(gen, "raw block")
}

// TestGroupYieldsToItsMembersOwnWork checks that a member's own work that
// can start (here a publish the kubelet waits for) starts before a group
// snapshot asked at the same time holds the member.
func TestGroupYieldsToItsMembersOwnWork(t *testing.T) {
	h := newHarness(t)
	h.staged("a")
	h.staged("b")
	_, tb := h.volume("b")
	h.update("b", func(v *state.Volume) { v.Publishes = map[string]*state.Publish{tb: publishSpec()} })
	h.askGroup("g", "a", "b")
	if _, err := h.r.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.r.wait()
	if !slices.Contains(mountPaths(h.world), tb) {
		t.Error("b's publish did not start in the pass that found it beside a group")
	}
	if _, ok := h.world.snapshotOf("g-a"); ok {
		t.Error("the group held b before b's own publish")
	}
	h.runUntilIdle()
	if _, ok := h.world.snapshotOf("g-b"); !ok {
		t.Error("the group was not taken after b's publish")
	}
}

package reconciler

import (
	"fmt"
	"slices"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// TestCallsGoToTheVolumesPool stages, grows and snapshots a volume of pool
// "fast" beside a volume of the same name in the default pool: every call
// about its image and snapshots must reach pool fast, whose fake holds
// them (an image or snapshot of another pool is not there). A call routed
// to the wrong pool attaches, grows or copies the other volume's image.
func TestCallsGoToTheVolumesPool(t *testing.T) {
	h := newHarness(t)
	h.r.cfg.Pools = fakePools(h.world, "fast")
	fast := fakePool{w: h.world, name: "fast"}
	image := fast.Image("v1")
	h.world.makeImages("v1") // the decoy, in the default pool
	h.world.makeImagesIn("fast", "v1")
	staging, target := "/k/staging/v1", "/k/pod-v1/mount"
	h.world.makeDirs(staging, "/k/pod-v1")
	h.update("v1", func(v *state.Volume) {
		v.Pool = "fast"
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.runUntilIdle()
	if got, want := mountPaths(h.world), []string{staging, target}; !slices.Equal(got, want) {
		t.Fatalf("mounts after set-up: got %v, want %v", got, want)
	}
	if m, _ := h.world.topMount(staging); m.Source != fmt.Sprintf("/dev/loop%d", minorOf(image)) {
		t.Errorf("staging mount: got %s, want the loop device of pool fast's image %s (/dev/loop%d)", m.Source, image, minorOf(image))
	}

	h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()
	if got, _ := fast.ImageSize("v1"); got != 128<<20 {
		t.Errorf("pool fast's image after the expansion: got %d bytes, want %d", got, 128<<20)
	}
	if got, _ := h.world.Size("v1"); got != 64<<20 {
		t.Errorf("the default pool's image after the expansion: got %d bytes, want it untouched at %d", got, 64<<20)
	}

	h.askSnapshot("v1", "s1")
	h.runUntilIdle()
	if got, ok := h.world.snapshotOf("s1"); !ok || got.image != image || !got.frozen {
		t.Errorf("snapshot s1: got %+v (taken %v), want a frozen copy of pool fast's image %s", got, ok, image)
	}
	if taken, _ := (fakePool{w: h.world, name: state.DefaultPool}).Taken("s1"); taken {
		t.Errorf("snapshot s1 is in the default pool; want it in pool fast only")
	}
	if v, _ := h.store.Get("v1"); v.Snapshots != nil {
		t.Errorf("snapshot intents after the snapshot: got %v, want none", v.Snapshots)
	}
	h.wantNormal("v1", "after set-up, expansion and snapshot in pool fast")
}

// TestMissingPoolSaysSo checks what a call about a volume whose pool this
// node does not have answers: the pool's name and the flag that configures
// one, and, for a growth, RESOURCE_EXHAUSTED naming the pools the node has.
func TestMissingPoolSaysSo(t *testing.T) {
	h := newHarness(t)
	h.r.cfg.Pools = fakePools(h.world, "fast", "slow")
	_, p := h.r.poolOf(&state.Volume{ID: "v1", Pool: "gone"})
	if err := p.Reserve("v1"); err == nil || err.Error() != `this node has no storage pool "gone" (--pool)` {
		t.Errorf("Reserve: got %v", err)
	}
	_, err := p.GrowImage("v1", 1<<30)
	if got, want := fmt.Sprint(err), "this node has no storage pool gone (it has default, fast, slow)"; got != want {
		t.Errorf("GrowImage: got %q, want %q", got, want)
	}
	if e := classified.AsError(err); e == nil || e.Kind != classified.KindResourceExhausted {
		t.Errorf("GrowImage: got %v, want a RESOURCE_EXHAUSTED error", err)
	}
}

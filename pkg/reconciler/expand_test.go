package reconciler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

func TestExpansionGrowsDeviceThenFilesystem(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.stagedAndPublished("v1")
	image := h.world.Path("v1")
	if v, _ := h.store.Get("v1"); v.FsSize != 64<<20 {
		t.Fatalf("fs size after mkfs: got %d, want the device's %d", v.FsSize, 64<<20)
	}
	n := len(h.world.Calls())
	h.world.growImage(image, 128<<20) // ControllerExpandVolume
	v := h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()

	dev := fmt.Sprintf("/dev/loop%d", minorOf(image))
	if got, want := h.callsSince(n), "grow "+dev+",resize "+staging; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
	got, _ := h.store.Get("v1")
	if got.FsSize != 128<<20 {
		t.Errorf("fs size: got %d, want %d", got.FsSize, 128<<20)
	}
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready || r.Generation != v.Expand.Generation {
		t.Errorf("expand result: got %+v, want ready at generation %d", r, v.Expand.Generation)
	}
}

// TestExpansionGrowsImageFirst checks an expansion beyond the image: the
// image grows on this node first (the controller no longer does), then the
// device, then the filesystem, and the answer is ready at the intent's
// generation.
func TestExpansionGrowsImageFirst(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.stagedAndPublished("v1")
	n := len(h.world.Calls())
	v := h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()

	dev := fmt.Sprintf("/dev/loop%d", minorOf(h.world.Path("v1")))
	if got, want := h.callsSince(n), "grow image v1,grow "+dev+",resize "+staging; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
	if size, _ := h.world.Size("v1"); size != 128<<20 {
		t.Errorf("image size: got %d, want %d", size, 128<<20)
	}
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready || r.Generation != v.Expand.Generation {
		t.Errorf("expand result: got %+v, want ready at generation %d", r, v.Expand.Generation)
	}
	h.wantNormal("v1", "after the expansion")
}

// TestUnusedExt4GrowsUnmounted checks the expansion of a staged ext4 that
// no pod uses, as the kubelet asks it between stage and publish: it grows
// unmounted (no CAP_SYS_RESOURCE needed, no writers locked out), and the
// same volume once published grows online.
func TestUnusedExt4GrowsUnmounted(t *testing.T) {
	h := newHarness(t)
	staging := h.staged("v1")
	_, target := h.volume("v1")
	n := len(h.world.Calls())
	v := h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()

	dev := fmt.Sprintf("/dev/loop%d", minorOf(h.world.Path("v1")))
	want := "grow image v1,grow " + dev + ",unmount " + staging + ",blkid,grow unmounted ext4,mount " + staging
	if got := h.callsSince(n); got != want {
		t.Errorf("calls:\n got %s\nwant %s", got, want)
	}
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready || r.Generation != v.Expand.Generation {
		t.Errorf("expand result: got %+v, want ready at generation %d", r, v.Expand.Generation)
	}
	h.wantNormal("v1", "after growing unmounted")

	h.update("v1", func(v *state.Volume) { v.Publishes = map[string]*state.Publish{target: publishSpec()} })
	h.runUntilIdle()
	n = len(h.world.Calls())
	h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 192 << 20} })
	h.runUntilIdle()
	if got, want := h.callsSince(n), "grow image v1,grow "+dev+",resize "+staging; got != want {
		t.Errorf("calls once published:\n got %s\nwant %s", got, want)
	}
}

// TestFailedUnmountedGrowthMountsAgainAndBacksOff checks that an ext4 whose
// unmounted growth fails is mounted again at once, reported, and not
// unmounted again before its backoff.
func TestFailedUnmountedGrowthMountsAgainAndBacksOff(t *testing.T) {
	h := newHarness(t)
	staging := h.staged("v1")
	h.world.failOn("grow unmounted ext4", errors.New("e2fsck: exit status 4"))
	h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()
	h.runUntilIdle()
	if got := strings.Count(strings.Join(h.world.Calls(), ","), "unmount "+staging); got != 1 {
		t.Errorf("unmounts of the staging path: got %d, want 1 before the backoff ends", got)
	}
	if got := mountPaths(h.world); len(got) != 1 || got[0] != staging {
		t.Errorf("mounts after the failed growth: got %v, want the staging mount back", got)
	}
	if c := h.store.Condition("v1"); c.Reason != "GrowFailed" {
		t.Errorf("condition: got %+v, want GrowFailed", c)
	}
	h.world.failOn("grow unmounted ext4", nil)
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready {
		t.Errorf("expand after the retry: got %+v, want ready", r)
	}
}

// TestImageGrowthRefusedIsFinalUntilAskedAgain checks a growth the node
// cannot hold: the request's final is RESOURCE_EXHAUSTED, the image, the
// mounts and the publish are as they were, the volume reports GrowFailed,
// nothing is retried behind the kubelet's back, and the same size asked
// for again (a new Expand, as NodeExpandVolume records it) is tried again.
func TestImageGrowthRefusedIsFinalUntilAskedAgain(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	h.world.failOn("grow image v1", classified.Errorf(classified.KindResourceExhausted, "no room"))
	v := h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()

	final := h.store.TerminalFailureFor("v1", state.ExpandKey, v.Expand.Generation)
	if final == nil || final.Kind != classified.KindResourceExhausted || !final.Terminal {
		t.Fatalf("final: got %+v, want a terminal ResourceExhausted", final)
	}
	if size, _ := h.world.Size("v1"); size != 64<<20 {
		t.Errorf("image size after the refusal: got %d, want %d", size, 64<<20)
	}
	if got := mountPaths(h.world); len(got) != 2 || got[0] != staging || got[1] != target {
		t.Errorf("mounts after the refusal: got %v, want both kept", got)
	}
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish after the refusal: got %+v, want still ready", r)
	}
	if c := h.store.Condition("v1"); c.Health != state.Degraded || c.Reason != "GrowFailed" || !strings.Contains(c.Message, "asked for again") {
		t.Errorf("condition: got %+v, want DEGRADED GrowFailed, tried when asked again", c)
	}
	n := len(h.world.Calls())
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	if got := h.callsSince(n); got != "" {
		t.Errorf("calls after the backoff: got %s, want none (final until asked again)", got)
	}

	h.world.failOn("grow image v1", nil)
	again := h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	if again.Expand.Generation == v.Expand.Generation {
		t.Fatalf("the same size asked again kept generation %d; want a new one", v.Expand.Generation)
	}
	h.runUntilIdle()
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready || r.Generation != again.Expand.Generation {
		t.Errorf("expand result when asked again: got %+v, want ready at generation %d", r, again.Expand.Generation)
	}
	if size, _ := h.world.Size("v1"); size != 128<<20 {
		t.Errorf("image size when asked again: got %d, want %d", size, 128<<20)
	}
	h.wantNormal("v1", "after the expansion asked again")
}

func TestFailedGrowIsRetriedAndReportedNotUndone(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	h.world.growImage(h.world.Path("v1"), 128<<20)
	h.world.failOn("resize "+staging, errors.New("resize2fs: Device or resource busy"))
	h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()

	c := h.store.Condition("v1")
	if c.Health != state.Degraded || c.Reason != "GrowFailed" {
		t.Errorf("condition: got %+v, want DEGRADED GrowFailed", c)
	}
	if got := mountPaths(h.world); len(got) != 2 || got[0] != staging || got[1] != target {
		t.Errorf("mounts after a failed grow: got %v, want both kept", got)
	}
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish after a failed grow: got %+v, want still ready", r)
	}
	h.world.failOn("resize "+staging, nil)
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready {
		t.Errorf("expand after the retry: got %+v, want ready", r)
	}
	h.wantNormal("v1", "after the retry")
}

func TestFoundXFSIsGrownOnlineAfterStage(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	h.world.setFs(h.world.Path("v1"), "xfs")
	st := stageSpec(staging)
	st.FsType = "xfs"
	h.update("v1", func(v *state.Volume) { v.Stage = st })
	h.runUntilIdle()
	if got, want := h.callsSince(0), "blank,attach,blkid,mount "+staging+",resize "+staging; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
}

func TestFoundFilesystemIsGrownAtStage(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	h.world.setFs(h.world.Path("v1"), "ext4") // made elsewhere, on a smaller image maybe
	h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()
	if got, want := h.callsSince(0), "blank,attach,blkid,grow unmounted ext4,mount "+staging; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
}

// TestGrowThatCannotSucceedIsFinal checks that a growth the plugin lacks the
// privilege for is not retried: the expansion keeps its record, its request
// gets the failure with its kind, and only a new expansion tries again.
func TestGrowThatCannotSucceedIsFinal(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.stagedAndPublished("v1")
	h.world.growImage(h.world.Path("v1"), 128<<20)
	h.world.failOn("resize "+staging, fmt.Errorf("resize2fs: Permission denied to resize filesystem: %w", devices.ErrNotPermitted))
	v := h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.runUntilIdle()
	resizes := func() int { return strings.Count(strings.Join(h.world.Calls(), ","), "resize "+staging) }
	h.clock.Step(10 * DefaultBackoffMax)
	h.runUntilIdle()
	if n := resizes(); n != 1 {
		t.Errorf("resize attempts: got %d, want 1", n)
	}
	err := h.store.TerminalFailureFor("v1", state.ExpandKey, v.Expand.Generation)
	if err == nil || err.Kind != classified.KindFailedPrecondition {
		t.Fatalf("final of the expansion: got %+v, want FailedPrecondition", err)
	}
	if got, _ := h.store.Get("v1"); got.Expand == nil {
		t.Errorf("the expansion was withdrawn; want it kept")
	}
	h.world.failOn("resize "+staging, nil)
	h.world.growImage(h.world.Path("v1"), 192<<20)
	v = h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 192 << 20} })
	h.runUntilIdle()
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready || r.Generation != v.Expand.Generation {
		t.Errorf("a new expansion: got %+v, want ready", r)
	}
}

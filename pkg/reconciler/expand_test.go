package reconciler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

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
	h.settle()

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

func TestFailedGrowIsRetriedAndReportedNotUndone(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	h.world.growImage(h.world.Path("v1"), 128<<20)
	h.world.fail["resize "+staging] = errors.New("resize2fs: Device or resource busy")
	h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.settle()

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
	delete(h.world.fail, "resize "+staging)
	h.clock.Step(DefaultBackoffMax)
	h.settle()
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready {
		t.Errorf("expand after the retry: got %+v, want ready", r)
	}
	h.wantNormal("v1", "after the retry")
}

func TestFoundXFSIsGrownOnlineAfterStage(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	h.world.fs[h.world.Path("v1")] = "xfs"
	st := stageSpec(staging)
	st.FsType = "xfs"
	h.update("v1", func(v *state.Volume) { v.Stage = st })
	h.settle()
	if got, want := h.callsSince(0), "attach,blkid,mount "+staging+",resize "+staging; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
}

func TestFoundFilesystemIsGrownAtStage(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	h.world.fs[h.world.Path("v1")] = "ext4" // made elsewhere, on a smaller image maybe
	h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.settle()
	if got, want := h.callsSince(0), "attach,blkid,grow unmounted ext4,mount "+staging; got != want {
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
	h.world.fail["resize "+staging] = fmt.Errorf("resize2fs: Permission denied to resize filesystem: %w", devices.ErrNotPermitted)
	v := h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 128 << 20} })
	h.settle()
	resizes := func() int { return strings.Count(strings.Join(h.world.Calls(), ","), "resize "+staging) }
	h.clock.Step(10 * DefaultBackoffMax)
	h.settle()
	if n := resizes(); n != 1 {
		t.Errorf("resize attempts: got %d, want 1", n)
	}
	err := h.store.FinalFor("v1", state.ExpandKey, v.Expand.Generation)
	if err == nil || err.Kind != state.KindFailedPrecondition {
		t.Fatalf("final of the expansion: got %+v, want FailedPrecondition", err)
	}
	if got, _ := h.store.Get("v1"); got.Expand == nil {
		t.Errorf("the expansion was withdrawn; want it kept")
	}
	delete(h.world.fail, "resize "+staging)
	h.world.growImage(h.world.Path("v1"), 192<<20)
	v = h.update("v1", func(v *state.Volume) { v.Expand = &state.Expand{Bytes: 192 << 20} })
	h.settle()
	if r, _ := h.store.Result("v1", state.ExpandKey); !r.Ready || r.Generation != v.Expand.Generation {
		t.Errorf("a new expansion: got %+v, want ready", r)
	}
}

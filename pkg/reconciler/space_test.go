package reconciler

import (
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// TestThickVolumeRefusesDiscards checks that a thick volume's device is
// attached refusing discards and a thin volume's passing them, and that
// each is set back when someone changes it while it is staged.
func TestThickVolumeRefusesDiscards(t *testing.T) {
	h := newHarness(t)
	h.update("thin", func(v *state.Volume) { v.Provisioning = state.ProvisionThin })
	h.stagedAndPublished("thick")
	h.alsoStaged("thin")
	flip := func(id string, want bool) {
		t.Helper()
		image := h.world.Path(id)
		got := h.world.flipDiscards(image)
		if got != want {
			t.Errorf("%s: discards %v after the stage, want %v", id, got, want)
		}
	}
	flip("thick", false)
	flip("thin", true)
	n := len(h.world.Calls())
	h.runUntilIdle()
	if got := h.callsSince(n); got != "discards off,discards on" && got != "discards on,discards off" {
		t.Errorf("calls after someone flipped the discards: got %q, want them set back", got)
	}
	h.wantNormal("thick", "after the repair")
}

// TestOldSparseVolumeIsMadeThickWhenThereIsRoom checks that a volume made
// before provisioning was recorded (a sparse image, no provisioning) is
// reported while the data directory cannot hold its holes, keeps working,
// and is made thick once it can.
func TestOldSparseVolumeIsMadeThickWhenThereIsRoom(t *testing.T) {
	h := newHarness(t)
	image := h.world.Path("old")
	h.world.setHoles(image, 60<<20)
	h.world.setFree(10 << 20)
	h.stagedAndPublished("old")
	c := h.store.Condition("old")
	if c.Reason != "SpaceNotReserved" || c.Health != state.Degraded || !strings.Contains(c.Message, "62914560 bytes") {
		t.Errorf("condition with too little room: got %+v, want SpaceNotReserved naming the 60 MiB of holes", c)
	}
	if r, _ := h.store.Result("old", state.StageKey); !r.Ready {
		t.Errorf("stage result without room: %+v, want ready: the volume keeps working", r)
	}
	if strings.Contains(strings.Join(h.world.Calls(), ","), "reserve") {
		t.Errorf("calls %v: reserved without room", h.world.Calls())
	}

	h.world.setFree(100 << 20)
	n := len(h.world.Calls())
	h.runUntilIdle()
	if got := h.callsSince(n); got != "reserve" {
		t.Errorf("calls once there is room: got %q, want reserve", got)
	}
	h.wantNormal("old", "once reserved")
	if v, _ := h.store.Get("old"); v.Provisioning != state.ProvisionThick {
		t.Errorf("provisioning once reserved: %q, want thick", v.Provisioning)
	}
}

// TestThinVolumesReportAFillingPool checks the pool guard: below it every
// thin volume is DEGRADED with PoolNearlyFull, and PoolFull once the data
// directory is full; thick volumes are not. Once there is room again, a
// thin volume that was staged while the data directory was full reports
// SpaceRanOut until its filesystem is mounted anew.
func TestThinVolumesReportAFillingPool(t *testing.T) {
	h := newHarness(t)
	h.world.setGuard(capacity.Guard{Bytes: 50 << 20})
	h.world.setFree(500 << 20)
	h.update("thin", func(v *state.Volume) { v.Provisioning = state.ProvisionThin })
	h.world.setHoles(h.world.Path("thin"), 30<<20)
	h.stagedAndPublished("thin")
	h.alsoStaged("thick")
	h.wantNormal("thin", "with room")

	for _, tc := range []struct {
		free   int64
		reason contract.Reason
	}{{40 << 20, "PoolNearlyFull"}, {4096, "PoolFull"}, {40 << 20, "SpaceRanOut"}, {500 << 20, "SpaceRanOut"}} {
		h.world.setFree(tc.free)
		h.runUntilIdle()
		if c := h.store.Condition("thin"); c.Reason != tc.reason || tc.reason != "" && c.Health != state.Degraded {
			t.Errorf("thin volume with %d bytes free: got %+v, want reason %q", tc.free, c, tc.reason)
		}
		h.wantNormal("thick", "whatever the pool")
	}
	v, _ := h.store.Get("thin")
	if c := h.store.Condition("thin"); !strings.Contains(c.Message, v.Stage.SpaceRanOutAt.UTC().Format(time.RFC3339)) || v.Stage.SpaceRanOutUnder != v.Stage.MountID {
		t.Errorf("condition %q and stage %+v: want the time the space ran out under the staging mount", c.Message, v.Stage)
	}

	// Unstaged and staged again, the filesystem is mounted anew (after
	// a check): what happened under the old mount is no longer reported.
	h.update("thin", func(v *state.Volume) {
		v.Stage.Deleting = true
		for _, p := range v.Publishes {
			p.Deleting = true
		}
	})
	h.runUntilIdle()
	h.alsoStaged("thin")
	h.wantNormal("thin", "staged anew with room")
}

// alsoStaged stages and publishes one more volume beside others.
func (h *harness) alsoStaged(id string) {
	h.t.Helper()
	staging, target := h.volume(id)
	h.update(id, func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.runUntilIdle()
	if r, _ := h.store.Result(id, state.PublishKey(target)); !r.Ready {
		h.t.Fatalf("publish of %s: %+v, want ready", id, r)
	}
}

package pool

import (
	"testing"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
)

// TestSnapshotNeed checks what a snapshot is promised against what it
// takes from the promises: by a copy, what the image allocates; by a
// reflink, the drop it makes in what a thick volume could still be
// promised once every block of the image is shared, thin or thick, at
// any ratio (at ratio 1 exactly that drop).
func TestSnapshotNeed(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct {
		name string
		u    devices.Usage
		copy int64
		own  int64
	}{
		{name: "written, nothing shared", u: devices.Usage{Size: 64 * mi, Allocated: 40 * mi}, copy: 40 * mi, own: 40 * mi},
		{name: "partly shared", u: devices.Usage{Size: 64 * mi, Allocated: 40 * mi, Shared: 30 * mi}, copy: 40 * mi, own: 10 * mi},
		{name: "restored by reflink, every block shared", u: devices.Usage{Size: 64 * mi, Allocated: 40 * mi, Shared: 40 * mi}, copy: 40 * mi, own: 0},
		{name: "allocated past its size", u: devices.Usage{Size: 64 * mi, Allocated: 65 * mi}, copy: 65 * mi, own: 64 * mi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := snapshotNeed(devices.CopySparse, tc.u); got != tc.copy {
				t.Errorf("by a copy: got %d MiB, want %d MiB", got/mi, tc.copy/mi)
			}
			need := snapshotNeed(devices.CopyReflink, tc.u)
			if need != tc.own {
				t.Errorf("by a reflink: got %d MiB, want %d MiB", need/mi, tc.own/mi)
			}
			for _, thin := range []bool{false, true} {
				for _, ratio := range []float64{1, 2} {
					before := imageOf(tc.u)
					before.Thin = thin
					after := before
					after.Shared = min(after.Allocated, after.Size)
					drop := capacity.New(200*mi, 0, ratio, []capacity.Image{before}).ThickAvailable() -
						capacity.New(200*mi, 0, ratio, []capacity.Image{after}).ThickAvailable()
					if drop > need || ratio == 1 && drop != need {
						t.Errorf("thin %v, ratio %g: the snapshot's sharing takes %d MiB of what can be promised, it is promised %d MiB", thin, ratio, drop/mi, need/mi)
					}
				}
			}
		})
	}
}

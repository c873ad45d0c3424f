package controller

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// TestVolumesAreAsLargeAsTheirFilesystemNeeds checks that a claim smaller
// than its filesystem can be made on gets that much, within its limit,
// and one whose limit leaves no room for it OUT_OF_RANGE: mkfs.xfs makes
// nothing under 300 MiB, so a smaller xfs would fail NodeStageVolume on
// every retry, and the kernel resizes no btrfs to under 256 MiB.
func TestVolumesAreAsLargeAsTheirFilesystemNeeds(t *testing.T) {
	c, _, _ := newController(t)
	mount := capMountOf
	for _, tc := range []struct {
		name           string
		caps           []*csi.VolumeCapability
		params         map[string]string
		required       int64
		limit          int64
		want           int64
		wantOutOfRange bool
	}{
		{name: "xfs", caps: mount("xfs"), required: 100 << 20, want: 300 << 20},
		{name: "xfs from the class", caps: mount(""), params: map[string]string{contract.FsTypeKey: "xfs"}, required: 100 << 20, want: 300 << 20},
		{name: "btrfs", caps: mount("btrfs"), required: 100 << 20, want: 256 << 20},
		{name: "ext4", caps: mount("ext4"), required: 1 << 20, want: 16 << 20},
		{name: "default ext4", caps: mount(""), required: 1 << 20, want: 16 << 20},
		{name: "raw block", caps: capBlock, required: 1 << 20, want: 16 << 20},
		{name: "xfs, larger", caps: mount("xfs"), required: 400 << 20, want: 400 << 20},
		{name: "xfs, limit only", caps: mount("xfs"), limit: 512 << 20, want: 512 << 20},
		{name: "xfs, no room in the limit", caps: mount("xfs"), required: 100 << 20, limit: 200 << 20, wantOutOfRange: true},
		{name: "xfs, limit only, no room", caps: mount("xfs"), limit: 200 << 20, wantOutOfRange: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := map[string]string{contract.ProvisioningKey: "thin"}
			for k, v := range tc.params {
				params[k] = v
			}
			resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "pvc-" + sanitize(tc.name), VolumeCapabilities: tc.caps,
				Parameters: params, CapacityRange: &csi.CapacityRange{RequiredBytes: tc.required, LimitBytes: tc.limit}})
			if tc.wantOutOfRange {
				if e := classified.AsError(err); e == nil || e.Kind != classified.KindOutOfRange {
					t.Fatalf("got %v, want OUT_OF_RANGE", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetVolume().GetCapacityBytes(); got != tc.want {
				t.Errorf("capacity %d bytes, want %d", got, tc.want)
			}
		})
	}
}

// sanitize makes a test case's name a volume name.
func sanitize(name string) string {
	out := []byte(name)
	for i, b := range out {
		if !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9') {
			out[i] = '-'
		}
	}
	return string(out)
}

// TestSizeForWithinTheLimit checks the size picked at the edges of a
// capacity range: a limit that is no whole number of blocks gives the
// largest whole-block size within it, and a limit below the floor, or a
// limit alone under the smallest image, is OUT_OF_RANGE.
func TestSizeForWithinTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rng        state.Range
		floor      int64
		want       int64
		outOfRange bool
	}{
		{name: "limit not whole blocks", rng: state.Range{Limit: 300<<20 + 1}, floor: 300 << 20, want: 300 << 20},
		{name: "required and limit in one block", rng: state.Range{Required: 300<<20 + 1, Limit: 300<<20 + 100}, floor: 300 << 20, outOfRange: true},
		{name: "limit alone under the smallest image", rng: state.Range{Limit: 8 << 20}, floor: pool.MinVolumeSize, outOfRange: true},
		{name: "limit under the floor", rng: state.Range{Limit: 200 << 20}, floor: 256 << 20, outOfRange: true},
		{name: "required rounded up", rng: state.Range{Required: 20<<20 + 1}, floor: pool.MinVolumeSize, want: 20<<20 + 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pool.SizeFor(tc.rng, tc.floor)
			if tc.outOfRange {
				if e := classified.AsError(err); e == nil || e.Kind != classified.KindOutOfRange {
					t.Fatalf("got %d, %v; want OUT_OF_RANGE", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// TestRestoreGetsTheFloor checks that a volume restored from a snapshot
// smaller than its filesystem needs, with no size of its own, gets the
// floor; with a size asked for, that size; never less than the snapshot:
// asked for less, it is given the snapshot's size, unless its limit is
// less (OUT_OF_RANGE).
func TestRestoreGetsTheFloor(t *testing.T) {
	src := &source{snap: devices.SnapshotInfo{ID: "s", Size: 16 << 20}}
	if got, err := src.fit(state.Range{}, 1<<30, 300<<20); err != nil || got != 300<<20 {
		t.Errorf("no size asked: got %d, %v; want %d", got, err, 300<<20)
	}
	if got, err := src.fit(state.Range{Required: 400 << 20}, 400<<20, 300<<20); err != nil || got != 400<<20 {
		t.Errorf("400 MiB asked: got %d, %v; want %d", got, err, 400<<20)
	}
	big := &source{snap: devices.SnapshotInfo{ID: "b", Size: 512 << 20}}
	if got, err := big.fit(state.Range{Required: 400 << 20}, 400<<20, 300<<20); err != nil || got != 512<<20 {
		t.Errorf("smaller than the snapshot: got %d, %v; want the snapshot's %d", got, err, 512<<20)
	}
	// An xfs snapshot of 300 MiB reports restoreSize 1 (its floor), and
	// a raw block restore of it has a floor of 16 MiB.
	xfs := &source{snap: devices.SnapshotInfo{ID: "x", Size: 300 << 20}}
	if got, err := xfs.fit(state.Range{Required: 1}, 16<<20, 16<<20); err != nil || got != 300<<20 {
		t.Errorf("a raw block restore of an xfs snapshot asking 1 byte: got %d, %v; want %d", got, err, 300<<20)
	}
	if _, err := big.fit(state.Range{Required: 400 << 20, Limit: 400 << 20}, 400<<20, 300<<20); classified.AsError(err) == nil || classified.AsError(err).Kind != classified.KindOutOfRange {
		t.Errorf("limited below the snapshot: got %v, want OUT_OF_RANGE", err)
	}
}

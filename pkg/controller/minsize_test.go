package controller

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
)

// TestVolumesAreAsLargeAsTheirFilesystemNeeds checks that a claim smaller
// than its filesystem can be made on gets that much, within its limit,
// and one whose limit leaves no room for it OUT_OF_RANGE: mkfs.xfs makes
// nothing under 300 MiB and the kernel grows no btrfs under 256 MiB, so a
// smaller volume would fail NodeStageVolume on every retry.
func TestVolumesAreAsLargeAsTheirFilesystemNeeds(t *testing.T) {
	c, _, _ := newController(t)
	mount := func(fs string) []*csi.VolumeCapability {
		return []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}}
	}
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

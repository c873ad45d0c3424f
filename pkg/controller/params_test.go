package controller

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestFsTypeOf owns the filesystem a CreateVolume's volume will carry: the
// capability's, else the StorageClass's, else the node's default, none for
// a raw block volume.
func TestFsTypeOf(t *testing.T) {
	mount := func(fs string) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}}
	}
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	sc := map[string]string{fsTypeKey: "btrfs"}
	for _, tc := range []struct {
		name   string
		params map[string]string
		caps   []*csi.VolumeCapability
		want   string
	}{
		{name: "default", caps: []*csi.VolumeCapability{mount("")}, want: "ext4"},
		{name: "storage class", params: sc, caps: []*csi.VolumeCapability{mount("")}, want: "btrfs"},
		{name: "capability first", params: sc, caps: []*csi.VolumeCapability{mount("xfs")}, want: "xfs"},
		{name: "raw block", params: sc, caps: []*csi.VolumeCapability{block}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fsTypeOf(tc.params, tc.caps); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

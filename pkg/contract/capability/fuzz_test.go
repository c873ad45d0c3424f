package capability

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/contract"
)

// FuzzParse feeds arbitrary fs types and flags through the
// capability check: an accepted one names an allowed filesystem and flags
// that pass the policy.
func FuzzParse(f *testing.F) {
	f.Add("ext4", "noatime", int32(1))
	f.Add("ntfs", "ro", int32(1))
	f.Add("", "bind", int32(5))
	f.Add("xfs", "nouuid", int32(7))
	f.Fuzz(func(t *testing.T, fsType, flag string, mode int32) {
		c, err := Parse(&csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: []string{flag}}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_Mode(mode)},
		})
		if err != nil {
			return
		}
		if c.FsType != "" && c.FsType != "ext4" && c.FsType != "xfs" && c.FsType != "btrfs" {
			t.Fatalf("accepted fs type %q", fsType)
		}
		if contract.CheckMountFlags(c.MountFlags) != nil {
			t.Fatalf("accepted flags %q that the policy refuses", c.MountFlags)
		}
		if !strings.HasPrefix(c.Mode, "SINGLE_NODE_") {
			t.Fatalf("accepted mode %s", c.Mode)
		}
	})
}

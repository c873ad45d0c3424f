package capability

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestParseAccessType checks that a capability says which access
// type it asks for: the node server records a raw block stage or publish
// from Block, a filesystem otherwise.
func TestParseAccessType(t *testing.T) {
	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	for _, tc := range []struct {
		name      string
		c         *csi.VolumeCapability
		wantBlock bool
	}{
		{name: "block", c: &csi.VolumeCapability{AccessMode: mode, AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}, wantBlock: true},
		{name: "mount", c: &csi.VolumeCapability{AccessMode: mode, AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.c)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got.Block != tc.wantBlock {
				t.Errorf("got Block %v, want %v", got.Block, tc.wantBlock)
			}
		})
	}
}

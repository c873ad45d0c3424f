package controller

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
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

// TestOnNodeLossParameter checks that CreateVolume takes the class's
// on-node-loss choice, which converge-controller carries out, and refuses
// a value it does not know, making nothing.
func TestOnNodeLossParameter(t *testing.T) {
	c, _, images := newController(t)
	for _, v := range []string{"retain", "release"} {
		_, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: v, VolumeCapabilities: capMount,
			CapacityRange: &csi.CapacityRange{RequiredBytes: MinVolumeSize}, Parameters: map[string]string{state.OnNodeLossKey: v}})
		if err != nil {
			t.Errorf("%s=%s: %v", state.OnNodeLossKey, v, err)
		}
	}
	_, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "odd", VolumeCapabilities: capMount,
		CapacityRange: &csi.CapacityRange{RequiredBytes: MinVolumeSize}, Parameters: map[string]string{state.OnNodeLossKey: "delete"}})
	if rpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), state.OnNodeLossKey) {
		t.Errorf("%s=delete: got %v, want INVALID_ARGUMENT naming the parameter", state.OnNodeLossKey, err)
	}
	if _, err := images.Size("odd_node"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused volume's image: %v", err)
	}
}

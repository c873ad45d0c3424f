package controller

import (
	"errors"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/rpcerr"
)

// TestFsTypeOf owns the filesystem a CreateVolume's volume will carry: the
// capability's, else the StorageClass's, else the node's default, none for
// a raw block volume.
func TestFsTypeOf(t *testing.T) {
	mount := func(fs string) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}}
	}
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	sc := map[string]string{contract.FsTypeKey: "btrfs"}
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
// on-node-loss choice, which converge-controller carries out, and records
// it in the volume's attributes (the PV's), retain for a class that names
// none, beside the mkfs options and again when the volume is found made;
// a value it does not know is refused, making nothing.
func TestOnNodeLossParameter(t *testing.T) {
	c, _, images := newController(t)
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   map[string]string
	}{
		{name: "retain", params: map[string]string{contract.OnNodeLossKey: "retain"}, want: map[string]string{contract.OnNodeLossKey: "retain"}},
		{name: "release", params: map[string]string{contract.OnNodeLossKey: "release"}, want: map[string]string{contract.OnNodeLossKey: "release"}},
		{name: "none", params: nil, want: map[string]string{contract.OnNodeLossKey: "retain"}},
		{name: "with-mkfs", params: map[string]string{contract.OnNodeLossKey: "release", contract.MkfsOptionsKey: "-b 4096"},
			want: map[string]string{contract.OnNodeLossKey: "release", contract.MkfsOptionsKey: "-b 4096"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, call := range []string{"made", "found"} {
				resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: tc.name, VolumeCapabilities: capMount,
					CapacityRange: &csi.CapacityRange{RequiredBytes: pool.MinVolumeSize}, Parameters: tc.params})
				if err != nil {
					t.Fatalf("%s: %v", call, err)
				}
				if got := resp.GetVolume().GetVolumeContext(); !maps.Equal(got, tc.want) {
					t.Errorf("%s: volume context %v, want %v", call, got, tc.want)
				}
			}
		})
	}
	_, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "odd", VolumeCapabilities: capMount,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pool.MinVolumeSize}, Parameters: map[string]string{contract.OnNodeLossKey: "delete"}})
	if rpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), contract.OnNodeLossKey) {
		t.Errorf("%s=delete: got %v, want INVALID_ARGUMENT naming the parameter", contract.OnNodeLossKey, err)
	}
	if _, err := images.Size("odd_node"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused volume's image: %v", err)
	}
}

// TestRestoreSizeTakesTheSourcesRequest: a snapshot's size, which
// external-provisioner turns into the least a claim restored from it may
// ask for (it refuses a smaller one), lets a claim asking what its source
// asked for restore it, though converge rounds volumes up to whole 4 KiB
// blocks and to its filesystem's least size; a claim of that size is
// given a volume that holds the snapshot; and a source of whole MiB is
// reported as it is.
func TestRestoreSizeTakesTheSourcesRequest(t *testing.T) {
	const mib = 1 << 20
	for _, fsType := range []string{host.FsExt4, host.FsXFS, host.FsBtrfs, ""} {
		floor := host.MinSize(fsType)
		for _, asked := range []int64{1, 1 << 10, mib, pool.MinVolumeSize - 1, pool.MinVolumeSize, pool.MinVolumeSize + 1, 100 * mib,
			100_000_000, 1_000_000_000, 1_500_000_000, 64 * mib, 10 << 30, 100*mib + 4097, floor - 1, floor, floor + 1} {
			image, err := pool.SizeFor(rangeOf(&csi.CapacityRange{RequiredBytes: asked}), floor)
			if err != nil {
				t.Fatal(err)
			}
			got := restoreSize(image, floor)
			if got > asked {
				t.Errorf("%q: a source asked %d bytes, its image %d: snapshot size %d refuses a restore of the same size", fsType, asked, image, got)
			}
			if got < 1 {
				t.Errorf("%q: a source asked %d bytes, its image %d: snapshot size %d, which the CSI spec reads as unknown", fsType, asked, image, got)
			}
			if size, err := pool.SizeFor(rangeOf(&csi.CapacityRange{RequiredBytes: got}), floor); err != nil || size < image {
				t.Errorf("%q: a source asked %d bytes, its image %d: a claim of the snapshot's size %d is given %d bytes (%v)", fsType, asked, image, got, size, err)
			}
			if asked%mib == 0 && asked > floor && got != image {
				t.Errorf("%q: a source of %d MiB: snapshot size %d, want %d", fsType, asked/mib, got, image)
			}
		}
	}
	// The one exception, which docs/volumes.md names: a claim less than
	// 4 KiB short of a whole MiB is reported as that MiB.
	if got := restoreSize(100*mib, host.MinSize(host.FsExt4)); got != 100*mib {
		t.Errorf("an image of 100 MiB from a claim of 102399Ki: snapshot size %d, want 100 MiB", got)
	}
}

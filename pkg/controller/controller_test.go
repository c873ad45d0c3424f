package controller

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/nodeserver"
	"github.com/converge-csi/converge/pkg/state"
)

func newController(t *testing.T) (csi.ControllerServer, *state.Store, *devices.Images) {
	t.Helper()
	dir := t.TempDir()
	store, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	images := &devices.Images{Dir: filepath.Join(dir, "volumes")}
	if err := os.MkdirAll(images.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return New(images, store, map[string]string{TopologyKey: "node"}, Options{Ratio: 1, Guard: capacity.Guard{Percent: 5}}), store, images
}

var capMount = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

func create(t *testing.T, c csi.ControllerServer, name string) {
	t.Helper()
	if _, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: capMount,
		CapacityRange: &csi.CapacityRange{RequiredBytes: MinVolumeSize}}); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteVolumeMarksBeforeItRemoves checks the deletion of a volume's
// image: refused while an intent uses it, the record marked before the
// image goes, and a deletion interrupted after the mark (a crash) finished
// by the next DeleteVolume or CreateVolume of the name, so that a volume
// made again under the name never inherits the old one's provenance.
func TestDeleteVolumeMarksBeforeItRemoves(t *testing.T) {
	c, store, images := newController(t)
	create(t, c, "v")
	if _, err := store.Update("v", func(v *state.Volume) error {
		v.Stage, v.Formatted = &state.Stage{Path: "/k/s"}, "ext4"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: "v"})
	if code := status.Code(nodeserver.Status(err)); code != codes.FailedPrecondition {
		t.Errorf("deleting a staged volume: %v, want FailedPrecondition", err)
	}
	if _, err := images.Size("v"); err != nil {
		t.Errorf("the image of a staged volume went: %v", err)
	}

	// A crash after the mark, before the image went: the record holds
	// the mark and the old provenance, the image is still there.
	if _, err := store.Update("v", func(v *state.Volume) error {
		v.Stage = nil
		return v.StartRemoval()
	}); err != nil {
		t.Fatal(err)
	}
	create(t, c, "v")
	v, err := store.Get("v")
	if err != nil || v.Removing || v.Formatted != "" || v.Provisioning != state.ProvisionThick {
		t.Errorf("after CreateVolume finished an interrupted deletion, the record is %+v (%v), want a new thick volume's", v, err)
	}

	if _, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Size("v"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image after DeleteVolume: %v", err)
	}
	if _, err := store.Get("v"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("record after DeleteVolume: %v", err)
	}
	if _, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: "v"}); err != nil {
		t.Errorf("deleting again: %v", err)
	}
}

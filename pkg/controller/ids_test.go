package controller

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
)

// TestControllerRequestsFollowTheIDRule holds the Controller requests to
// the one rule for IDs (contract.CheckID), as TestNodeRequestsFollowTheIDRule
// holds the Node ones: CreateVolume refuses a name no volume can have
// (INVALID_ARGUMENT); the requests about a volume that must exist answer
// an ID no volume can have as an unknown one: NOT_FOUND, or OK for a
// delete. No ID at all is INVALID_ARGUMENT.
func TestControllerRequestsFollowTheIDRule(t *testing.T) {
	c, _, _ := newController(t)
	ctx := context.Background()
	rwo := capMount
	ok := classified.Kind(-1)
	for _, tc := range []struct {
		rpc     string
		invalid classified.Kind
		call    func(id string) error
	}{
		{"CreateVolume", classified.KindInvalidArgument, func(id string) error {
			_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: id, VolumeCapabilities: rwo})
			return err
		}},
		{"ControllerExpandVolume", classified.KindNotFound, func(id string) error {
			_, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
			return err
		}},
		{"ValidateVolumeCapabilities", classified.KindNotFound, func(id string) error {
			_, err := c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: rwo})
			return err
		}},
		{"ControllerModifyVolume", classified.KindNotFound, func(id string) error {
			_, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id})
			return err
		}},
		{"DeleteVolume", ok, func(id string) error {
			_, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}},
	} {
		for id, want := range map[string]classified.Kind{"": classified.KindInvalidArgument, "../v": tc.invalid, ".v": tc.invalid, "v w": tc.invalid, strings.Repeat("v", 129): tc.invalid} {
			err := tc.call(id)
			got := ok
			if err != nil {
				got = classified.AsError(err).Kind
			}
			if got != want {
				t.Errorf("%s of %.10q: got %v (%v), want kind %v (-1: OK)", tc.rpc, id, got, err, want)
			}
		}
	}
}

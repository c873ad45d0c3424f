package nodeserver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// TestLiveAt owns "the live stage or a live publish, else NOT_FOUND" that
// NodeGetVolumeStats and NodeExpandVolume ask of a volume path.
func TestLiveAt(t *testing.T) {
	v := &state.Volume{ID: "v", Stage: &state.Stage{Path: "/k/s"}, Publishes: map[string]*state.Publish{
		"/k/t1": {}, "/k/t2": {Deleting: true}}}
	for path, live := range map[string]bool{"/k/s": true, "/k/t1": true, "/k/t2": false, "/k/other": false} {
		err := liveAt(v, path)
		if live != (err == nil) || err != nil && classified.AsError(err).Kind != classified.KindNotFound {
			t.Errorf("%s: got %v, want live %t (else NotFound)", path, err, live)
		}
	}
	v.Stage.Deleting = true
	if err := liveAt(v, "/k/s"); err == nil {
		t.Error("a stage being withdrawn: got live, want NotFound")
	}
}

// TestCheckAttributes owns what the node accepts of a PV's volume
// attributes: the keys CreateVolume and static PVs write, the on-node-loss
// choice only with a value converge-controller knows.
func TestCheckAttributes(t *testing.T) {
	for _, tc := range []struct {
		name string
		vc   map[string]string
		want string
	}{
		{name: "none", vc: nil},
		{name: "what CreateVolume writes", vc: map[string]string{contract.MkfsOptionsKey: "-b 4096", contract.OnNodeLossKey: "release", "storage.kubernetes.io/csiProvisionerIdentity": "x"}},
		{name: "retain", vc: map[string]string{contract.OnNodeLossKey: "retain"}},
		{name: "a static PV's device", vc: map[string]string{contract.DeviceKey: "/dev/disk/by-id/x"}},
		{name: "an on-node-loss choice converge does not know", vc: map[string]string{contract.OnNodeLossKey: "delete"},
			want: `volume attribute converge.csi.dev/on-node-loss: unknown value "delete": want "retain" or "release"`},
		{name: "an unknown key", vc: map[string]string{"converge.csi.dev/on-node-los": "release"},
			want: `unknown volume attributes: "converge.csi.dev/on-node-los"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkAttributes(tc.vc)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want none", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want || classified.AsError(err).Kind != classified.KindInvalidArgument):
				t.Errorf("got %v, want InvalidArgument %q", err, tc.want)
			}
		})
	}
}

// TestNodeRequestsFollowTheIDRule holds every Node request to the one rule
// for IDs (contract.CheckID): the requests that record the kubelet's
// intent refuse an ID no volume can have with INVALID_ARGUMENT; those
// about a volume that must exist (expansion, stats) answer it NOT_FOUND,
// as ControllerExpandVolume does; no ID at all is INVALID_ARGUMENT.
func TestNodeRequestsFollowTheIDRule(t *testing.T) {
	s, _, _ := newServer(t)
	ctx := context.Background()
	staging, target := root+"/staging/v", root+"/pods/a/mount"
	for _, tc := range []struct {
		rpc  string
		use  contract.IDUse
		call func(id string) error
	}{
		{"NodeStageVolume", contract.Records, func(id string) error {
			_, err := s.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo})
			return err
		}},
		{"NodePublishVolume", contract.Records, func(id string) error {
			_, err := s.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo})
			return err
		}},
		{"NodeUnpublishVolume", contract.Records, func(id string) error {
			_, err := s.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		}},
		{"NodeUnstageVolume", contract.Records, func(id string) error {
			_, err := s.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
			return err
		}},
		{"NodeExpandVolume", contract.Finds, func(id string) error {
			_, err := s.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: staging, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
			return err
		}},
		{"NodeGetVolumeStats", contract.Finds, func(id string) error {
			_, err := s.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: staging})
			return err
		}},
	} {
		invalid := map[contract.IDUse]classified.Kind{contract.Records: classified.KindInvalidArgument, contract.Finds: classified.KindNotFound}[tc.use]
		for id, want := range map[string]classified.Kind{"": classified.KindInvalidArgument, "../v": invalid, ".v": invalid, "v w": invalid, strings.Repeat("v", 129): invalid} {
			err := tc.call(id)
			if err == nil || classified.AsError(err).Kind != want {
				t.Errorf("%s of %.10q: got %v, want %v", tc.rpc, id, err, want)
			}
		}
	}
}

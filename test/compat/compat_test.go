package compat

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const mib = 1 << 20

// xfsCap is a mount of xfs, which grows online here (ext4's online growth
// needs CAP_SYS_RESOURCE, which root lacks on some machines), so that
// NodeExpandVolume answers.
var xfsCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// thin keeps the volumes' images sparse: xfs needs 300 MiB.
var thin = map[string]string{"converge.csi.dev/provisioning": "thin"}

// TestEveryReplyReadsInTheOldestPeer drives every RPC of spec v1.11.0's
// Identity, Controller and Node services against csi-node with default
// flags, through a volume's whole life (create, stage, publish, stats,
// expansion, a snapshot and a volume restored from it, and teardown), and
// requires each reply to hold nothing a peer of that spec cannot read and
// to render through csi-lib-utils v0.20.0's protosanitizer; so must
// ControllerModifyVolume's, which csi-node serves by default. The RPCs
// converge does not implement must answer UNIMPLEMENTED.
func TestEveryReplyReadsInTheOldestPeer(t *testing.T) {
	p := start(t)
	s := &session{t: t, p: p}
	s.lifecycle()
	id, staging, _ := s.up("compat-modify")
	s.call("ControllerModifyVolume", func(ctx context.Context) (proto.Message, error) {
		return csi.NewControllerClient(p.conn).ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
			MutableParameters: map[string]string{"maxReadIops": "500"}})
	})
	s.down(id, staging)
	for _, m := range []string{"ControllerModifyVolume", "GetPluginInfo", "GetPluginCapabilities", "Probe",
		"ControllerGetCapabilities", "GetCapacity", "CreateVolume", "ListVolumes", "ValidateVolumeCapabilities",
		"ControllerExpandVolume", "CreateSnapshot", "ListSnapshots", "DeleteSnapshot", "DeleteVolume",
		"NodeGetCapabilities", "NodeGetInfo", "NodeStageVolume", "NodePublishVolume", "NodeGetVolumeStats",
		"NodeExpandVolume", "NodeUnpublishVolume", "NodeUnstageVolume"} {
		if !slices.Contains(s.answered, m) {
			t.Errorf("%s was not answered", m)
		}
	}
	c := csi.NewControllerClient(p.conn)
	for name, call := range map[string]func(context.Context) error{
		"ControllerPublishVolume": func(ctx context.Context) error {
			_, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "v", NodeId: "compat-node", VolumeCapability: xfsCap})
			return err
		},
		"ControllerUnpublishVolume": func(ctx context.Context) error {
			_, err := c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "v"})
			return err
		},
		"ControllerGetVolume": func(ctx context.Context) error {
			_, err := c.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: "v"})
			return err
		},
	} {
		if err := call(s.ctx()); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: got %v, want UNIMPLEMENTED", name, err)
		}
	}
}

// TestAlphaFeaturesAreWhatOldPeersCannotRead turns every alpha feature on
// and checks what each is documented to need: the capabilities of CSI
// v1.13 (SnapshotAccessibility, VolumeHealth) and a Snapshot's topology
// are what a peer of spec v1.11.0 cannot read; the volume condition of
// VolumeCondition is read by it as its own type. It also shows that the
// check of the default test can fail: these are the values csi-node
// advertised by default before they were gated.
func TestAlphaFeaturesAreWhatOldPeersCannotRead(t *testing.T) {
	p := start(t, "--feature-gates=SnapshotAccessibility=true,VolumeHealth=true,VolumeCondition=true")
	s := &session{t: t, p: p}

	caps, err := csi.NewIdentityClient(p.conn).GetPluginCapabilities(s.ctx(), &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantUnreadable(t, "GetPluginCapabilities", caps, "SNAPSHOT_ACCESSIBILITY_CONSTRAINTS (5)")
	n := csi.NewNodeClient(p.conn)
	nodeCaps, err := n.NodeGetCapabilities(s.ctx(), &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantUnreadable(t, "NodeGetCapabilities", nodeCaps, "GET_VOLUME_HEALTH (7)")
	condition := false
	for _, c := range nodeCaps.GetCapabilities() {
		condition = condition || c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_VOLUME_CONDITION
	}
	if !condition {
		t.Errorf("NodeGetCapabilities: got %v, want VOLUME_CONDITION", nodeCaps)
	}

	id, staging, _ := s.up("compat-alpha")
	stats, err := n.NodeGetVolumeStats(s.ctx(), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: staging})
	if err != nil {
		t.Fatal(err)
	}
	s.reply("NodeGetVolumeStats", stats, nil)
	if c := stats.GetVolumeCondition(); c == nil || c.GetAbnormal() || c.GetMessage() != "" {
		t.Errorf("NodeGetVolumeStats of a healthy volume: got condition %v, want one, not abnormal", c)
	}
	snap, err := csi.NewControllerClient(p.conn).CreateSnapshot(s.ctx(), &csi.CreateSnapshotRequest{Name: "compat-alpha-snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	wantUnreadable(t, "CreateSnapshot", snap, "accessible_topology (field 7)")
	s.call("DeleteSnapshot", func(ctx context.Context) (proto.Message, error) {
		return csi.NewControllerClient(p.conn).DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	})
	s.down(id, staging)
}

// wantUnreadable fails t unless msg holds something a peer of spec
// v1.11.0 cannot read.
func wantUnreadable(t *testing.T, method string, msg proto.Message, what string) {
	t.Helper()
	problems, renderErr := peerProblems(msg)
	if len(problems) == 0 {
		t.Errorf("%s: got %v, readable by spec v1.11.0; want %s, which it cannot read", method, msg, what)
	}
	t.Logf("%s with alpha features: %s (render: %v)", method, strings.Join(problems, "; "), renderErr)
}

// session drives one plugin and records which methods answered.
type session struct {
	t        *testing.T
	p        *plugin
	answered []string
}

func (s *session) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s.t.Cleanup(cancel)
	return ctx
}

// call runs an RPC and checks its reply; an error fails the test.
func (s *session) call(method string, rpc func(context.Context) (proto.Message, error)) proto.Message {
	s.t.Helper()
	resp, err := rpc(s.ctx())
	s.reply(method, resp, err)
	return resp
}

// reply checks that an answer of method reads and renders in the oldest
// peer.
func (s *session) reply(method string, resp proto.Message, err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatalf("%s: %v", method, err)
	}
	problems, renderErr := peerProblems(resp)
	for _, pr := range problems {
		s.t.Errorf("%s: %s", method, pr)
	}
	if renderErr != nil {
		s.t.Errorf("%s: %v", method, renderErr)
	}
	s.answered = append(s.answered, method)
}

// up creates a thin xfs volume of 320 MiB named name, stages and publishes
// it, as the kubelet does, and returns its ID and paths.
func (s *session) up(name string) (id, staging, target string) {
	s.t.Helper()
	c, n := csi.NewControllerClient(s.p.conn), csi.NewNodeClient(s.p.conn)
	created := s.call("CreateVolume", func(ctx context.Context) (proto.Message, error) {
		return c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: thin,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 320 * mib}, VolumeCapabilities: []*csi.VolumeCapability{xfsCap}})
	}).(*csi.CreateVolumeResponse)
	id = created.GetVolume().GetVolumeId()
	// The kubelet makes the staging directory and the target's parent.
	staging = filepath.Join(s.p.root, "staging-"+name)
	target = filepath.Join(s.p.root, "pod-"+name, "mount")
	for _, d := range []string{staging, filepath.Dir(target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			s.t.Fatal(err)
		}
	}
	s.call("NodeStageVolume", func(ctx context.Context) (proto.Message, error) {
		return n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: xfsCap})
	})
	s.call("NodePublishVolume", func(ctx context.Context) (proto.Message, error) {
		return n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: xfsCap})
	})
	return id, staging, target
}

// down unpublishes (every target under the plugin's root), unstages and
// deletes a volume.
func (s *session) down(id, staging string) {
	s.t.Helper()
	n := csi.NewNodeClient(s.p.conn)
	targets, _ := filepath.Glob(filepath.Join(s.p.root, "pod-*", "mount"))
	for _, target := range targets {
		s.call("NodeUnpublishVolume", func(ctx context.Context) (proto.Message, error) {
			return n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		})
	}
	s.call("NodeUnstageVolume", func(ctx context.Context) (proto.Message, error) {
		return n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	s.call("DeleteVolume", func(ctx context.Context) (proto.Message, error) {
		return csi.NewControllerClient(s.p.conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	})
}

// lifecycle is a volume's whole life, every reply checked.
func (s *session) lifecycle() {
	s.t.Helper()
	id := csi.NewIdentityClient(s.p.conn)
	c, n := csi.NewControllerClient(s.p.conn), csi.NewNodeClient(s.p.conn)
	s.call("GetPluginInfo", func(ctx context.Context) (proto.Message, error) {
		return id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	})
	s.call("GetPluginCapabilities", func(ctx context.Context) (proto.Message, error) {
		return id.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	})
	s.call("Probe", func(ctx context.Context) (proto.Message, error) { return id.Probe(ctx, &csi.ProbeRequest{}) })
	s.call("ControllerGetCapabilities", func(ctx context.Context) (proto.Message, error) {
		return c.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	})
	info := s.call("NodeGetInfo", func(ctx context.Context) (proto.Message, error) {
		return n.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	}).(*csi.NodeGetInfoResponse)
	s.call("NodeGetCapabilities", func(ctx context.Context) (proto.Message, error) {
		return n.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	})
	s.call("GetCapacity", func(ctx context.Context) (proto.Message, error) {
		return c.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: thin, AccessibleTopology: info.GetAccessibleTopology(),
			VolumeCapabilities: []*csi.VolumeCapability{xfsCap}})
	})

	vol, staging, target := s.up("compat-a")
	s.call("ListVolumes", func(ctx context.Context) (proto.Message, error) {
		return c.ListVolumes(ctx, &csi.ListVolumesRequest{})
	})
	s.call("ValidateVolumeCapabilities", func(ctx context.Context) (proto.Message, error) {
		return c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol, VolumeCapabilities: []*csi.VolumeCapability{xfsCap}})
	})
	for _, path := range []string{staging, target} {
		s.call("NodeGetVolumeStats", func(ctx context.Context) (proto.Message, error) {
			return n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol, VolumePath: path})
		})
	}
	s.call("ControllerExpandVolume", func(ctx context.Context) (proto.Message, error) {
		return c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 400 * mib}, VolumeCapability: xfsCap})
	})
	s.call("NodeExpandVolume", func(ctx context.Context) (proto.Message, error) {
		return n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol, VolumePath: target, StagingTargetPath: staging,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 400 * mib}, VolumeCapability: xfsCap})
	})

	snap := s.call("CreateSnapshot", func(ctx context.Context) (proto.Message, error) {
		return c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "compat-snap", SourceVolumeId: vol})
	}).(*csi.CreateSnapshotResponse).GetSnapshot().GetSnapshotId()
	s.call("ListSnapshots", func(ctx context.Context) (proto.Message, error) {
		return c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	})
	restored := s.call("CreateVolume", func(ctx context.Context) (proto.Message, error) {
		return c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "compat-restored", Parameters: thin,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 400 * mib}, VolumeCapabilities: []*csi.VolumeCapability{xfsCap},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}})
	}).(*csi.CreateVolumeResponse).GetVolume().GetVolumeId()
	s.call("DeleteVolume", func(ctx context.Context) (proto.Message, error) {
		return c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: restored})
	})
	s.call("DeleteSnapshot", func(ctx context.Context) (proto.Message, error) {
		return c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap})
	})
	s.down(vol, staging)
}

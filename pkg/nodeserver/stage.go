package nodeserver

import (
	"context"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/contract/capability"
	"github.com/converge-csi/converge/pkg/state"
)

// NodeStageVolume records the stage intent and waits until the volume's
// device is attached and its filesystem mounted at the staging path.
func (s *Server) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id := req.GetVolumeId()
	spec, err := s.stageSpec(req)
	if err != nil {
		return nil, err
	}
	err = s.request(ctx, id, func(v *state.Volume) error { return v.RequestStage(spec) }, func(v *state.Volume) check {
		klog.FromContext(ctx).V(4).Info("Stage intent recorded", "volumeID", id, "generation", v.Stage.Generation)
		return s.setupCheck(id, state.StageKey, v.Stage.Generation, liveStage)
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// stageSpec validates a stage request (INVALID_ARGUMENT) and returns the
// stage it asks for.
func (s *Server) stageSpec(req *csi.NodeStageVolumeRequest) (*state.Stage, error) {
	if err := contract.CheckID("volume", req.GetVolumeId(), contract.Records); err != nil {
		return nil, err
	}
	if err := s.checkPath("staging target path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	c, err := capability.Parse(req.GetVolumeCapability())
	if err != nil {
		return nil, invalid("%v", err)
	}
	if err := checkAttributes(req.GetVolumeContext()); err != nil {
		return nil, err
	}
	device, static := req.GetVolumeContext()[contract.DeviceKey]
	if static {
		if err := s.checkDevice(device); err != nil {
			return nil, err
		}
	}
	mkfsOptions, err := contract.CheckMkfsOptions(c.FsType, req.GetVolumeContext()[contract.MkfsOptionsKey])
	if err != nil {
		return nil, invalid("%v", err)
	}
	if c.Block {
		mkfsOptions = nil // nothing is formatted
	}
	return &state.Stage{
		MkfsOptions: mkfsOptions,
		Device:      device,
		Path:        req.GetStagingTargetPath(),
		Access:      accessOf(c),
		FsType:      c.FsType,
		MountFlags:  c.MountFlags,
		AccessMode:  c.Mode,
		ReadOnly:    c.ReadOnly,
	}, nil
}

// NodeUnstageVolume withdraws the stage intent and waits until the staging
// mount is gone and the device released. A volume that is not staged at
// that path is a no-op.
func (s *Server) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := contract.CheckID("volume", id, contract.Records); err != nil {
		return nil, err
	}
	if err := s.checkPath("staging target path", path); err != nil {
		return nil, err
	}
	err := s.request(ctx, id, func(v *state.Volume) error { return v.RequestUnstage(path) }, func(v *state.Volume) check {
		if v.Stage == nil || v.Stage.Path != path {
			return nil
		}
		return s.teardownCheck(id, state.StageKey, v.Stage.Generation, liveStage)
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// WithdrawIdleStage serves a deletion of volume id on this node: it
// withdraws a stage left without publishes (see
// state.WithdrawIdleStage) and waits, as NodeUnstageVolume does but for
// stageWithdrawWait at most, until the unstage is done, so that the
// deletion goes on in the same call. A volume with no such stage takes no
// request slot and is answered at once. It reports whether it withdrew
// the stage.
func (s *Server) WithdrawIdleStage(ctx context.Context, id string) (withdrawn bool, err error) {
	if v, err := s.cfg.Store.Get(id); err != nil || !v.IdleStage() {
		return false, nil // the deletion decides alone
	}
	ctx, cancel := context.WithTimeout(ctx, stageWithdrawWait)
	defer cancel()
	err = s.request(ctx, id, func(v *state.Volume) error { withdrawn = v.WithdrawIdleStage(); return nil }, func(v *state.Volume) check {
		if withdrawn {
			klog.FromContext(ctx).Info("Withdrew the stage of a volume being deleted: no publish is left on it", "volumeID", id)
		}
		if v.Stage == nil || !v.Stage.Deleting {
			return nil
		}
		return s.teardownCheck(id, state.StageKey, v.Stage.Generation, liveStage)
	})
	return withdrawn, err
}

// stageWithdrawWait bounds a deletion's wait for an unstage (a loop device
// detached, seconds): one that takes longer (the device held open) is
// answered DEADLINE_EXCEEDED with what it waits for, and the CO's retry
// finds it done, rather than hold a request slot for the CO's whole
// deadline.
const stageWithdrawWait = 30 * time.Second

package nodeserver

import (
	"context"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/state"
)

// NodeStageVolume records the stage intent and waits until the volume's
// device is attached and its filesystem mounted at the staging path.
func (s *Server) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := s.checkPath("staging target path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	c, err := ParseCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, invalid("%v", err)
	}
	if err := checkAttributes(req.GetVolumeContext()); err != nil {
		return nil, err
	}
	device, static := req.GetVolumeContext()[DeviceAttribute]
	if static {
		if err := s.checkDevice(device); err != nil {
			return nil, err
		}
	}
	mkfsOptions, err := CheckMkfsOptions(c.FsType, req.GetVolumeContext()[MkfsOptionsKey])
	if err != nil {
		return nil, invalid("%v", err)
	}
	if c.Access == state.AccessBlock {
		mkfsOptions = nil // nothing is formatted
	}
	spec := &state.Stage{
		MkfsOptions: mkfsOptions,
		Device:      device,
		Path:        req.GetStagingTargetPath(),
		Access:      c.Access,
		FsType:      c.FsType,
		MountFlags:  c.MountFlags,
		AccessMode:  c.Mode,
		ReadOnly:    c.ReadOnly,
	}
	release, err := s.admit()
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := s.record(id, func(v *state.Volume) error {
		st := v.Stage
		switch {
		case v.Removing:
			return state.Errorf(state.KindNotFound, "volume %s is being deleted", id)
		case st == nil && spec.Access == state.AccessMount && v.Access == state.AccessBlock:
			// What a workload wrote on a raw block device is never fscked
			// nor mounted by root: a Filesystem PV made for the volume of
			// a Block one (by whoever may create PVs) is refused.
			return state.Errorf(state.KindFailedPrecondition, "volume %s was made for or staged as a raw block device, so a workload may have written anything on it: it is not mounted as a filesystem; restore or clone it into a Filesystem volume through a StorageClass with %s: \"true\" instead", id, state.AllowModeChangeKey)
		case st == nil:
			v.Stage = spec
		case st.SameSpec(spec):
			st.Deleting = false // a duplicate, or a retry during a rollback
		case st.Deleting:
			return state.Errorf(state.KindAborted, "volume %s is still being unstaged from %s; retry later", id, st.Path)
		case st.Path != spec.Path:
			return state.Errorf(state.KindAlreadyExists, "volume %s is already staged at %s", id, st.Path)
		default:
			return state.Errorf(state.KindAlreadyExists, "volume %s is already staged at %s with another capability, fs type or mount flags", id, st.Path)
		}
		if spec.Access == state.AccessBlock {
			// From now on a workload may write anything on the device: the
			// volume's snapshots say so for good (Volume.WrittenAs).
			v.Access = state.AccessBlock
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(4).Info("Stage intent recorded", "volumeID", id, "generation", v.Stage.Generation)
	if err := s.wait(ctx, id, s.setupCheck(id, state.StageKey, v.Stage.Generation, liveStage)); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume withdraws the stage intent and waits until the staging
// mount is gone and the device released. A volume that is not staged at
// that path is a no-op.
func (s *Server) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := checkID(id); err != nil {
		return nil, err
	}
	path := req.GetStagingTargetPath()
	if err := s.checkPath("staging target path", path); err != nil {
		return nil, err
	}
	release, err := s.admit()
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := s.record(id, func(v *state.Volume) error {
		st := v.Stage
		if st == nil || st.Path != path {
			return nil
		}
		var live []string
		for _, t := range v.Targets() {
			if !v.Publishes[t].Deleting {
				live = append(live, t)
			}
		}
		if len(live) > 0 {
			return state.Errorf(state.KindFailedPrecondition, "volume %s is still published at %s", id, strings.Join(live, ", "))
		}
		st.Deleting = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if v.Stage == nil || v.Stage.Path != path {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if err := s.wait(ctx, id, s.teardownCheck(id, state.StageKey, v.Stage.Generation, liveStage)); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

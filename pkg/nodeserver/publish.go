package nodeserver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/contract/capability"
	"github.com/converge-csi/converge/pkg/state"
)

// NodePublishVolume records a publish intent and waits until the staging
// mount is bind mounted at the target path. The plugin creates the target;
// the kubelet creates its parent.
func (s *Server) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	spec, err := s.publishSpec(req)
	if err != nil {
		return nil, err
	}
	err = s.request(ctx, id, func(v *state.Volume) error { return v.RequestPublish(staging, target, spec) }, func(v *state.Volume) check {
		return s.setupCheck(id, state.PublishKey(target), v.Publishes[target].Generation, livePublish(target))
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishSpec validates a publish request (INVALID_ARGUMENT) and returns
// the publish it asks for.
func (s *Server) publishSpec(req *csi.NodePublishVolumeRequest) (*state.Publish, error) {
	if err := contract.CheckID("volume", req.GetVolumeId(), contract.Records); err != nil {
		return nil, err
	}
	target, staging := req.GetTargetPath(), req.GetStagingTargetPath()
	if err := s.checkPath("target path", target); err != nil {
		return nil, err
	}
	if err := s.checkPath("staging target path", staging); err != nil {
		return nil, err
	}
	c, err := capability.Parse(req.GetVolumeCapability())
	if err != nil {
		return nil, invalid("%v", err)
	}
	if err := checkAttributes(req.GetVolumeContext()); err != nil {
		return nil, err
	}
	if target == staging {
		return nil, invalid("target path must differ from the staging target path")
	}
	return &state.Publish{
		Access:     accessOf(c),
		AccessMode: c.Mode,
		ReadOnly:   req.GetReadonly() || c.ReadOnly,
		MountFlags: c.MountFlags,
	}, nil
}

// NodeUnpublishVolume withdraws a publish intent and waits until the target
// is unmounted and removed. A volume not published at the target is a
// no-op.
func (s *Server) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := contract.CheckID("volume", id, contract.Records); err != nil {
		return nil, err
	}
	if err := s.checkPath("target path", target); err != nil {
		return nil, err
	}
	err := s.request(ctx, id, func(v *state.Volume) error { return v.RequestUnpublish(target) }, func(v *state.Volume) check {
		p := v.Publishes[target]
		if p == nil {
			return nil
		}
		return s.teardownCheck(id, state.PublishKey(target), p.Generation, livePublish(target))
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

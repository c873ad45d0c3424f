package nodeserver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/state"
)

const singleWriter = "SINGLE_NODE_SINGLE_WRITER"

// NodePublishVolume records a publish intent and waits until the staging
// mount is bind mounted at the target path. The plugin creates the target;
// the kubelet creates its parent.
func (s *Server) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := checkID(id); err != nil {
		return nil, err
	}
	target := req.GetTargetPath()
	if err := s.checkPath("target path", target); err != nil {
		return nil, err
	}
	staging := req.GetStagingTargetPath()
	if err := s.checkPath("staging target path", staging); err != nil {
		return nil, err
	}
	c, err := ParseCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, invalid("%v", err)
	}
	if err := checkAttributes(req.GetVolumeContext()); err != nil {
		return nil, err
	}
	if target == staging {
		return nil, invalid("target path must differ from the staging target path")
	}
	spec := &state.Publish{
		Access:     c.Access,
		AccessMode: c.Mode,
		ReadOnly:   req.GetReadonly() || c.ReadOnly,
		MountFlags: c.MountFlags,
	}
	release, err := s.admit()
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := s.record(id, func(v *state.Volume) error {
		st := v.Stage
		switch {
		case st == nil || st.Deleting:
			return state.Errorf(state.KindFailedPrecondition, "volume %s is not staged", id)
		case st.Path != staging:
			return state.Errorf(state.KindFailedPrecondition, "volume %s is staged at %s, not %s", id, st.Path, staging)
		case st.Access != spec.Access:
			return state.Errorf(state.KindFailedPrecondition, "volume %s is staged with access type %s, not %s", id, st.Access, spec.Access)
		}
		if p := v.Publishes[target]; p != nil {
			switch {
			case p.SameSpec(spec):
				p.Deleting = false
				return nil
			case p.Deleting:
				return state.Errorf(state.KindAborted, "volume %s is still being unpublished from %s; retry later", id, target)
			}
			return state.Errorf(state.KindAlreadyExists, "volume %s is already published at %s with other options", id, target)
		}
		for t, p := range v.Publishes {
			if !p.Deleting && (spec.AccessMode == singleWriter || p.AccessMode == singleWriter) {
				return state.Errorf(state.KindFailedPrecondition, "volume %s is %s and already published at %s", id, singleWriter, t)
			}
		}
		if v.Publishes == nil {
			v.Publishes = map[string]*state.Publish{}
		}
		v.Publishes[target] = spec
		return nil
	})
	if err != nil {
		return nil, err
	}
	gen := v.Publishes[target].Generation
	if err := s.wait(ctx, id, s.setupCheck(id, state.PublishKey(target), gen, livePublish(target))); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume withdraws a publish intent and waits until the target
// is unmounted and removed. A volume not published at the target is a
// no-op.
func (s *Server) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := checkID(id); err != nil {
		return nil, err
	}
	target := req.GetTargetPath()
	if err := s.checkPath("target path", target); err != nil {
		return nil, err
	}
	release, err := s.admit()
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := s.record(id, func(v *state.Volume) error {
		if p := v.Publishes[target]; p != nil {
			p.Deleting = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if v.Publishes[target] == nil {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if err := s.wait(ctx, id, s.teardownCheck(id, state.PublishKey(target), v.Publishes[target].Generation, livePublish(target))); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

package nodeserver

import (
	"context"
	"errors"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// NodeExpandVolume records the capacity the volume must reach and waits
// until the reconciler has grown its image (within what this node can
// promise), its device and, for a filesystem, the filesystem, online. The
// growth happens here, on the node that holds the image, and nowhere else:
// the controller advertises no expansion of its own. A volume already that
// large is answered as soon as the reconciler confirms it; images never
// shrink. The volume path is its staging path or one of its targets;
// neither a capability nor the staging path is needed. The answer's
// capacity is the image's. A size this node cannot hold now is
// RESOURCE_EXHAUSTED and one it never could OUT_OF_RANGE, both with the
// image as it was; the kubelet's next request tries again.
func (s *Server) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	required, retry, err := s.expandSize(req)
	if err != nil {
		return nil, err
	}
	err = s.request(ctx, id, func(v *state.Volume) error { return v.RequestExpand(required, retry) }, func(v *state.Volume) check {
		klog.FromContext(ctx).V(4).Info("Expand intent recorded", "volumeID", id, "bytes", v.Expand.Bytes, "generation", v.Expand.Generation)
		return s.expandCheck(id, v.Expand.Generation)
	})
	if err != nil {
		return nil, err
	}
	capacity, err := s.capacity(id)
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: capacity}, nil
}

// expandSize validates an expansion request and returns the capacity it
// asks for (the image's own when it names none), and whether that size is
// asked again after it failed for good. An invalid request is
// INVALID_ARGUMENT (before any lookup) or OUT_OF_RANGE; an unknown volume,
// or an ID no volume can have (contract.Finds), NOT_FOUND whatever the
// path (CSI), and a path it is neither staged nor published at NOT_FOUND
// too.
func (s *Server) expandSize(req *csi.NodeExpandVolumeRequest) (required int64, retry bool, err error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := contract.CheckID("volume", id, contract.Finds); err != nil {
		return 0, false, err
	}
	if path == "" {
		return 0, false, invalid("volume path is required")
	}
	rng := state.Range{Required: req.GetCapacityRange().GetRequiredBytes(), Limit: req.GetCapacityRange().GetLimitBytes()}
	if err := rng.Check(); err != nil {
		return 0, false, err
	}
	// The path is checked before it is used, after the volume is found.
	v, err := s.cfg.Store.Get(id)
	if errors.Is(err, state.ErrNotFound) || err == nil && !v.HasNodeIntent() {
		return 0, false, notFound(id)
	}
	if err != nil {
		return 0, false, err
	}
	if err := s.checkPath("volume path", path); err != nil {
		return 0, false, err
	}
	if err := liveAt(v, path); err != nil {
		return 0, false, err
	}
	capacity, err := s.capacity(id)
	if err != nil {
		return 0, false, err
	}
	if err := rng.Grows(id, capacity); err != nil {
		return 0, false, err
	}
	required = rng.Required
	if required == 0 {
		required = capacity
	}
	// The same size asked for again after it failed for good (no space,
	// say) is tried again: the kubelet retries, and space may have been
	// freed since.
	retry = v.Expand != nil && v.Expand.Bytes == required && s.cfg.Store.TerminalFailureFor(id, state.ExpandKey, v.Expand.Generation) != nil
	return required, retry, nil
}

// capacity returns the size of id's image.
func (s *Server) capacity(id string) (int64, error) {
	capacity, err := s.cfg.Capacity(id)
	if errors.Is(err, os.ErrNotExist) {
		return 0, notFound(id)
	}
	if err != nil {
		return 0, classified.Errorf(classified.KindInternal, "reading the capacity of volume %s: %w", id, err)
	}
	return capacity, nil
}

// expandCheck waits as setupCheck does; in addition, a growth that failed
// for good (say, a privilege the plugin lacks) answers with its failure at
// once: the expansion stays recorded, since the device may already have
// grown, and is not retried until it changes.
func (s *Server) expandCheck(id string, gen int64) check {
	setup := s.setupCheck(id, state.ExpandKey, gen, liveExpand)
	return func(v *state.Volume) (bool, error, string) {
		done, err, pending := setup(v)
		if done || v.Expand == nil || v.Expand.Generation != gen {
			return done, err, pending
		}
		if final := s.cfg.Store.TerminalFailureFor(id, state.ExpandKey, gen); final != nil {
			return true, final, ""
		}
		return false, nil, pending
	}
}

func liveExpand(v *state.Volume) (int64, bool, bool) {
	if v.Expand == nil {
		return 0, false, false
	}
	return v.Expand.Generation, false, true
}

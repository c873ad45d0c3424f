package controller

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/contract/capability"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// ControllerExpandVolume grows a volume whose image is on this node, as
// pool.Pool.GrowImage does (the new space of a thick volume allocated, never
// shrinking, within the promise), and leaves the filesystem to the node.
// A cluster runs one resizer, beside one node's plugin: for a volume whose
// image is not here, which this node cannot tell from one of another node,
// it answers with the capacity asked for and node expansion required, and
// that node's NodeExpandVolume grows the image there (and refuses, with
// RESOURCE_EXHAUSTED or OUT_OF_RANGE, a size it cannot hold). Growing here
// when it can matters for offline expansion: the kubelet calls
// NodeExpandVolume only once the volume is published again, when a mounted
// ext4 grows only with CAP_SYS_RESOURCE, while an image grown before the
// stage has its filesystem grown at the stage, unmounted.
func (c *Controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, classified.Errorf(classified.KindInvalidArgument, "volume ID is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, classified.Errorf(classified.KindInvalidArgument, "capacity range is required")
	}
	if err := contract.CheckID("volume", id, contract.Finds); err != nil {
		return nil, err
	}
	rng := rangeOf(req.GetCapacityRange())
	size, err := pool.SizeFor(rng, pool.MinVolumeSize)
	if err != nil {
		return nil, err
	}
	p, missing := c.pools.ForVolume(id)
	if missing != nil {
		return nil, missing.Err()
	}
	cur, err := p.ImageSize(id)
	switch {
	case errors.Is(err, os.ErrNotExist):
		klog.V(2).InfoS("Volume is not on this node; its node grows it in NodeExpandVolume", "volumeID", id, "bytes", size)
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
	case err != nil:
		return nil, classified.Errorf(classified.KindInternal, "checking volume %s: %w", id, err)
	}
	if err := rng.Grows(id, cur); err != nil {
		return nil, err
	}
	if size, err = p.GrowImage(id, size); err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

// DeleteVolume removes a volume's image and record. It refuses while the
// volume is staged or published, or being restored; a stage left without
// publishes (one the kubelet forgot) it withdraws first, and waits for the unstage
// (Stages); an unknown volume is a no-op. The record is marked first, so
// that no stage intent can slip in while the image goes, and a crash in
// between leaves a mark the next DeleteVolume or CreateVolume of the name
// finishes.
func (c *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := contract.CheckID("volume", id, contract.Finds); err != nil {
		if classified.AsError(err).Kind == classified.KindNotFound {
			return &csi.DeleteVolumeResponse{}, nil
		}
		return nil, err
	}
	p, missing := c.pools.ForVolume(id)
	if missing != nil {
		if why := c.pools.Unserved(missing.Name()); why != "" {
			return nil, classified.Errorf(classified.KindFailedPrecondition, "volume %s is in pool %s, which this node leaves out: %s; serve it again to delete the volume", id, missing.Name(), why)
		}
		return nil, classified.Errorf(classified.KindFailedPrecondition, "volume %s is in pool %s, which this node no longer has: configure the pool again (--pool) to delete it", id, missing.Name())
	}
	if c.stages != nil {
		if _, err := c.stages.WithdrawIdleStage(ctx, id); err != nil {
			return nil, err
		}
	}
	if err := p.Within(func(pr pool.Promise) error { return c.deleteWithin(p, pr, id) }); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// deleteWithin deletes volume id within the promise pr of its pool p,
// unless it is being restored, staged or published.
func (c *Controller) deleteWithin(p *pool.Pool, pr pool.Promise, id string) error {
	if r := p.RestoreOf(id); r != nil {
		return classified.Errorf(classified.KindAborted, "volume %s is being restored from snapshot %s; delete it once the restore has ended", id, r.SnapshotID())
	}
	if _, err := c.store.Update(id, func(v *state.Volume) error { return v.StartRemoval() }); err != nil {
		return err
	}
	// The record says the removal started; the image is still there.
	// gofail: var controllerDeleteAfterMark struct{}
	return pr.Remove(id)
}

func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, classified.Errorf(classified.KindInvalidArgument, "volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, classified.Errorf(classified.KindInvalidArgument, "volume capabilities are required")
	}
	if err := contract.CheckID("volume", id, contract.Finds); err != nil {
		return nil, err
	}
	p, missing := c.pools.ForVolume(id)
	if missing != nil {
		return nil, state.NotFound(id)
	}
	if _, err := p.ImageSize(id); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, state.NotFound(id)
		}
		return nil, classified.Errorf(classified.KindInternal, "%w", err)
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if _, err := capability.Parse(vc); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// pageStart checks a List call's paging and returns the ID its page starts
// after ("" for the first page): the token is listTokenPrefix and the last
// ID of the page before.
func pageStart(maxEntries int32, token string) (after string, err error) {
	if maxEntries < 0 {
		return "", classified.Errorf(classified.KindInvalidArgument, "max entries must not be negative")
	}
	if token == "" {
		return "", nil
	}
	id, ok := strings.CutPrefix(token, listTokenPrefix)
	if !ok || contract.ValidID(id) != nil {
		return "", classified.Errorf(classified.KindAborted, "invalid starting token %q", token)
	}
	return id, nil
}

// ListVolumes pages through the images of every pool in ID order.
func (c *Controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	after, err := pageStart(req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	where, err := c.pools.Images()
	if err != nil {
		return nil, err
	}
	ids := slices.Sorted(maps.Keys(where))
	start := sort.SearchStrings(ids, after)
	if start < len(ids) && ids[start] == after {
		start++
	}
	resp := &csi.ListVolumesResponse{}
	for _, id := range ids[start:] {
		if req.GetMaxEntries() > 0 && len(resp.Entries) == int(req.GetMaxEntries()) {
			resp.NextToken = listTokenPrefix + resp.Entries[len(resp.Entries)-1].Volume.VolumeId
			break
		}
		size, err := where[id].ImageSize(id)
		if err != nil {
			continue // deleted meanwhile
		}
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: c.volume(id, size)})
	}
	return resp, nil
}

// GetCapacity reports what the pool the parameters name (the default
// pool unless they name one) can still promise to a volume of the
// provisioning they ask for (thick unless they say thin): exactly what
// CreateVolume would accept now. Capabilities this plugin does not serve,
// another node's topology, or a pool this node does not have, have none.
func (c *Controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	prov, err := parseProvisioning(req.GetParameters())
	if err != nil {
		return nil, err
	}
	p, err := c.parsePool(req.GetParameters())
	if err != nil {
		if classified.AsError(err).Kind == classified.KindResourceExhausted {
			return &csi.GetCapacityResponse{}, nil // no such pool here
		}
		return nil, err
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if _, err := capability.Parse(vc); err != nil {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	if seg := req.GetAccessibleTopology().GetSegments(); seg != nil && seg[contract.TopologyKey] != c.topology[contract.TopologyKey] {
		return &csi.GetCapacityResponse{}, nil
	}
	avail, largest, err := p.Available(prov == state.ProvisionThin)
	if err != nil {
		return nil, err
	}
	return &csi.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}

// Package controller is converge's node-local CSI Controller service: each
// node's plugin creates, grows and deletes the image files of its own data
// directory, and reports what it can still hold.
package controller

import (
	"context"
	"errors"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/nodeserver"
	"github.com/converge-csi/converge/pkg/state"
)

const (
	// TopologyKey is the topology segment that pins a volume to its node.
	TopologyKey = "topology.converge.csi.dev/node"
	// DefaultVolumeSize is the size of a volume created without a
	// capacity range.
	DefaultVolumeSize = 1 << 30
	// MinVolumeSize is the smallest volume: room for an ext4 journal.
	MinVolumeSize = 16 << 20
	// sizeAlign keeps images a whole number of 4 KiB blocks, so the loop
	// device and every filesystem block size divide them.
	sizeAlign = 4096
	// listTokenPrefix marks a ListVolumes token: the token is the prefix
	// and the last volume ID of the previous page.
	listTokenPrefix = "after:"
	// k8sParamPrefix is the prefix of parameters the external-provisioner
	// itself adds (PVC and PV names with --extra-create-metadata); they
	// carry no meaning for the plugin.
	k8sParamPrefix = "csi.storage.k8s.io/"
)

// Store is what the controller needs of the store.
type Store interface {
	Get(id string) (*state.Volume, error)
	Update(id string, fn func(v *state.Volume) error) (*state.Volume, error)
	DropFinals(id string)
}

// controller implements the node-local csi.ControllerServer: volumes are
// sparse image files in the data directory of this node.
type controller struct {
	csi.UnimplementedControllerServer
	images   *devices.Images
	store    Store
	topology map[string]string

	// mu serialises CreateVolume and DeleteVolume so a name is never
	// created and deleted at once.
	mu sync.Mutex
}

// New returns the Controller service over the images of this node's data
// directory; topology is this node's segment (TopologyKey: the node's
// name).
func New(images *devices.Images, store Store, topology map[string]string) csi.ControllerServer {
	return &controller{images: images, store: store, topology: topology}
}

func (c *controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume creates a sparse image named after the volume. It is
// idempotent by name: an existing image within the capacity range is
// returned; one outside it is ALREADY_EXISTS.
func (c *controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "name is required")
	}
	if err := state.ValidID(name); err != nil {
		return nil, state.Errorf(state.KindInvalidArgument, "name: %w", err)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	var unknown []string
	for k := range req.GetParameters() {
		if !strings.HasPrefix(k, k8sParamPrefix) && k != nodeserver.MkfsOptionsKey {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, state.Errorf(state.KindInvalidArgument, "unknown parameters: %s", strings.Join(unknown, ", "))
	}
	// mkfs options are checked now, for the filesystem the volume will
	// carry, and handed to the node in the volume's attributes.
	volumeContext := map[string]string{}
	if opts, ok := req.GetParameters()[nodeserver.MkfsOptionsKey]; ok {
		fsType := req.GetParameters()[k8sParamPrefix+"fstype"]
		for _, c := range req.GetVolumeCapabilities() {
			if fs := c.GetMount().GetFsType(); fs != "" {
				fsType = fs
			}
		}
		if _, err := nodeserver.CheckMkfsOptions(fsType, opts); err != nil {
			return nil, state.Errorf(state.KindInvalidArgument, "%w", err)
		}
		volumeContext[nodeserver.MkfsOptionsKey] = opts
	}
	if req.GetVolumeContentSource() != nil {
		return nil, state.Errorf(state.KindInvalidArgument, "snapshots and cloning are not supported")
	}
	if err := c.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	size, err := c.sizeFor(required, limit, 0)
	if err != nil {
		return nil, err
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if v, err := c.store.Get(name); err == nil && v.Removing {
		// A deletion of the name that a crash interrupted: its image is
		// not this volume's.
		if err := c.finishRemoval(name); err != nil {
			return nil, err
		}
	}
	if cur, err := c.images.Size(name); err == nil {
		if cur < required || limit > 0 && cur > limit {
			return nil, state.Errorf(state.KindAlreadyExists, "volume %s exists with %d bytes, outside the requested range [%d, %d]", name, cur, required, limit)
		}
		return c.response(name, cur, volumeContext), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, state.Errorf(state.KindInternal, "checking volume %s: %w", name, err)
	}
	if err := c.images.Create(name, size); err != nil {
		if state.NoSpace(err) {
			return nil, state.Errorf(state.KindResourceExhausted, "creating volume %s: %w", name, err)
		}
		return nil, state.Errorf(state.KindInternal, "creating volume %s: %w", name, err)
	}
	return c.response(name, size, volumeContext), nil
}

func (c *controller) response(id string, size int64, volumeContext map[string]string) *csi.CreateVolumeResponse {
	v := c.volume(id, size)
	if len(volumeContext) > 0 {
		v.VolumeContext = volumeContext
	}
	return &csi.CreateVolumeResponse{Volume: v}
}

func (c *controller) volume(id string, size int64) *csi.Volume {
	return &csi.Volume{
		VolumeId:           id,
		CapacityBytes:      size,
		AccessibleTopology: []*csi.Topology{{Segments: c.topology}},
	}
}

// sizeFor picks the image size for a capacity range, for an image that has
// have bytes now (0 for a new one).
func (c *controller) sizeFor(required, limit, have int64) (int64, error) {
	if required < 0 || limit < 0 {
		return 0, state.Errorf(state.KindInvalidArgument, "capacity range must not be negative")
	}
	if limit > 0 && required > limit {
		return 0, state.Errorf(state.KindOutOfRange, "required bytes %d exceed limit bytes %d", required, limit)
	}
	size := max(required, MinVolumeSize)
	if required == 0 {
		size = DefaultVolumeSize
		if limit > 0 {
			size = min(size, limit)
		}
	}
	if size > (1 << 62) {
		return 0, state.Errorf(state.KindOutOfRange, "%d bytes is more than this node can hold", size)
	}
	size = (size + sizeAlign - 1) / sizeAlign * sizeAlign
	if limit > 0 && size > limit {
		return 0, state.Errorf(state.KindOutOfRange, "no size of whole 4 KiB blocks of at least %d bytes fits in the limit of %d bytes", MinVolumeSize, limit)
	}
	total, avail, err := c.images.Capacity()
	if err != nil {
		return 0, state.Errorf(state.KindInternal, "%w", err)
	}
	if size > total {
		return 0, state.Errorf(state.KindOutOfRange, "%d bytes is more than the %d bytes of the data directory's filesystem", size, total)
	}
	if size-have > avail {
		// Images are sparse, but a volume is only promised what is free
		// when it is made or grown, as GetCapacity reports.
		return 0, state.Errorf(state.KindResourceExhausted, "%d more bytes requested, the data directory has %d bytes free", size-have, avail)
	}
	return size, nil
}

// checkTopology fails when the requisite topology excludes this node.
func (c *controller) checkTopology(req *csi.TopologyRequirement) error {
	if len(req.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range req.GetRequisite() {
		if v, ok := t.GetSegments()[TopologyKey]; ok && v == c.topology[TopologyKey] {
			return nil
		}
	}
	return state.Errorf(state.KindResourceExhausted, "requisite topology does not include this node (%s=%s)", TopologyKey, c.topology[TopologyKey])
}

func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return state.Errorf(state.KindInvalidArgument, "volume capabilities are required")
	}
	for _, vc := range caps {
		if _, err := nodeserver.ParseCapability(vc); err != nil {
			return state.Errorf(state.KindInvalidArgument, "%w", err)
		}
	}
	return nil
}

// ControllerExpandVolume grows a volume's image (sparse) to the requested
// capacity; the node then grows the device and the filesystem. An image
// already that large is left as it is (images never shrink). It may run
// while the volume is staged and published: growth is online.
func (c *controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "volume ID is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, state.Errorf(state.KindInvalidArgument, "capacity range is required")
	}
	if state.ValidID(id) != nil {
		return nil, state.NotFound(id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, err := c.images.Size(id)
	if errors.Is(err, os.ErrNotExist) {
		return nil, state.NotFound(id)
	}
	if err != nil {
		return nil, state.Errorf(state.KindInternal, "checking volume %s: %w", id, err)
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if limit > 0 && cur > limit {
		return nil, state.Errorf(state.KindOutOfRange, "volume %s already holds %d bytes, more than the limit %d; volumes never shrink", id, cur, limit)
	}
	size, err := c.sizeFor(max(required, cur), limit, cur)
	if err != nil {
		return nil, err
	}
	size, err = c.images.Grow(id, size)
	if err != nil {
		if state.NoSpace(err) {
			return nil, state.Errorf(state.KindResourceExhausted, "growing volume %s: %w", id, err)
		}
		return nil, state.Errorf(state.KindInternal, "growing volume %s: %w", id, err)
	}
	// The node grows the loop device and the filesystem (or, for a raw
	// block volume, the device).
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

// DeleteVolume removes a volume's image and record. It refuses while the
// volume is staged or published; an unknown volume is a no-op.
func (c *controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "volume ID is required")
	}
	if state.ValidID(id) != nil {
		return &csi.DeleteVolumeResponse{}, nil // no such volume can exist
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The record is marked first, so that no stage intent can slip in
	// while the image goes, and a crash in between leaves a mark the next
	// DeleteVolume or CreateVolume of the name finishes.
	if _, err := c.store.Update(id, func(v *state.Volume) error { return v.StartRemoval() }); err != nil {
		return nil, nodeserver.Status(err)
	}
	if err := c.finishRemoval(id); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// finishRemoval removes the image of a volume marked as being removed and
// then forgets the volume.
func (c *controller) finishRemoval(id string) error {
	if err := c.images.Delete(id); err != nil {
		return state.Errorf(state.KindInternal, "deleting image of %s: %w", id, err)
	}
	if _, err := c.store.Update(id, func(v *state.Volume) error { v.FinishRemoval(); return nil }); err != nil {
		return err
	}
	c.store.DropFinals(id)
	return nil
}

func (c *controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, state.Errorf(state.KindInvalidArgument, "volume capabilities are required")
	}
	if state.ValidID(id) != nil {
		return nil, state.NotFound(id)
	}
	if _, err := c.images.Size(id); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, state.NotFound(id)
		}
		return nil, state.Errorf(state.KindInternal, "%w", err)
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if _, err := nodeserver.ParseCapability(vc); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes pages through the images in ID order.
func (c *controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, state.Errorf(state.KindInvalidArgument, "max entries must not be negative")
	}
	after := ""
	if tok := req.GetStartingToken(); tok != "" {
		id, ok := strings.CutPrefix(tok, listTokenPrefix)
		if !ok || state.ValidID(id) != nil {
			return nil, state.Errorf(state.KindAborted, "invalid starting token %q", tok)
		}
		after = id
	}
	ids, err := c.images.List()
	if err != nil {
		return nil, state.Errorf(state.KindInternal, "listing volumes: %w", err)
	}
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
		size, err := c.images.Size(id)
		if err != nil {
			continue // deleted meanwhile
		}
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: c.volume(id, size)})
	}
	return resp, nil
}

// GetCapacity reports the free space of the data directory's filesystem.
func (c *controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, vc := range req.GetVolumeCapabilities() {
		if _, err := nodeserver.ParseCapability(vc); err != nil {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	if seg := req.GetAccessibleTopology().GetSegments(); seg != nil && seg[TopologyKey] != c.topology[TopologyKey] {
		return &csi.GetCapacityResponse{}, nil
	}
	_, avail, err := c.images.Capacity()
	if err != nil {
		return nil, state.Errorf(state.KindInternal, "%w", err)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: avail}, nil
}

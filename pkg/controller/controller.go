// Package controller is converge's node-local CSI Controller service: each
// node's plugin creates, grows and deletes the image files of its own data
// directory, and reports what it can still hold.
package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/capacity"
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
	// ProvisioningKey is the StorageClass parameter that chooses how a
	// volume's image holds its space: "thick" (the default) or "thin".
	ProvisioningKey = "converge.csi.dev/provisioning"
)

// parseProvisioning reads the provisioning a request's parameters ask for.
func parseProvisioning(params map[string]string) (state.Provisioning, error) {
	switch p, ok := params[ProvisioningKey]; {
	case !ok || p == string(state.ProvisionThick):
		return state.ProvisionThick, nil
	case p == string(state.ProvisionThin):
		return state.ProvisionThin, nil
	default:
		return "", state.Errorf(state.KindInvalidArgument, "%s: unknown value %q: want %q or %q", ProvisioningKey, p, state.ProvisionThick, state.ProvisionThin)
	}
}

// Options are the controller's capacity policy.
type Options struct {
	// Ratio is the overprovisioning ratio of thin volumes (at least 1).
	Ratio float64
	// Guard is the free space of the data directory below which no thin
	// volume is created or grown.
	Guard capacity.Guard
	// SnapshotTopology names this node in every Snapshot answered: the
	// alpha field accessible_topology, which CSI allows only beside the
	// SNAPSHOT_ACCESSIBILITY_CONSTRAINTS plugin capability.
	SnapshotTopology bool
}

// Store is what the controller needs of the store.
type Store interface {
	Get(id string) (*state.Volume, error)
	List() []*state.Volume
	Update(id string, fn func(v *state.Volume) error) (*state.Volume, error)
	DropFinals(id string)
}

// Controller implements the node-local csi.ControllerServer: volumes are
// image files in the data directory of this node, thick or thin. It also
// grows images for the node's reconciler (GrowImage), under the same lock
// and the same promise as CreateVolume.
type Controller struct {
	csi.UnimplementedControllerServer
	images   *devices.Images
	store    Store
	topology map[string]string
	opts     Options
	// snapshots is nil unless ServeSnapshots was called.
	snapshots *snapshotService

	// mu serialises CreateVolume, DeleteVolume and GrowImage, so that a
	// name is never created and deleted at once, and no two of them promise
	// the same free space. A restore is registered and ended under it.
	mu sync.Mutex
	// restoresMu guards restores, the volumes being copied from a
	// snapshot, by ID; it is taken alone, or inside mu. A copy
	// may take minutes (a sparse copy of many gigabytes), longer than a
	// request waits (external-provisioner's --timeout is 10 s by default):
	// it goes on without mu and past the request that started it, and the
	// retries of the request wait for it.
	restoresMu sync.Mutex
	restores   map[string]*restore
	// restoreImage copies a snapshot into a volume's image (restore; the
	// tests hold it up).
	restoreImage func(ctx context.Context, id string, snap devices.SnapshotInfo, size int64, thick bool) error
}

// restore is a volume being copied from a snapshot.
type restore struct {
	snapshot string
	// source is the data of the snapshot (its allocated bytes), which
	// the copy reads.
	source int64
	// size and thin are what the volume is promised while it is copied.
	size int64
	thin bool
	// done is closed when the copy has ended, err set before.
	done chan struct{}
	err  error
}

// New returns the Controller service over the images of this node's data
// directory; topology is this node's segment (TopologyKey: the node's
// name).
func New(images *devices.Images, store Store, topology map[string]string, opts Options) *Controller {
	c := &Controller{images: images, store: store, topology: topology, opts: opts, restores: map[string]*restore{}}
	c.restoreImage = c.restore
	return c
}

func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	}
	if c.snapshots != nil {
		types = append(types, csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
			csi.ControllerServiceCapability_RPC_CLONE_VOLUME)
	}
	for _, t := range types {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume creates an image for the volume, thick (every block
// allocated) unless the parameters ask for a thin one, once the data
// directory can promise its size. The volume's ID is its name and this
// node's (localID), the image named after it. It is idempotent by name: an
// existing volume of that name within the capacity range and of the same
// provisioning is returned; another is ALREADY_EXISTS. A volume made
// before volume IDs named their node keeps its name as its ID.
func (c *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "name is required")
	}
	if err := state.ValidID(name); err != nil {
		return nil, state.Errorf(state.KindInvalidArgument, "name: %w", err)
	}
	id := c.localID(name)
	if state.ValidID(id) != nil || c.legacy(name, id) {
		// An ID that cannot hold the node's name beside this one (a node
		// name over about 110 bytes), or a volume made before IDs named
		// their node: the ID is the name.
		id = name
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	var unknown []string
	for k := range req.GetParameters() {
		if !strings.HasPrefix(k, k8sParamPrefix) && k != nodeserver.MkfsOptionsKey && k != ProvisioningKey {
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
	prov, err := parseProvisioning(req.GetParameters())
	if err != nil {
		return nil, err
	}
	// A copy an earlier request began: wait for it (a clone would take
	// its snapshot again).
	if r := c.restoring(id); r != nil {
		return c.awaitRestore(ctx, req, id, r)
	}
	var snap *devices.SnapshotInfo
	release := func() {}
	defer func() { release() }()
	switch src := req.GetVolumeContentSource(); {
	case src == nil:
	case src.GetSnapshot() != nil:
		info, err := c.restoreSource(src.GetSnapshot().GetSnapshotId())
		if err != nil {
			return nil, err
		}
		if err := checkRestoreFs(info, req.GetParameters(), req.GetVolumeCapabilities()); err != nil {
			return nil, err
		}
		snap = &info
	case src.GetVolume() != nil:
		if _, err := c.images.Size(id); err == nil {
			break // made already: answered below, as any volume is
		}
		info, done, err := c.cloneSource(ctx, src.GetVolume().GetVolumeId(), name)
		if err != nil {
			return nil, err
		}
		release = done
		snap = &info
	default:
		return nil, state.Errorf(state.KindInvalidArgument, "unknown volume content source")
	}
	if err := c.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	size, err := sizeFor(required, limit)
	if err != nil {
		return nil, err
	}
	if snap != nil {
		// A volume made from a snapshot holds at least the snapshot's
		// image: its size unless more is asked for, never less.
		if required == 0 && (limit == 0 || limit >= snap.Size) {
			size = snap.Size
		}
		if size < snap.Size {
			return nil, state.Errorf(state.KindOutOfRange, "a volume of %d bytes cannot hold snapshot %s of %d bytes", size, snap.ID, snap.Size)
		}
	}

	c.mu.Lock()
	locked := true
	defer func() {
		if locked {
			c.mu.Unlock()
		}
	}()
	if r := c.restoring(id); r != nil {
		c.mu.Unlock()
		locked = false
		return c.awaitRestore(ctx, req, id, r)
	}
	v, err := c.store.Get(id)
	if err == nil && v.Removing {
		// A deletion of the name that a crash interrupted: its image is
		// not this volume's.
		if err := c.finishRemoval(id); err != nil {
			return nil, err
		}
		v = nil
	}
	if cur, err := c.images.Size(id); err == nil {
		if id != name && (v == nil || v.Name != name) {
			// The image of another volume: one made before volume IDs
			// named their node, under a name that is this one's ID.
			return nil, state.Errorf(state.KindAlreadyExists, "volume ID %s of the name %s is taken by another volume", id, name)
		}
		if cur < required || limit > 0 && cur > limit {
			return nil, state.Errorf(state.KindAlreadyExists, "volume %s exists with %d bytes, outside the requested range [%d, %d]", name, cur, required, limit)
		}
		if v != nil && v.Provisioning != "" && v.Provisioning != prov {
			return nil, state.Errorf(state.KindAlreadyExists, "volume %s exists as a %s volume, %s was asked for", name, v.Provisioning, prov)
		}
		return c.response(id, cur, volumeContext, req.GetVolumeContentSource()), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, state.Errorf(state.KindInternal, "checking volume %s: %w", name, err)
	}
	if err := c.promise(prov == state.ProvisionThin, size, 0); err != nil {
		return nil, err
	}
	// The record comes first, so that the image is never accounted as
	// another provisioning than it was made with; a crash before the image
	// leaves a record that accounts for nothing, and the retry of the
	// request makes the image.
	// The name too: it tells this volume's image from one that a volume
	// made before IDs named their node left under this ID.
	if _, err := c.store.Update(id, func(v *state.Volume) error {
		v.Provisioning = prov
		if id != name {
			v.Name = name
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if snap != nil {
		r := c.startRestore(id, name, *snap, size, prov, release)
		release = func() {}
		c.mu.Unlock()
		locked = false
		return c.awaitRestore(ctx, req, id, r)
	}
	if err = c.images.Create(id, size, prov == state.ProvisionThick); err != nil {
		err = imageError(err, "creating volume %s", id)
	}
	if err != nil {
		c.store.Update(id, func(v *state.Volume) error { v.Provisioning, v.Name = "", ""; return nil })
		return nil, err
	}
	klog.V(2).InfoS("Created volume", "volumeID", id, "name", name, "bytes", size, "provisioning", prov)
	return c.response(id, size, volumeContext, req.GetVolumeContentSource()), nil
}

// startRestore starts copying snapshot snap into the image of volume id,
// of size bytes, in the background, and registers the copy; c.mu is held.
// The copy goes on whatever becomes of the request: it ends whole or
// absent (devices.CopyFile), and on failure the record's provisioning is
// cleared as for any volume not made. release runs when the copy has
// ended.
func (c *Controller) startRestore(id, name string, snap devices.SnapshotInfo, size int64, prov state.Provisioning, release func()) *restore {
	r := &restore{snapshot: snap.ID, source: snap.Allocated, size: size, thin: prov == state.ProvisionThin, done: make(chan struct{})}
	c.restoresMu.Lock()
	c.restores[id] = r
	c.restoresMu.Unlock()
	klog.InfoS("Restoring volume from snapshot; the copy goes on past the request", "volumeID", id, "snapshotID", snap.ID, "bytes", size, "snapshotAllocatedBytes", snap.Allocated)
	go func() {
		defer release()
		err := c.restoreImage(context.Background(), id, snap, size, prov == state.ProvisionThick)
		c.mu.Lock()
		c.restoresMu.Lock()
		delete(c.restores, id)
		c.restoresMu.Unlock()
		if err != nil {
			c.store.Update(id, func(v *state.Volume) error { v.Provisioning, v.Name = "", ""; return nil })
			klog.ErrorS(err, "Restore failed", "volumeID", id, "snapshotID", snap.ID)
		} else {
			klog.InfoS("Restored volume from snapshot", "volumeID", id, "name", name, "bytes", size, "provisioning", prov, "snapshotID", snap.ID)
		}
		r.err = err
		c.mu.Unlock()
		close(r.done)
	}()
	return r
}

// restoring returns the restore of volume id under way, or nil.
func (c *Controller) restoring(id string) *restore {
	c.restoresMu.Lock()
	defer c.restoresMu.Unlock()
	return c.restores[id]
}

// awaitRestore waits for the restore r of volume id to end, then answers
// req as a request finding the volume made (or the restore's failure).
// When ctx ends first the restore goes on, and the answer says so: the
// retry of the request finds it.
func (c *Controller) awaitRestore(ctx context.Context, req *csi.CreateVolumeRequest, id string, r *restore) (*csi.CreateVolumeResponse, error) {
	select {
	case <-r.done:
		if r.err != nil {
			return nil, r.err
		}
		return c.CreateVolume(ctx, req)
	case <-ctx.Done():
		return nil, fmt.Errorf("volume %s is still being restored from snapshot %s; the restore goes on, and a retry of the request finds it: %w", id, r.snapshot, ctx.Err())
	}
}

// legacy reports whether the volume named name was made before volume IDs
// named their node: it has no image under id, the ID it would have now,
// and an image under its name.
func (c *Controller) legacy(name, id string) bool {
	if _, err := c.images.Size(id); !errors.Is(err, os.ErrNotExist) {
		return false
	}
	_, err := c.images.Size(name)
	return err == nil
}

// imageError classifies a failure to size an image: no space is
// RESOURCE_EXHAUSTED, a filesystem that cannot allocate ahead of writes is
// FAILED_PRECONDITION, and anything else INTERNAL.
func imageError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	switch {
	case state.NoSpace(err):
		return state.Errorf(state.KindResourceExhausted, "%s: %w", msg, err)
	case errors.Is(err, devices.ErrCannotAllocate):
		return state.Errorf(state.KindFailedPrecondition, "%s: %w; thick volumes cannot be kept here, ask for %s: %s", msg, err, ProvisioningKey, state.ProvisionThin)
	}
	return state.Errorf(state.KindInternal, "%s: %w", msg, err)
}

func (c *Controller) response(id string, size int64, volumeContext map[string]string, source *csi.VolumeContentSource) *csi.CreateVolumeResponse {
	v := c.volume(id, size)
	if len(volumeContext) > 0 {
		v.VolumeContext = volumeContext
	}
	v.ContentSource = source
	return &csi.CreateVolumeResponse{Volume: v}
}

func (c *Controller) volume(id string, size int64) *csi.Volume {
	return &csi.Volume{
		VolumeId:           id,
		CapacityBytes:      size,
		AccessibleTopology: c.accessible(),
	}
}

// accessible is where a volume or snapshot of this node can be used: on
// this node alone.
func (c *Controller) accessible() []*csi.Topology {
	return []*csi.Topology{{Segments: c.topology}}
}

// sizeFor picks the image size for a capacity range.
func sizeFor(required, limit int64) (int64, error) {
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
	return size, nil
}

// Account is the state of the data directory as CreateVolume and
// GetCapacity see it, with the filesystem's size: the volumes being
// restored are promised their size.
func (c *Controller) Account() (capacity.Account, int64, error) { return c.account() }

// Restoring is a volume being copied from a snapshot, promised Bytes.
type Restoring struct {
	VolumeID, SnapshotID string
	// Bytes is the volume's size, promised to it until it is made.
	Bytes int64
	// Copied is what the copy holds so far, at most SourceBytes, the
	// snapshot's data: Copied of SourceBytes tells how far it is (a thick
	// copy then allocates the rest of its size).
	Copied, SourceBytes int64
}

// Restoring lists the volumes being copied from a snapshot, by ID, with
// how far each copy is (Copied 0 when that cannot be read).
func (c *Controller) Restoring() []Restoring {
	c.restoresMu.Lock()
	out := make([]Restoring, 0, len(c.restores))
	for id, r := range c.restores {
		out = append(out, Restoring{VolumeID: id, SnapshotID: r.snapshot, Bytes: r.size, SourceBytes: r.source})
	}
	c.restoresMu.Unlock()
	for i, r := range out {
		if u, err := c.images.Copying(r.VolumeID); err == nil {
			out[i].Copied = min(u.Allocated, r.SourceBytes)
		}
	}
	slices.SortFunc(out, func(a, b Restoring) int { return strings.Compare(a.VolumeID, b.VolumeID) })
	return out
}

// account derives the state of the data directory.
func (c *Controller) account() (capacity.Account, int64, error) {
	var mode devices.CopyMode
	if c.snapshots != nil {
		mode = c.snapshots.snaps.Mode
	}
	c.restoresMu.Lock()
	restoring := make(map[string]capacity.Image, len(c.restores))
	for id, r := range c.restores {
		restoring[id] = capacity.Image{Size: r.size, Thin: r.thin}
	}
	c.restoresMu.Unlock()
	return account(c.images, c.store, c.opts.Ratio, mode, restoring)
}

// Account derives the state of the data directory from its images and
// their records, for thin volumes at ratio and snapshots copied as mode
// says, and returns it with the filesystem's size.
func Account(images *devices.Images, store Store, ratio float64, mode devices.CopyMode) (capacity.Account, int64, error) {
	return account(images, store, ratio, mode, nil)
}

// account is Account with the volumes being restored (by ID), which are
// promised their size (and provisioning) already: a restore's copy is not
// an image yet. Until it is, it is accounted as an image of that size
// holding what the copy wrote so far, which the free space no longer
// counts; once it is, the image counts itself. The images are listed
// before the copies are looked at, so a copy renamed to its image in
// between is counted once, whole, rather than twice.
func account(images *devices.Images, store Store, ratio float64, mode devices.CopyMode, restoring map[string]capacity.Image) (capacity.Account, int64, error) {
	total, free, err := images.Capacity()
	if err != nil {
		return capacity.Account{}, 0, err
	}
	usages, err := images.Usages()
	if err != nil {
		return capacity.Account{}, 0, fmt.Errorf("listing images: %w", err)
	}
	ims := make([]capacity.Image, 0, len(usages)+len(restoring))
	made := make(map[string]bool, len(usages))
	for _, u := range usages {
		im := capacity.Image{Size: u.Size, Allocated: u.Allocated, Shared: u.Shared}
		if v, err := store.Get(u.ID); err == nil {
			im.Thin = v.Thin()
			im.Copying = int64(len(v.Snapshots)) * snapshotNeed(mode, u, v.Thin())
		}
		ims = append(ims, im)
		made[u.ID] = true
	}
	for id, im := range restoring {
		if made[id] {
			continue
		}
		if u, err := images.Copying(id); err == nil {
			im.Allocated, im.Shared = u.Allocated, u.Shared
		} else {
			// Unknown: the whole size stays owed.
			klog.ErrorS(err, "Cannot tell what a restore copied so far; counting its whole size", "volumeID", id)
		}
		ims = append(ims, im)
	}
	return capacity.New(free, ratio, ims), total, nil
}

// promise checks that an image of have bytes may grow to size bytes (have
// 0: a new one), thin or thick: RESOURCE_EXHAUSTED when the data directory
// cannot hold it, or for a thin volume when its pool is nearly full;
// OUT_OF_RANGE when no data directory of this node ever could.
func (c *Controller) promise(thin bool, size, have int64) error {
	acc, total, err := c.account()
	if err != nil {
		return state.Errorf(state.KindInternal, "%w", err)
	}
	if size > total {
		return state.Errorf(state.KindOutOfRange, "%d bytes is more than the %d bytes of the data directory's filesystem", size, total)
	}
	kind := state.ProvisionThick
	if thin {
		kind = state.ProvisionThin
		if guard := c.opts.Guard.Threshold(total); acc.Free < guard {
			return state.Errorf(state.KindResourceExhausted, "the data directory is nearly full (%d bytes free, below the guard of %d bytes): no thin volume is created or grown", acc.Free, guard)
		}
	}
	if avail := acc.Available(thin); size-have > avail {
		return state.Errorf(state.KindResourceExhausted, "%d more bytes requested, %d bytes can still be promised to a %s volume (%d bytes free, %d owed to thick volumes, %d promised to thin volumes at an overprovisioning ratio of %g)",
			size-have, avail, kind, acc.Free, acc.ThickOwed, acc.ThinPromised, c.opts.Ratio)
	}
	return nil
}

// checkTopology fails when the requisite topology excludes this node.
func (c *Controller) checkTopology(req *csi.TopologyRequirement) error {
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

// GrowImage grows id's image to at least size bytes (in whole 4 KiB
// blocks), allocating the new space of a thick volume, once the data
// directory can promise it, and returns the image's size. An image already
// that large is left as it is: images never shrink. The node's reconciler
// calls it for NodeExpandVolume, while the volume is staged: the device and
// the filesystem grow after it. A missing image is NOT_FOUND; a size the
// data directory cannot hold now is RESOURCE_EXHAUSTED, one it never could
// OUT_OF_RANGE.
func (c *Controller) GrowImage(id string, size int64) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, err := c.images.Size(id)
	if errors.Is(err, os.ErrNotExist) {
		return 0, state.NotFound(id)
	}
	if err != nil {
		return 0, state.Errorf(state.KindInternal, "checking volume %s: %w", id, err)
	}
	if size <= cur {
		return cur, nil
	}
	size, err = sizeFor(size, 0)
	if err != nil {
		return 0, err
	}
	thin := false
	if v, err := c.store.Get(id); err == nil {
		thin = v.Thin()
	}
	if err := c.promise(thin, size, cur); err != nil {
		return 0, err
	}
	size, err = c.images.Grow(id, size, !thin)
	if err != nil {
		return 0, imageError(err, "growing volume %s", id)
	}
	klog.V(2).InfoS("Grew volume image", "volumeID", id, "from", cur, "bytes", size, "thin", thin)
	return size, nil
}

// ControllerExpandVolume grows a volume whose image is on this node, as
// GrowImage does (the new space of a thick volume allocated, never
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
		return nil, state.Errorf(state.KindInvalidArgument, "volume ID is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, state.Errorf(state.KindInvalidArgument, "capacity range is required")
	}
	if state.ValidID(id) != nil {
		return nil, state.NotFound(id)
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	size, err := sizeFor(required, limit)
	if err != nil {
		return nil, err
	}
	cur, err := c.images.Size(id)
	switch {
	case errors.Is(err, os.ErrNotExist):
		klog.V(2).InfoS("Volume is not on this node; its node grows it in NodeExpandVolume", "volumeID", id, "bytes", size)
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
	case err != nil:
		return nil, state.Errorf(state.KindInternal, "checking volume %s: %w", id, err)
	case limit > 0 && cur > limit:
		return nil, state.Errorf(state.KindOutOfRange, "volume %s already holds %d bytes, more than the limit %d; volumes never shrink", id, cur, limit)
	}
	size, err = c.GrowImage(id, size)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

// DeleteVolume removes a volume's image and record. It refuses while the
// volume is staged or published; an unknown volume is a no-op.
func (c *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "volume ID is required")
	}
	if state.ValidID(id) != nil {
		return &csi.DeleteVolumeResponse{}, nil // no such volume can exist
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.restoring(id); r != nil {
		return nil, state.Errorf(state.KindAborted, "volume %s is being restored from snapshot %s; delete it once the restore has ended", id, r.snapshot)
	}
	// The record is marked first, so that no stage intent can slip in
	// while the image goes, and a crash in between leaves a mark the next
	// DeleteVolume or CreateVolume of the name finishes.
	if _, err := c.store.Update(id, func(v *state.Volume) error { return v.StartRemoval() }); err != nil {
		return nil, err
	}
	if err := c.finishRemoval(id); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// finishRemoval removes the image of a volume marked as being removed and
// then forgets the volume.
func (c *Controller) finishRemoval(id string) error {
	if err := c.images.Delete(id); err != nil {
		return state.Errorf(state.KindInternal, "deleting image of %s: %w", id, err)
	}
	if _, err := c.store.Update(id, func(v *state.Volume) error { v.FinishRemoval(); return nil }); err != nil {
		return err
	}
	c.store.DropFinals(id)
	return nil
}

func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
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

// pageStart checks a List call's paging and returns the ID its page starts
// after ("" for the first page): the token is listTokenPrefix and the last
// ID of the page before.
func pageStart(maxEntries int32, token string) (after string, err error) {
	if maxEntries < 0 {
		return "", state.Errorf(state.KindInvalidArgument, "max entries must not be negative")
	}
	if token == "" {
		return "", nil
	}
	id, ok := strings.CutPrefix(token, listTokenPrefix)
	if !ok || state.ValidID(id) != nil {
		return "", state.Errorf(state.KindAborted, "invalid starting token %q", token)
	}
	return id, nil
}

// ListVolumes pages through the images in ID order.
func (c *Controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	after, err := pageStart(req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
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

// GetCapacity reports what the data directory can still promise to a
// volume of the provisioning the parameters ask for (thick unless they say
// thin): exactly what CreateVolume would accept now.
func (c *Controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	prov, err := parseProvisioning(req.GetParameters())
	if err != nil {
		return nil, err
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if _, err := nodeserver.ParseCapability(vc); err != nil {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	if seg := req.GetAccessibleTopology().GetSegments(); seg != nil && seg[TopologyKey] != c.topology[TopologyKey] {
		return &csi.GetCapacityResponse{}, nil
	}
	acc, total, err := c.account()
	if err != nil {
		return nil, state.Errorf(state.KindInternal, "%w", err)
	}
	thin := prov == state.ProvisionThin
	if thin && acc.Free < c.opts.Guard.Threshold(total) {
		return &csi.GetCapacityResponse{}, nil
	}
	// Thin volumes may be promised more than the filesystem holds, but no
	// one of them can be larger than it.
	avail := acc.Available(thin)
	return &csi.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(min(avail, total))}, nil
}

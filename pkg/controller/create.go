package controller

import (
	"context"
	"errors"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// CreateVolume creates an image for the volume, thick (every block
// allocated) unless the parameters ask for a thin one, once the data
// directory can promise its size; from a snapshot or another volume, by a
// copy that goes on past the request. The IO limits of its
// VolumeAttributesClass (its mutable parameters) are checked with the rest
// of the request, before anything is made, and recorded with it. The
// volume's ID is its name and this node's (localID), the image named after
// it. It is idempotent by name: an existing volume of that name within the
// capacity range, of the same provisioning and with the same IO limits is
// returned; another is ALREADY_EXISTS. A volume made
// before volume IDs named their node keeps its name as its ID.
func (c *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	r, err := c.parseCreate(req)
	if err != nil {
		return nil, err
	}
	for {
		resp, job, err := c.find(r)
		if job == nil && (resp != nil || err != nil) {
			return resp, err
		}
		if job == nil {
			resp, job, err = c.makeVolume(ctx, r)
			if job == nil {
				return resp, err
			}
		}
		// A copy made it, or an earlier request's still does: once it
		// has ended, the volume is found as any volume is.
		if err := job.Wait(ctx); err != nil {
			return nil, err
		}
	}
}

// createRequest is a CreateVolume request, checked.
type createRequest struct {
	name, id string
	// pool is the storage pool the volume is made in.
	pool *pool.Pool
	prov state.Provisioning
	rng  state.Range
	// size is what the volume is made with.
	size int64
	// fsType is the filesystem the volume will carry, "" for a raw block
	// volume.
	fsType string
	// caps are the capabilities asked for, access how they let the
	// volume be written (accessOf).
	caps   []*csi.VolumeCapability
	access state.AccessType
	// allowModeChange lets the volume be made from a source of the other
	// access type (contract.AllowModeChangeKey).
	allowModeChange bool
	// limits are the IO limits of the volume's VolumeAttributesClass (its
	// mutable parameters); none when it names none.
	limits        host.IOLimits
	volumeContext map[string]string
	source        *csi.VolumeContentSource
}

// parseCreate checks a CreateVolume request and reads what it asks for.
func (c *Controller) parseCreate(req *csi.CreateVolumeRequest) (createRequest, error) {
	name, params := req.GetName(), req.GetParameters()
	if name == "" {
		return createRequest{}, classified.Errorf(classified.KindInvalidArgument, "name is required")
	}
	if err := contract.ValidID(name); err != nil {
		return createRequest{}, classified.Errorf(classified.KindInvalidArgument, "name: %w", err)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return createRequest{}, err
	}
	if err := contract.CheckKeys("parameters", params, contract.CreateParameters()...); err != nil {
		return createRequest{}, err
	}
	// What the cluster does when this node is gone is converge-controller's
	// to carry out, and the volume's own: the class's choice (retain when
	// it names none) is recorded in the volume's attributes, which the
	// provisioner writes into its PV, so that a class made again under the
	// same name with another choice changes no volume made before it. A
	// class that names no valid choice provisions nothing.
	onLoss, err := contract.ParseOnNodeLoss(params[contract.OnNodeLossKey])
	if err != nil {
		return createRequest{}, err
	}
	caps := req.GetVolumeCapabilities()
	r := createRequest{name: name, id: c.volumeID(name), fsType: fsTypeOf(params, caps), caps: caps, access: accessOf(caps),
		rng: rangeOf(req.GetCapacityRange()), source: req.GetVolumeContentSource(),
		volumeContext: map[string]string{contract.OnNodeLossKey: string(onLoss)}}
	// mkfs options are checked now, for the filesystem the volume will
	// carry, and handed to the node in the volume's attributes.
	if opts, ok := params[contract.MkfsOptionsKey]; ok {
		if _, err := contract.CheckMkfsOptions(r.fsType, opts); err != nil {
			return createRequest{}, classified.Errorf(classified.KindInvalidArgument, "%w", err)
		}
		r.volumeContext[contract.MkfsOptionsKey] = opts
	}
	if r.prov, err = parseProvisioning(params); err != nil {
		return createRequest{}, err
	}
	if r.allowModeChange, err = parseAllowModeChange(params); err != nil {
		return createRequest{}, err
	}
	if r.pool, err = c.parsePool(params); err != nil {
		return createRequest{}, err
	}
	// A class's limits, recorded with the volume before its image is
	// made; keys it does not give are no limits.
	limits, err := contract.ParseIOLimits(req.GetMutableParameters())
	if err != nil {
		return createRequest{}, err
	}
	r.limits = limits.Apply(host.IOLimits{})
	if err := c.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return createRequest{}, err
	}
	if r.size, err = pool.SizeFor(r.rng, host.MinSize(r.fsType)); err != nil {
		return createRequest{}, err
	}
	return r, nil
}

// volumeID is the ID of the volume named name: the name and the node's
// (localID), or the name itself for an ID that cannot hold the node's
// name beside it (a node name over about 110 bytes), or for a volume made
// before IDs named their node.
func (c *Controller) volumeID(name string) string {
	id := c.localID(name)
	if contract.ValidID(id) != nil || c.legacy(name, id) {
		return name
	}
	return id
}

// legacy reports whether the volume named name was made before volume IDs
// named their node: it has no image under id, the ID it would have now,
// and an image under its name, in the default pool (there were no others
// then).
func (c *Controller) legacy(name, id string) bool {
	p := c.pools.Get(state.DefaultPool)
	if _, err := p.ImageSize(id); !errors.Is(err, os.ErrNotExist) {
		return false
	}
	_, err := p.ImageSize(name)
	return err == nil
}

// find answers r from what exists: the volume made already, the restore
// that makes it, or nothing (all nil).
func (c *Controller) find(r createRequest) (resp *csi.CreateVolumeResponse, job *pool.Restore, err error) {
	err = r.pool.Within(func(pr pool.Promise) error {
		resp, job, err = c.findWithin(pr, r)
		return err
	})
	return resp, job, err
}

// findWithin is find within the promise. A deletion of the name that a
// crash interrupted is finished first: its image is not this volume's.
func (c *Controller) findWithin(pr pool.Promise, r createRequest) (*csi.CreateVolumeResponse, *pool.Restore, error) {
	if job := r.pool.RestoreOf(r.id); job != nil {
		return nil, job, nil
	}
	v, err := c.store.Get(r.id)
	if err == nil && v.Removing && state.PoolOf(v) == r.pool.Name() {
		if err := pr.Remove(r.id); err != nil {
			return nil, nil, err
		}
		v = nil
	}
	if v != nil && (v.Provisioning != "" || v.Removing) && state.PoolOf(v) != r.pool.Name() {
		return nil, nil, classified.Errorf(classified.KindAlreadyExists, "volume %s exists in pool %s, pool %s was asked for", r.name, state.PoolOf(v), r.pool.Name())
	}
	cur, err := r.pool.ImageSize(r.id)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil, nil
	case err != nil:
		return nil, nil, classified.Errorf(classified.KindInternal, "checking volume %s: %w", r.name, err)
	case r.id != r.name && (v == nil || v.Name != r.name):
		// The image of another volume: one made before volume IDs
		// named their node, under a name that is this one's ID.
		return nil, nil, classified.Errorf(classified.KindAlreadyExists, "volume ID %s of the name %s is taken by another volume", r.id, r.name)
	case cur < r.rng.Required || r.rng.Limit > 0 && cur > r.rng.Limit:
		return nil, nil, classified.Errorf(classified.KindAlreadyExists, "volume %s exists with %d bytes, outside the requested range [%d, %d]", r.name, cur, r.rng.Required, r.rng.Limit)
	case v != nil && v.Provisioning != "" && v.Provisioning != r.prov:
		return nil, nil, classified.Errorf(classified.KindAlreadyExists, "volume %s exists as a %s volume, %s was asked for", r.name, v.Provisioning, r.prov)
	case v != nil && v.Access != "" && v.Access != r.access:
		// What was checked when it was made (checkModeChange) held for
		// its own capabilities, not these.
		return nil, nil, classified.Errorf(classified.KindAlreadyExists, "volume %s exists in volume mode %s, volume mode %s was asked for", r.name, modeName(v.Access), modeName(r.access))
	case limitsOf(v) != r.limits:
		// CSI: mutable parameters are part of what a volume must be
		// compatible with.
		return nil, nil, classified.Errorf(classified.KindAlreadyExists, "volume %s exists with IO limits %+v, %+v were asked for", r.name, limitsOf(v), r.limits)
	}
	return c.created(r, cur), nil, nil
}

// limitsOf returns the IO limits the record v asks for; none for no
// record.
func limitsOf(v *state.Volume) host.IOLimits {
	if v == nil {
		return host.IOLimits{}
	}
	return v.WantsIOLimits()
}

// makeVolume makes the volume r asks for: new, or copied from its content
// source, which is read first, without the promise held (a clone waits for
// its snapshot). Within the promise, a volume found made meanwhile is
// answered as find does; else its space is promised and its record written
// before its image is made or its copy started.
func (c *Controller) makeVolume(ctx context.Context, r createRequest) (resp *csi.CreateVolumeResponse, job *pool.Restore, err error) {
	src, err := c.contentSource(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	defer src.release()
	if src != nil {
		if r.size, err = src.fit(r.rng, r.size, host.MinSize(r.fsType)); err != nil {
			return nil, nil, err
		}
	}
	err = r.pool.Within(func(pr pool.Promise) error {
		if resp, job, err = c.findWithin(pr, r); resp != nil || job != nil || err != nil {
			return err
		}
		if err := pr.CheckVolume(r.prov == state.ProvisionThin, r.size, 0); err != nil {
			return err
		}
		if err := pr.Record(r.id, r.name, r.prov, r.access, r.limits); err != nil {
			return err
		}
		// Recorded, with neither an image nor a copy under way.
		// gofail: var controllerCreateAfterRecord struct{}
		if src != nil {
			job = pr.StartRestore(r.id, r.name, src.from, src.snap, r.size, r.prov, src.handOver())
			return nil
		}
		if err := pr.MakeImage(r.id, r.size, r.prov); err != nil {
			return err
		}
		// Made, and not yet answered.
		// gofail: var controllerCreateAfterImage struct{}
		klog.V(2).InfoS("Created volume", "volumeID", r.id, "name", r.name, "pool", r.pool.Name(), "bytes", r.size, "provisioning", r.prov)
		resp = c.created(r, r.size)
		return nil
	})
	return resp, job, err
}

// created is the answer for the volume r asked for, of size bytes.
func (c *Controller) created(r createRequest, size int64) *csi.CreateVolumeResponse {
	v := c.volume(r.id, size)
	v.VolumeContext = r.volumeContext
	v.ContentSource = r.source
	return &csi.CreateVolumeResponse{Volume: v}
}

// source is the snapshot a volume is copied from, the pool that holds
// it, and what ends its use (a clone's snapshot is deleted once the copy
// has ended).
type source struct {
	snap devices.SnapshotInfo
	from *pool.Pool
	done func()
}

// handOver returns what ends the source's use, for the copy to run once it
// has ended; release then does nothing.
func (s *source) handOver() func() {
	done := s.done
	s.done = func() {}
	return done
}

// release ends the source's use unless it was handed over. A nil source
// has nothing to end.
func (s *source) release() {
	if s != nil {
		s.done()
	}
}

// fit is the size of a volume made from the source, of size bytes for
// the range rng: the snapshot's image, or at least floor, what the
// volume's filesystem needs (host.MinSize), unless more is asked for;
// never less than the snapshot: a smaller size asked for is given the
// snapshot's, within the range's limit (the snapshot reports the least a
// claim may ask for, restoreSize, which a restore into another mode, with
// a lower floor, can ask for), else OUT_OF_RANGE.
func (s *source) fit(rng state.Range, size, floor int64) (int64, error) {
	if want := max(s.snap.Size, floor); rng.Required == 0 && (rng.Limit == 0 || rng.Limit >= want) {
		size = want
	}
	if size < s.snap.Size && (rng.Limit == 0 || rng.Limit >= s.snap.Size) {
		size = s.snap.Size
	}
	if size < s.snap.Size {
		return 0, classified.Errorf(classified.KindOutOfRange, "a volume of %d bytes cannot hold snapshot %s of %d bytes", size, s.snap.ID, s.snap.Size)
	}
	return size, nil
}

// contentSource reads the snapshot r is to be copied from: nil for a new
// volume, the snapshot named, or one taken of the volume named for a
// clone.
func (c *Controller) contentSource(ctx context.Context, r createRequest) (*source, error) {
	switch src := r.source; {
	case src == nil:
		return nil, nil
	case src.GetSnapshot() != nil:
		info, from, err := c.restoreSource(src.GetSnapshot().GetSnapshotId())
		if err != nil {
			return nil, err
		}
		if err := r.checkModeChange("snapshot "+info.ID, snapshotAccess(info)); err != nil {
			return nil, err
		}
		if r.fsType != "" && info.FsType != "" && info.FsType != r.fsType {
			// The stage would refuse it, after the volume was made. A
			// raw block volume takes any snapshot.
			return nil, classified.Errorf(classified.KindInvalidArgument, "snapshot %s holds a %s filesystem; a volume made from it cannot be mounted as %s", info.ID, info.FsType, r.fsType)
		}
		return &source{snap: info, from: from, done: func() {}}, nil
	case src.GetVolume() != nil:
		id := src.GetVolume().GetVolumeId()
		// The volume's record refuses a clone before its copy is taken;
		// the snapshot taken for it has the last word (the volume may be
		// staged raw meanwhile).
		if v, err := c.store.Get(id); err == nil {
			if err := r.checkModeChange("volume "+id, v.WrittenAs()); err != nil {
				return nil, err
			}
		}
		info, from, done, err := c.cloneSource(ctx, id, r.name)
		if err != nil {
			return nil, err
		}
		if err := r.checkModeChange("volume "+id, snapshotAccess(info)); err != nil {
			done()
			return nil, err
		}
		return &source{snap: info, from: from, done: done}, nil
	}
	return nil, classified.Errorf(classified.KindInvalidArgument, "unknown volume content source")
}

package controller

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/locks"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// Snapshotter asks the node's reconciler for snapshots: it records the
// intent, then waits for the snapshot to be taken.
type Snapshotter interface {
	// AskSnapshot records the intent; group, when not nil, makes it
	// the intent of a group snapshot, kept on its leader (source).
	AskSnapshot(source, id string, group *state.GroupIntent) (gen int64, err error)
	AwaitSnapshot(ctx context.Context, source, id string, gen int64) error
}

// snapshotService is the controller's part in snapshots, which live in
// their volume's storage pool.
type snapshotService struct {
	taker Snapshotter

	// mu serialises the decisions about snapshot IDs (CreateSnapshot's
	// check and intent, DeleteSnapshot). A CreateSnapshot waits for its
	// copy without it. Lock order: mu, then the pool's (pool.Pool.Within).
	mu locks.Mutex
}

// ServeSnapshots makes the controller serve snapshots of this node's
// volumes, kept in each volume's pool and taken by taker. Without it, the
// controller advertises no snapshot capability.
func (c *Controller) ServeSnapshots(taker Snapshotter) {
	c.snapshots = &snapshotService{taker: taker}
}

// CreateSnapshot takes a snapshot of a volume of this node, idempotent by
// name: the snapshot of that name of the same volume is returned, of
// another volume ALREADY_EXISTS. The reconciler takes it (see
// reconciler.takeSnapshot); the answer comes once it exists, and a
// snapshot is never listed before it is whole.
func (c *Controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	s := c.snapshots
	if s == nil {
		return nil, errNoSnapshots
	}
	name, source := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, classified.Errorf(classified.KindInvalidArgument, "name is required")
	}
	if source == "" {
		return nil, classified.Errorf(classified.KindInvalidArgument, "source volume ID is required")
	}
	limit, err := snapshotLimit(req.GetParameters(), contract.SnapshotParameters())
	if err != nil {
		return nil, err
	}
	// A snapshot is usable where its file is: on this node only.
	if err := c.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	id := c.localID(name)
	if err := contract.ValidID(id); err != nil {
		return nil, classified.Errorf(classified.KindInvalidArgument, "snapshot name %q: as the ID %q: %v", name, id, err)
	}
	if err := contract.CheckID("volume", source, contract.Finds); err != nil {
		return nil, err
	}

	found, home, gen, err := c.askSnapshot(id, source, limit)
	switch {
	case err != nil:
		return nil, err
	case found != nil:
		if found.Source != source {
			return nil, classified.Errorf(classified.KindAlreadyExists, "snapshot %s exists, of volume %s", name, found.Source)
		}
		if found.Group != "" {
			return nil, classified.Errorf(classified.KindAlreadyExists, "snapshot %s exists, a member of group snapshot %s", name, found.Group)
		}
		return &csi.CreateSnapshotResponse{Snapshot: c.snapshot(*found)}, nil
	}
	info, err := c.awaitSnapshot(ctx, home, source, id, gen)
	if err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Took snapshot", "snapshotID", id, "volumeID", source, "bytes", info.Size)
	return &csi.CreateSnapshotResponse{Snapshot: c.snapshot(info)}, nil
}

// askSnapshot returns snapshot id when it exists (found), else asks the
// reconciler for it as a snapshot of volume source, in source's pool
// (home), and returns the generation of the intent to wait for, under
// the snapshots' lock: a retry of one taken already answers with it, at
// the cap or not, since the snapshot of that ID is looked for first.
func (c *Controller) askSnapshot(id, source string, limit int) (found *devices.SnapshotInfo, home *pool.Pool, gen int64, err error) {
	s := c.snapshots
	s.mu.Lock()
	defer s.mu.Unlock()
	info, _, err := c.pools.Snapshot(id)
	switch {
	case err == nil:
		return &info, nil, 0, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, nil, 0, classified.Errorf(classified.KindInternal, "reading snapshot %s: %w", id, err)
	}
	home, gen, err = c.askLocked(id, source, limit)
	return nil, home, gen, err
}

// askLocked asks the reconciler for snapshot id of volume source, which
// does not exist yet, and returns the pool it is taken in (the volume's:
// a reflink needs the same filesystem) and the generation of the intent:
// ALREADY_EXISTS while another volume's snapshot of that ID is being
// taken; RESOURCE_EXHAUSTED when the pool cannot hold it or the volume
// has limit snapshots already (limit 0 is no cap). It is called with the
// snapshots' lock held.
func (c *Controller) askLocked(id, source string, limit int) (*pool.Pool, int64, error) {
	if other := c.takingSnapshot(id); other != "" && other != source {
		return nil, 0, classified.Errorf(classified.KindAlreadyExists, "snapshot %s is being taken of volume %s", id, other)
	}
	home, missing := c.pools.ForVolume(source)
	if missing != nil {
		return nil, 0, missing.Err()
	}
	if err := c.checkRoomLocked(home, limit, map[string]string{source: id}); err != nil {
		return nil, 0, err
	}
	gen, err := c.snapshots.taker.AskSnapshot(source, id, nil)
	return home, gen, err
}

// awaitSnapshot waits, without the snapshots' lock, for snapshot id of
// volume source asked for at generation gen, and reads it from home.
func (c *Controller) awaitSnapshot(ctx context.Context, home *pool.Pool, source, id string, gen int64) (devices.SnapshotInfo, error) {
	if err := c.snapshots.taker.AwaitSnapshot(ctx, source, id, gen); err != nil {
		return devices.SnapshotInfo{}, err
	}
	info, err := home.Snapshot(id)
	if err != nil {
		return devices.SnapshotInfo{}, classified.Errorf(classified.KindInternal, "reading snapshot %s: %w", id, err)
	}
	return info, nil
}

// checkRoomLocked refuses, RESOURCE_EXHAUSTED, the snapshots taking asks
// for (each volume's snapshot ID) when a volume has limit snapshots
// already or home's promise cannot hold their copies. It is called with
// the snapshots' lock held, so that two requests never both take the last
// place.
func (c *Controller) checkRoomLocked(home *pool.Pool, limit int, taking map[string]string) error {
	if err := c.checkLimitLocked(home, limit, taking); err != nil {
		return err
	}
	return home.Within(func(pr pool.Promise) error { return pr.CheckSnapshots(slices.Sorted(maps.Keys(taking))...) })
}

// cloneSource takes a snapshot of volume source to make volume name from
// (a clone is a restore of a snapshot taken for it), under an ID that is
// never listed and that a start-up removes should a crash leave it; done
// deletes it. The snapshot is in the source volume's pool, from. A volume
// whose image is not here is RESOURCE_EXHAUSTED naming its node when its
// ID names another, NOT_FOUND otherwise.
func (c *Controller) cloneSource(ctx context.Context, source, name string) (info devices.SnapshotInfo, from *pool.Pool, done func(), err error) {
	s := c.snapshots
	if s == nil {
		return devices.SnapshotInfo{}, nil, nil, classified.Errorf(classified.KindInvalidArgument, "cloning a volume is not supported here")
	}
	if err := contract.CheckID("source volume", source, contract.Finds); err != nil {
		return devices.SnapshotInfo{}, nil, nil, err
	}
	from, missing := c.pools.ForVolume(source)
	if missing != nil {
		return devices.SnapshotInfo{}, nil, nil, missing.Err()
	}
	if _, err := from.ImageSize(source); errors.Is(err, os.ErrNotExist) {
		if node := nodeOf(source); node != "" && node != c.topology[contract.TopologyKey] {
			// The scheduler may try another node.
			return devices.SnapshotInfo{}, nil, nil, classified.Errorf(classified.KindResourceExhausted, "volume %s is on node %s, not this node (%s)", source, node, c.topology[contract.TopologyKey])
		}
		return devices.SnapshotInfo{}, nil, nil, classified.Errorf(classified.KindNotFound, "volume %s is not on this node (%s)", source, c.topology[contract.TopologyKey])
	}
	id := from.TempSnapshotID("clone-" + name)
	gen, err := c.askClone(from, id, source)
	if err != nil {
		return devices.SnapshotInfo{}, nil, nil, err
	}
	if info, err = c.awaitSnapshot(ctx, from, source, id, gen); err != nil {
		return devices.SnapshotInfo{}, nil, nil, err
	}
	return info, from, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := from.DeleteSnapshot(id); err != nil {
			klog.ErrorS(err, "Cannot delete the snapshot a clone was made from; a restart removes it", "snapshotID", id)
		}
	}, nil
}

// askClone asks, under the snapshots' lock, for snapshot id of volume
// source in from to make a clone from, once what an interrupted clone of
// the same name left is gone; no cap: the snapshot is gone once the clone
// is made, and a class's cap is on what a volume keeps.
func (c *Controller) askClone(from *pool.Pool, id, source string) (gen int64, err error) {
	s := c.snapshots
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.takingSnapshot(id) == "" {
		if err := from.DeleteSnapshot(id); err != nil {
			return 0, classified.Errorf(classified.KindInternal, "%w", err)
		}
	}
	_, gen, err = c.askLocked(id, source, 0)
	return gen, err
}

// snapshotLimit checks a snapshot class's parameters, of which known are
// the keys converge reads (any other is INVALID_ARGUMENT, as in a
// StorageClass), and returns the cap on a volume's snapshots they set: 0
// when none.
func snapshotLimit(params map[string]string, known []string) (int, error) {
	if err := contract.CheckKeys("parameters", params, known...); err != nil {
		return 0, err
	}
	return contract.ParseMaxSnapshots(params)
}

// checkLimitLocked refuses, RESOURCE_EXHAUSTED, to take one more snapshot
// of a volume that has limit of them already (limit 0: no cap). taking
// maps each volume to the ID of the snapshot to be taken of it, which is
// not counted: a retry of one asked for and not yet taken is not one
// more. It is called with the snapshot lock held, so that two requests
// never both take the last place.
func (c *Controller) checkLimitLocked(home *pool.Pool, limit int, taking map[string]string) error {
	if limit == 0 {
		return nil
	}
	have, err := c.snapshotIDs(home)
	if err != nil {
		return err
	}
	for _, source := range slices.Sorted(maps.Keys(taking)) {
		ids := have[source]
		delete(ids, taking[source])
		if len(ids) >= limit {
			return classified.Errorf(classified.KindResourceExhausted, "volume %s has %d snapshot(s), and its snapshot class's %s is %d: delete one of them first", source, len(ids), contract.MaxSnapshotsPerVolumeKey, limit)
		}
	}
	return nil
}

// snapshotIDs returns, per volume, the IDs of its snapshots: those any
// pool holds, and those a record asks for and that are not taken yet
// (each the reconciler will take, promised like one taken). A clone's
// snapshot (a temporary ID of home's kind) is none of them: it is gone
// once the clone is made.
func (c *Controller) snapshotIDs(home *pool.Pool) (map[string]map[string]bool, error) {
	ids := map[string]map[string]bool{}
	add := func(source, id string) {
		if ids[source] == nil {
			ids[source] = map[string]bool{}
		}
		ids[source][id] = true
	}
	for _, p := range c.pools.All() {
		all, err := p.Snapshots()
		if err != nil {
			return nil, classified.Errorf(classified.KindInternal, "listing the snapshots of pool %s: %w", p.Name(), err)
		}
		for _, info := range all {
			add(info.Source, info.ID)
		}
	}
	for _, v := range c.store.List() {
		for id, in := range v.Snapshots {
			switch {
			case in.Group != nil:
				// The group's intent is on its leader's record alone.
				for source, member := range in.Group.Members {
					add(source, member)
				}
			case !home.IsTempSnapshot(id):
				add(v.ID, id)
			}
		}
	}
	return ids, nil
}

// takingSnapshot returns the volume whose record asks for snapshot id, ""
// when none does.
func (c *Controller) takingSnapshot(id string) string {
	for _, v := range c.store.List() {
		if v.Snapshots[id] != nil {
			return v.ID
		}
	}
	return ""
}

func (c *Controller) snapshot(info devices.SnapshotInfo) *csi.Snapshot {
	snap := &csi.Snapshot{
		SnapshotId:     info.ID,
		SourceVolumeId: info.Source,
		SizeBytes:      restoreSize(info.Size, host.MinSize(info.FsType)),
		CreationTime:   timestamppb.New(info.Created),
		ReadyToUse:     true,
		// A member of a group is deleted with its group alone.
		GroupSnapshotId: info.Group,
	}
	if c.opts.SnapshotTopology {
		// Restores are made on this node alone (see restoreSource).
		snap.AccessibleTopology = c.accessible()
	}
	return snap
}

// DeleteSnapshot removes a snapshot of this node. An unknown one is a
// no-op; one still being taken, or that a volume is being restored from,
// is ABORTED (the sidecar retries).
func (c *Controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	s := c.snapshots
	if s == nil {
		return nil, errNoSnapshots
	}
	id := req.GetSnapshotId()
	if err := contract.CheckID("snapshot", id, contract.Finds); err != nil {
		if classified.AsError(err).Kind == classified.KindNotFound {
			return &csi.DeleteSnapshotResponse{}, nil
		}
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if info, _, err := c.pools.Snapshot(id); err == nil && info.Group != "" {
		return nil, classified.Errorf(classified.KindInvalidArgument, "snapshot %s is a member of group snapshot %s, and is deleted with its group (DeleteVolumeGroupSnapshot) alone", id, info.Group)
	}
	if err := c.deleteSnapshotLocked(id); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// deleteSnapshotLocked deletes snapshot id, under the snapshots' lock,
// unless it is being taken or restored; one that is not there is done.
func (c *Controller) deleteSnapshotLocked(id string) error {
	if source := c.takingSnapshot(id); source != "" {
		return classified.Errorf(classified.KindAborted, "snapshot %s of volume %s is still being taken; retry later", id, source)
	}
	if n := c.pools.RestoresFrom(id); n > 0 {
		return classified.Errorf(classified.KindAborted, "snapshot %s is being restored to %d volume(s); retry later", id, n)
	}
	_, home, err := c.pools.Snapshot(id)
	if errors.Is(err, os.ErrNotExist) {
		// A snapshot in a pool left out (its disk not mounted) is not
		// gone: answered deleted, its content would go and its file stay.
		if names := c.pools.UnservedNames(); len(names) > 0 {
			return classified.Errorf(classified.KindUnavailable, "snapshot %s is in no pool this node serves, and pool(s) %s are left out (csi-node status says why): it may be in one of them; retry once they are served", id, strings.Join(names, ", "))
		}
		return nil
	}
	if err != nil {
		return classified.Errorf(classified.KindInternal, "reading snapshot %s: %w", id, err)
	}
	if err := home.DeleteSnapshot(id); err != nil {
		return classified.Errorf(classified.KindInternal, "deleting snapshot %s: %w", id, err)
	}
	klog.V(2).InfoS("Deleted snapshot", "snapshotID", id)
	return nil
}

// ListSnapshots pages through this node's snapshots in ID order, all of
// them or those of one ID or one source volume; only whole snapshots
// exist to be listed.
func (c *Controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	s := c.snapshots
	if s == nil {
		return nil, errNoSnapshots
	}
	after, err := pageStart(req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	var infos []devices.SnapshotInfo
	switch id := req.GetSnapshotId(); {
	case id != "":
		if contract.ValidID(id) != nil {
			return &csi.ListSnapshotsResponse{}, nil
		}
		info, _, err := c.pools.Snapshot(id)
		if errors.Is(err, os.ErrNotExist) {
			return &csi.ListSnapshotsResponse{}, nil
		}
		if err != nil {
			return nil, classified.Errorf(classified.KindInternal, "reading snapshot %s: %w", id, err)
		}
		infos = []devices.SnapshotInfo{info}
	default:
		for _, p := range c.pools.All() {
			all, err := p.Snapshots()
			if err != nil {
				return nil, classified.Errorf(classified.KindInternal, "listing the snapshots of pool %s: %w", p.Name(), err)
			}
			infos = append(infos, all...)
		}
		slices.SortFunc(infos, func(a, b devices.SnapshotInfo) int { return strings.Compare(a.ID, b.ID) })
	}
	resp := &csi.ListSnapshotsResponse{}
	pending := c.pendingGroups()
	for _, info := range infos {
		if info.ID <= after || req.GetSourceVolumeId() != "" && info.Source != req.GetSourceVolumeId() || pending[info.Group] {
			continue
		}
		if req.GetMaxEntries() > 0 && len(resp.Entries) == int(req.GetMaxEntries()) {
			resp.NextToken = listTokenPrefix + resp.Entries[len(resp.Entries)-1].Snapshot.SnapshotId
			break
		}
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: c.snapshot(info)})
	}
	return resp, nil
}

// restoreSource checks the snapshot a volume is to be made from and
// returns it with the pool that holds it: NOT_FOUND when
// it does not exist here, RESOURCE_EXHAUSTED naming the node it is on when
// that is another node (the scheduler then tries another node).
func (c *Controller) restoreSource(id string) (devices.SnapshotInfo, *pool.Pool, error) {
	s := c.snapshots
	if s == nil {
		return devices.SnapshotInfo{}, nil, classified.Errorf(classified.KindInvalidArgument, "snapshots are not served")
	}
	if err := contract.CheckID("source snapshot", id, contract.Finds); err != nil {
		return devices.SnapshotInfo{}, nil, err
	}
	if node := nodeOf(id); node != "" && node != c.topology[contract.TopologyKey] {
		return devices.SnapshotInfo{}, nil, classified.Errorf(classified.KindResourceExhausted, "snapshot %s is on node %s, not this node (%s)", id, node, c.topology[contract.TopologyKey])
	}
	info, home, err := c.pools.Snapshot(id)
	if errors.Is(err, os.ErrNotExist) {
		return devices.SnapshotInfo{}, nil, classified.Errorf(classified.KindNotFound, "snapshot %s not found", id)
	}
	if err != nil {
		return devices.SnapshotInfo{}, nil, classified.Errorf(classified.KindInternal, "reading snapshot %s: %w", id, err)
	}
	return info, home, nil
}

// errNoSnapshots answers the snapshot RPCs of a controller that does not
// serve snapshots.
var errNoSnapshots = classified.Errorf(classified.KindUnimplemented, "snapshots are not served")

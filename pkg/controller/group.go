package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// GroupService is the CSI GroupController service: group snapshots of
// volumes of this node and one pool, every member taken at one instant
// (see reconciler.takeGroupSnapshot). Each member is a snapshot of its
// own, named in its group (group_snapshot_id): restored and cloned from
// as any other, and deleted with its group alone.
type GroupService struct {
	csi.UnimplementedGroupControllerServer
	c *Controller
}

// Groups returns the GroupController service of c.
func (c *Controller) Groups() *GroupService { return &GroupService{c: c} }

func (g *GroupService) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	if g.c.snapshots == nil {
		return &csi.GroupControllerGetCapabilitiesResponse{}, nil
	}
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
		}},
	}}}, nil
}

// MaxGroupVolumes is the most volumes a group snapshot takes: each one's
// filesystem is frozen until the last is, and the group's intent, kept on
// one record, names them all.
const MaxGroupVolumes = 64

// groupPlan is what a group snapshot takes: its ID, and each member
// volume's snapshot ID, in volume ID order.
type groupPlan struct {
	id      string
	volumes []string
	members map[string]string
	pool    *pool.Pool
	// limit is the most snapshots a member volume may have, its class's
	// contract.MaxSnapshotsPerVolumeKey; 0 is no cap.
	limit int
}

// leader is the member whose record keeps the group's intent.
func (p groupPlan) leader() string { return p.volumes[0] }

// planGroup checks a CreateVolumeGroupSnapshot and names what it takes.
func (c *Controller) planGroup(req *csi.CreateVolumeGroupSnapshotRequest) (groupPlan, error) {
	name, sources := req.GetName(), slices.Clone(req.GetSourceVolumeIds())
	if name == "" {
		return groupPlan{}, classified.Errorf(classified.KindInvalidArgument, "name is required")
	}
	if len(sources) == 0 {
		return groupPlan{}, classified.Errorf(classified.KindInvalidArgument, "source volume IDs are required")
	}
	if len(sources) > MaxGroupVolumes {
		return groupPlan{}, classified.Errorf(classified.KindInvalidArgument, "a group snapshot takes at most %d volumes, asked for %d", MaxGroupVolumes, len(sources))
	}
	limit, err := snapshotLimit(req.GetParameters(), contract.GroupSnapshotParameters())
	if err != nil {
		return groupPlan{}, err
	}
	slices.Sort(sources)
	for i := 1; i < len(sources); i++ {
		if sources[i] == sources[i-1] {
			return groupPlan{}, classified.Errorf(classified.KindInvalidArgument, "source volume %s is named twice", sources[i])
		}
	}
	p := groupPlan{id: c.localID(name), volumes: sources, members: make(map[string]string, len(sources)), limit: limit}
	if err := contract.ValidID(p.id); err != nil {
		return groupPlan{}, classified.Errorf(classified.KindInvalidArgument, "group snapshot name %q: as the ID %q: %v", name, p.id, err)
	}
	here := c.topology[contract.TopologyKey]
	for i, src := range sources {
		if err := contract.CheckID("volume", src, contract.Finds); err != nil {
			return groupPlan{}, err
		}
		home, missing := c.pools.ForVolume(src)
		if missing != nil {
			return groupPlan{}, missing.Err()
		}
		if _, err := home.ImageSize(src); errors.Is(err, os.ErrNotExist) {
			if node := nodeOf(src); node != "" && node != here {
				return groupPlan{}, classified.Errorf(classified.KindFailedPrecondition, "volume %s is on node %s, not this node (%s): a group snapshot takes volumes of one node", src, node, here)
			}
			return groupPlan{}, classified.Errorf(classified.KindNotFound, "volume %s is not on this node (%s)", src, here)
		}
		if p.pool == nil {
			p.pool = home
		} else if home != p.pool {
			return groupPlan{}, classified.Errorf(classified.KindFailedPrecondition, "volume %s is in pool %s and volume %s in pool %s: a group snapshot takes volumes of one pool", sources[0], p.pool.Name(), src, home.Name())
		}
		id := c.localID(fmt.Sprintf("%s-%d", name, i))
		if err := contract.ValidID(id); err != nil {
			return groupPlan{}, classified.Errorf(classified.KindInvalidArgument, "group snapshot name %q: member snapshot ID %q: %v", name, id, err)
		}
		p.members[src] = id
	}
	return p, nil
}

// CreateVolumeGroupSnapshot takes a snapshot of each source volume at one
// instant, idempotent by name: the group of that name of the same volumes
// is returned, of other volumes ALREADY_EXISTS. The volumes must be of
// this node and of one pool (FAILED_PRECONDITION). The reconciler takes
// the group (see reconciler.takeGroupSnapshot); the answer comes once
// every member exists, and no member is listed before the group is whole.
func (g *GroupService) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	c := g.c
	s := c.snapshots
	if s == nil {
		return nil, errNoSnapshots
	}
	p, err := c.planGroup(req)
	if err != nil {
		return nil, err
	}
	infos, err := c.takeGroup(ctx, p)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: c.groupSnapshot(p.id, infos)}, nil
}

// takeGroup returns group p when it exists, else asks the reconciler for
// it and waits, and returns it once whole: ALREADY_EXISTS when a group of
// its name exists or is being taken of other volumes, or a member's ID is
// another snapshot's; RESOURCE_EXHAUSTED when the pool cannot hold the
// members together, or a member volume has p.limit snapshots already (a
// group that exists, or is being taken, is answered whatever the cap).
func (c *Controller) takeGroup(ctx context.Context, p groupPlan) ([]devices.SnapshotInfo, error) {
	gen, err := c.askGroup(p)
	if errors.Is(err, errGroupExists) {
		return c.findGroup(p.id)
	}
	if err != nil {
		return nil, err
	}
	if err := c.snapshots.taker.AwaitSnapshot(ctx, p.leader(), p.members[p.leader()], gen); err != nil {
		return nil, err
	}
	infos, err := c.findGroup(p.id)
	if err == nil && !sameGroup(infos, p) {
		err = classified.Errorf(classified.KindInternal, "group snapshot %s was taken and is not whole", p.id)
	}
	if err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Took group snapshot", "groupSnapshotID", p.id, "volumes", len(p.volumes))
	return infos, nil
}

// askGroup asks the reconciler, under the snapshots' lock, for group p,
// kept on its leader, and returns the generation of the intent to wait
// for; errGroupExists when it exists as asked. Room and the cap are
// checked only for a group not asked for yet.
func (c *Controller) askGroup(p groupPlan) (int64, error) {
	s := c.snapshots
	s.mu.Lock()
	defer s.mu.Unlock()
	want := &state.GroupIntent{ID: p.id, Members: p.members}
	if err := c.checkGroupFree(p, want); err != nil {
		return 0, err
	}
	if c.askedGroup(p.id) == nil {
		if err := c.checkRoomLocked(p.pool, p.limit, p.members); err != nil {
			return 0, err
		}
	}
	return s.taker.AskSnapshot(p.leader(), p.members[p.leader()], want)
}

// errGroupExists is checkGroupFree's answer for a group that exists as
// asked.
var errGroupExists = errors.New("the group snapshot exists")

// checkGroupFree checks that group p (want) may be asked for: nil when it
// is not there, or is being taken as asked; errGroupExists when it exists
// as asked; ALREADY_EXISTS when its name exists or is being taken of
// other volumes, or a member's ID names another snapshot.
func (c *Controller) checkGroupFree(p groupPlan, want *state.GroupIntent) error {
	if other := c.askedGroup(p.id); other != nil {
		if !other.Equal(want) {
			return classified.Errorf(classified.KindAlreadyExists, "group snapshot %s is being taken of volumes %v", p.id, other.VolumeIDs())
		}
		return nil
	}
	existing, err := c.findGroup(p.id)
	if err != nil {
		return err
	}
	if len(existing) > 0 {
		if sameGroup(existing, p) {
			return errGroupExists
		}
		var of []string
		for _, info := range existing {
			of = append(of, info.Source)
		}
		return classified.Errorf(classified.KindAlreadyExists, "group snapshot %s exists, of volumes %v", p.id, of)
	}
	for _, v := range p.volumes {
		id := p.members[v]
		if _, _, err := c.pools.Snapshot(id); err == nil {
			return classified.Errorf(classified.KindAlreadyExists, "snapshot %s, which would be the group's snapshot of volume %s, exists", id, v)
		}
		if other := c.takingSnapshot(id); other != "" {
			return classified.Errorf(classified.KindAlreadyExists, "snapshot %s is being taken of volume %s", id, other)
		}
	}
	return nil
}

// sameGroup reports whether the member snapshots infos are group p's: one
// of each of its volumes, under the ID p gives it.
func sameGroup(infos []devices.SnapshotInfo, p groupPlan) bool {
	if len(infos) != len(p.volumes) {
		return false
	}
	for _, info := range infos {
		if p.members[info.Source] != info.ID {
			return false
		}
	}
	return true
}

// askedGroup returns the intent of group id that a record keeps, nil
// when none does.
func (c *Controller) askedGroup(id string) *state.GroupIntent {
	for _, v := range c.store.List() {
		for _, in := range v.Snapshots {
			if in.Group != nil && in.Group.ID == id {
				return in.Group
			}
		}
	}
	return nil
}

// pendingGroups returns the IDs of the group snapshots being taken: their
// members that exist are not listed, since the group is not whole yet.
func (c *Controller) pendingGroups() map[string]bool {
	var ids map[string]bool
	for _, v := range c.store.List() {
		for _, in := range v.Snapshots {
			if in.Group != nil {
				if ids == nil {
					ids = map[string]bool{}
				}
				ids[in.Group.ID] = true
			}
		}
	}
	return ids
}

// groupSnapshot answers group id of the member snapshots infos.
func (c *Controller) groupSnapshot(id string, infos []devices.SnapshotInfo) *csi.VolumeGroupSnapshot {
	gs := &csi.VolumeGroupSnapshot{GroupSnapshotId: id, ReadyToUse: true}
	for _, info := range infos {
		gs.Snapshots = append(gs.Snapshots, c.snapshot(info))
		if gs.CreationTime == nil || info.Created.Before(gs.CreationTime.AsTime()) {
			gs.CreationTime = timestamppb.New(info.Created)
		}
	}
	return gs
}

// findGroup returns the member snapshots of group id on this node, in ID
// order; none when there is no such group, or it is being taken.
func (c *Controller) findGroup(id string) ([]devices.SnapshotInfo, error) {
	if c.askedGroup(id) != nil {
		return nil, nil
	}
	var infos []devices.SnapshotInfo
	for _, p := range c.pools.All() {
		all, err := p.Snapshots()
		if err != nil {
			return nil, classified.Errorf(classified.KindInternal, "listing the snapshots of pool %s: %w", p.Name(), err)
		}
		for _, info := range all {
			if info.Group == id {
				infos = append(infos, info)
			}
		}
	}
	return infos, nil
}

// checkGroupList refuses, INVALID_ARGUMENT, a list of snapshot IDs (the
// CO's, may be empty) that does not name the members of group id: one
// that names a member it lacks, or a snapshot outside the group; gone
// counts an ID of no snapshot as a member deleted already (Delete), else
// as a mismatch (Get).
func checkGroupList(id string, members []devices.SnapshotInfo, ids []string, gone bool) error {
	if len(ids) == 0 {
		return nil
	}
	in := make(map[string]bool, len(members))
	for _, m := range members {
		in[m.ID] = true
	}
	listed := make(map[string]bool, len(ids))
	for _, sid := range ids {
		listed[sid] = true
		if !in[sid] && !gone {
			return classified.Errorf(classified.KindInvalidArgument, "snapshot %s is not a member of group snapshot %s (its members: %v)", sid, id, slices.Sorted(maps.Keys(in)))
		}
	}
	for _, m := range members {
		if !listed[m.ID] {
			return classified.Errorf(classified.KindInvalidArgument, "the snapshot IDs given lack %s, a member of group snapshot %s", m.ID, id)
		}
	}
	return nil
}

// GetVolumeGroupSnapshot describes group snapshot id of this node:
// NOT_FOUND when none of its members exists.
func (g *GroupService) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	c := g.c
	if c.snapshots == nil {
		return nil, errNoSnapshots
	}
	id := req.GetGroupSnapshotId()
	if err := contract.CheckID("group snapshot", id, contract.Finds); err != nil {
		return nil, err
	}
	members, err := c.findGroup(id)
	if err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return nil, classified.Errorf(classified.KindNotFound, "group snapshot %s not found", id)
	}
	if err := checkGroupList(id, members, req.GetSnapshotIds(), false); err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: c.groupSnapshot(id, members)}, nil
}

// DeleteVolumeGroupSnapshot removes group snapshot id and every member of
// it; an unknown one is a no-op. One being taken, or a member of which a
// volume is being restored from, is ABORTED (the sidecar retries), and
// nothing of it is removed.
func (g *GroupService) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	c := g.c
	s := c.snapshots
	if s == nil {
		return nil, errNoSnapshots
	}
	id := req.GetGroupSnapshotId()
	if err := contract.CheckID("group snapshot", id, contract.Finds); err != nil {
		if classified.AsError(err).Kind == classified.KindNotFound {
			return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
		}
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if in := c.askedGroup(id); in != nil {
		return nil, classified.Errorf(classified.KindAborted, "group snapshot %s of volumes %v is still being taken; retry later", id, in.VolumeIDs())
	}
	members, err := c.findGroup(id)
	if err != nil {
		return nil, err
	}
	for _, sid := range req.GetSnapshotIds() {
		// An ID of a snapshot outside the group is a mismatch; one of no
		// snapshot, a member deleted already.
		if !slices.ContainsFunc(members, func(m devices.SnapshotInfo) bool { return m.ID == sid }) && contract.ValidID(sid) == nil {
			if _, _, err := c.pools.Snapshot(sid); err == nil {
				return nil, classified.Errorf(classified.KindInvalidArgument, "snapshot %s is not a member of group snapshot %s", sid, id)
			}
		}
	}
	if err := checkGroupList(id, members, req.GetSnapshotIds(), true); err != nil {
		return nil, err
	}
	for _, m := range members {
		if n := c.pools.RestoresFrom(m.ID); n > 0 {
			return nil, classified.Errorf(classified.KindAborted, "snapshot %s of group snapshot %s is being restored to %d volume(s); retry later", m.ID, id, n)
		}
	}
	for _, m := range members {
		if err := c.deleteSnapshotLocked(m.ID); err != nil {
			return nil, err
		}
	}
	klog.V(2).InfoS("Deleted group snapshot", "groupSnapshotID", id, "snapshots", len(members))
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

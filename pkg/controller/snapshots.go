package controller

import (
	"context"
	"errors"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// Snapshotter asks the node's reconciler for snapshots: it records the
// intent, then waits for the snapshot to be taken.
type Snapshotter interface {
	AskSnapshot(source, id string) (gen int64, err error)
	AwaitSnapshot(ctx context.Context, source, id string, gen int64) error
}

// snapshotService is the controller's part in snapshots.
type snapshotService struct {
	snaps *devices.Snapshots
	taker Snapshotter

	// mu serialises the decisions about snapshot IDs (CreateSnapshot's
	// check and intent, DeleteSnapshot). A CreateSnapshot waits for its
	// copy without it. Lock order: mu, then the controller's mu.
	mu sync.Mutex

	// restoringMu guards restoring, the number of restores copying from
	// each snapshot, which DeleteSnapshot refuses to delete meanwhile. It
	// is taken alone.
	restoringMu sync.Mutex
	restoring   map[string]int
}

// restores reports how many restores copy from snapshot id now.
func (s *snapshotService) restores(id string) int {
	s.restoringMu.Lock()
	defer s.restoringMu.Unlock()
	return s.restoring[id]
}

// hold counts a restore from snapshot id until the returned release.
func (s *snapshotService) hold(id string) (release func()) {
	s.restoringMu.Lock()
	defer s.restoringMu.Unlock()
	if s.restoring == nil {
		s.restoring = map[string]int{}
	}
	s.restoring[id]++
	return func() {
		s.restoringMu.Lock()
		defer s.restoringMu.Unlock()
		if s.restoring[id]--; s.restoring[id] <= 0 {
			delete(s.restoring, id)
		}
	}
}

// ServeSnapshots makes the controller serve snapshots of this node's
// volumes, kept in snaps and taken by taker. Without it the controller
// advertises no snapshot capability.
func (c *Controller) ServeSnapshots(snaps *devices.Snapshots, taker Snapshotter) {
	c.snapshots = &snapshotService{snaps: snaps, taker: taker}
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
		return nil, state.Errorf(state.KindInvalidArgument, "name is required")
	}
	if source == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "source volume ID is required")
	}
	if err := checkSnapshotParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	// A snapshot is usable where its file is: on this node only.
	if err := c.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	id := c.localID(name)
	if err := state.ValidID(id); err != nil {
		return nil, state.Errorf(state.KindInvalidArgument, "snapshot name %q: as the ID %q: %v", name, id, err)
	}
	if state.ValidID(source) != nil {
		return nil, state.NotFound(source)
	}

	s.mu.Lock()
	info, err := s.snaps.Get(id)
	switch {
	case err == nil:
		s.mu.Unlock()
		if info.Source != source {
			return nil, state.Errorf(state.KindAlreadyExists, "snapshot %s exists, of volume %s", name, info.Source)
		}
		return &csi.CreateSnapshotResponse{Snapshot: c.snapshot(info)}, nil
	case !errors.Is(err, os.ErrNotExist):
		s.mu.Unlock()
		return nil, state.Errorf(state.KindInternal, "reading snapshot %s: %w", id, err)
	}
	info, err = c.takeLocked(ctx, id, source)
	if err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Took snapshot", "snapshotID", id, "volumeID", source, "bytes", info.Size)
	return &csi.CreateSnapshotResponse{Snapshot: c.snapshot(info)}, nil
}

// takeLocked asks the reconciler for snapshot id of volume source, which
// does not exist yet, and waits for it: ALREADY_EXISTS while another
// volume's snapshot of that ID is being taken, RESOURCE_EXHAUSTED when the
// data directory cannot hold it. It is called with the snapshot lock held,
// and releases it before the wait.
func (c *Controller) takeLocked(ctx context.Context, id, source string) (devices.SnapshotInfo, error) {
	s := c.snapshots
	if other := c.takingSnapshot(id); other != "" && other != source {
		s.mu.Unlock()
		return devices.SnapshotInfo{}, state.Errorf(state.KindAlreadyExists, "snapshot %s is being taken of volume %s", id, other)
	}
	if err := c.promiseSnapshot(source); err != nil {
		s.mu.Unlock()
		return devices.SnapshotInfo{}, err
	}
	gen, err := s.taker.AskSnapshot(source, id)
	s.mu.Unlock()
	if err != nil {
		return devices.SnapshotInfo{}, err
	}
	if err := s.taker.AwaitSnapshot(ctx, source, id, gen); err != nil {
		return devices.SnapshotInfo{}, err
	}
	info, err := s.snaps.Get(id)
	if err != nil {
		return devices.SnapshotInfo{}, state.Errorf(state.KindInternal, "reading snapshot %s: %w", id, err)
	}
	return info, nil
}

// cloneSource takes a snapshot of volume source to make volume name from
// (a clone is a restore of a snapshot taken for it), under an ID that is
// never listed and that a start-up removes should a crash leave it; done
// deletes it. A volume whose image is not here is RESOURCE_EXHAUSTED
// naming its node when its ID names another, NOT_FOUND otherwise.
func (c *Controller) cloneSource(ctx context.Context, source, name string) (info devices.SnapshotInfo, done func(), err error) {
	s := c.snapshots
	if s == nil {
		return devices.SnapshotInfo{}, nil, state.Errorf(state.KindInvalidArgument, "cloning a volume is not supported here")
	}
	if source == "" {
		return devices.SnapshotInfo{}, nil, state.Errorf(state.KindInvalidArgument, "the volume to clone has no ID")
	}
	if state.ValidID(source) != nil {
		return devices.SnapshotInfo{}, nil, state.NotFound(source)
	}
	if _, err := c.images.Size(source); errors.Is(err, os.ErrNotExist) {
		if node := nodeOf(source); node != "" && node != c.topology[TopologyKey] {
			// The scheduler may try another node.
			return devices.SnapshotInfo{}, nil, state.Errorf(state.KindResourceExhausted, "volume %s is on node %s, not this node (%s)", source, node, c.topology[TopologyKey])
		}
		return devices.SnapshotInfo{}, nil, state.Errorf(state.KindNotFound, "volume %s is not on this node (%s)", source, c.topology[TopologyKey])
	}
	id := s.snaps.TempID("clone-" + name)
	s.mu.Lock()
	if c.takingSnapshot(id) == "" {
		// What an interrupted clone of the same name left.
		if err := s.snaps.Delete(id); err != nil {
			s.mu.Unlock()
			return devices.SnapshotInfo{}, nil, state.Errorf(state.KindInternal, "%w", err)
		}
	}
	info, err = c.takeLocked(ctx, id, source)
	if err != nil {
		return devices.SnapshotInfo{}, nil, err
	}
	return info, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.snaps.Delete(id); err != nil {
			klog.ErrorS(err, "Cannot delete the snapshot a clone was made from; a restart removes it", "snapshotID", id)
		}
	}, nil
}

// promiseSnapshot checks that the data directory can hold a snapshot of
// volume id without breaking a promise (snapshotNeed says what it takes):
// NOT_FOUND when the volume has no image here, RESOURCE_EXHAUSTED when the
// space is not there. The snapshots asked for and not yet taken are
// promised theirs already (capacity.Account.Copying), and the check and the
// ask happen under the snapshot lock, so two snapshots asked for at once
// never count the same free space.
func (c *Controller) promiseSnapshot(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, err := c.images.Usage(id)
	if errors.Is(err, os.ErrNotExist) {
		return state.NotFound(id)
	}
	if err != nil {
		return state.Errorf(state.KindInternal, "checking volume %s: %w", id, err)
	}
	v, err := c.store.Get(id)
	need := snapshotNeed(c.snapshots.snaps.Mode, u, err == nil && v.Thin())
	acc, _, err := c.account()
	if err != nil {
		return state.Errorf(state.KindInternal, "%w", err)
	}
	if avail := acc.ThickAvailable(); need > avail {
		return state.Errorf(state.KindResourceExhausted, "a snapshot of volume %s needs %d bytes of the data directory (copied by %s), %d can still be promised", id, need, c.snapshots.snaps.Mode, avail)
	}
	return nil
}

// snapshotNeed is the space a snapshot of an image whose usage is u takes
// from the data directory, copied as mode says: by a copy, its allocated
// blocks at once; by a reflink nothing at once, but a thick image then owes
// the blocks it did not share yet (its writes will copy them), and a thin
// image's writes take space as any thin write does.
func snapshotNeed(mode devices.CopyMode, u devices.Usage, thin bool) int64 {
	switch {
	case mode != devices.CopyReflink:
		return u.Allocated
	case thin:
		return 0
	}
	return max(0, u.Allocated-u.Shared)
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

// checkSnapshotParameters refuses any parameter but those the sidecars add
// themselves.
func checkSnapshotParameters(params map[string]string) error {
	var unknown []string
	for k := range params {
		if !strings.HasPrefix(k, k8sParamPrefix) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return state.Errorf(state.KindInvalidArgument, "unknown parameters: %s", strings.Join(unknown, ", "))
	}
	return nil
}

func (c *Controller) snapshot(info devices.SnapshotInfo) *csi.Snapshot {
	snap := &csi.Snapshot{
		SnapshotId:     info.ID,
		SourceVolumeId: info.Source,
		SizeBytes:      info.Size,
		CreationTime:   timestamppb.New(info.Created),
		ReadyToUse:     true,
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
	if id == "" {
		return nil, state.Errorf(state.KindInvalidArgument, "snapshot ID is required")
	}
	if state.ValidID(id) != nil {
		return &csi.DeleteSnapshotResponse{}, nil // no such snapshot can exist
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if source := c.takingSnapshot(id); source != "" {
		return nil, state.Errorf(state.KindAborted, "snapshot %s of volume %s is still being taken; retry later", id, source)
	}
	if n := s.restores(id); n > 0 {
		return nil, state.Errorf(state.KindAborted, "snapshot %s is being restored to %d volume(s); retry later", id, n)
	}
	if err := s.snaps.Delete(id); err != nil {
		return nil, state.Errorf(state.KindInternal, "deleting snapshot %s: %w", id, err)
	}
	klog.V(2).InfoS("Deleted snapshot", "snapshotID", id)
	return &csi.DeleteSnapshotResponse{}, nil
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
		if state.ValidID(id) != nil {
			return &csi.ListSnapshotsResponse{}, nil
		}
		info, err := s.snaps.Get(id)
		if errors.Is(err, os.ErrNotExist) {
			return &csi.ListSnapshotsResponse{}, nil
		}
		if err != nil {
			return nil, state.Errorf(state.KindInternal, "reading snapshot %s: %w", id, err)
		}
		infos = []devices.SnapshotInfo{info}
	default:
		all, err := s.snaps.List()
		if err != nil {
			return nil, state.Errorf(state.KindInternal, "listing snapshots: %w", err)
		}
		infos = all
	}
	resp := &csi.ListSnapshotsResponse{}
	for _, info := range infos {
		if info.ID <= after || req.GetSourceVolumeId() != "" && info.Source != req.GetSourceVolumeId() {
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
// returns it: NOT_FOUND when it does not exist here, RESOURCE_EXHAUSTED
// naming the node it is on when that is another node (the scheduler then
// tries another node).
func (c *Controller) restoreSource(id string) (devices.SnapshotInfo, error) {
	s := c.snapshots
	if s == nil {
		return devices.SnapshotInfo{}, state.Errorf(state.KindInvalidArgument, "snapshots are not served")
	}
	if id == "" {
		return devices.SnapshotInfo{}, state.Errorf(state.KindInvalidArgument, "the snapshot to restore has no ID")
	}
	if state.ValidID(id) != nil {
		return devices.SnapshotInfo{}, state.Errorf(state.KindNotFound, "snapshot %s not found", id)
	}
	if node := nodeOf(id); node != "" && node != c.topology[TopologyKey] {
		return devices.SnapshotInfo{}, state.Errorf(state.KindResourceExhausted, "snapshot %s is on node %s, not this node (%s)", id, node, c.topology[TopologyKey])
	}
	info, err := s.snaps.Get(id)
	if errors.Is(err, os.ErrNotExist) {
		return devices.SnapshotInfo{}, state.Errorf(state.KindNotFound, "snapshot %s not found", id)
	}
	if err != nil {
		return devices.SnapshotInfo{}, state.Errorf(state.KindInternal, "reading snapshot %s: %w", id, err)
	}
	return info, nil
}

// checkRestoreFs refuses, with INVALID_ARGUMENT, a volume made from snapshot
// snap that asks to be mounted with another filesystem than the snapshot
// holds (the stage would refuse it, after the volume was made). A raw
// block volume takes any snapshot.
func checkRestoreFs(snap devices.SnapshotInfo, params map[string]string, caps []*csi.VolumeCapability) error {
	if snap.FsType == "" {
		return nil
	}
	for _, vc := range caps {
		m := vc.GetMount()
		if m == nil {
			continue
		}
		want := m.GetFsType()
		if want == "" {
			want = params[k8sParamPrefix+"fstype"]
		}
		if want == "" {
			want = devices.FsExt4 // the node's default (reconciler.DefaultFsType)
		}
		if want != snap.FsType {
			return state.Errorf(state.KindInvalidArgument, "snapshot %s holds a %s filesystem; a volume made from it cannot be mounted as %s", snap.ID, snap.FsType, want)
		}
	}
	return nil
}

// restore makes the image of volume id, size bytes, from snapshot snap:
// the copy, grown to size, every block allocated for a thick volume, which
// appears whole or not at all (a crash in between leaves no image, and the
// retried CreateVolume makes it anew). The snapshot is held against
// deletion meanwhile. The controller's mu is held.
func (c *Controller) restore(ctx context.Context, id string, snap devices.SnapshotInfo, size int64, thick bool) error {
	s := c.snapshots
	defer s.hold(snap.ID)()
	if _, err := s.snaps.Get(snap.ID); err != nil {
		// Deleted between the check and the hold.
		return state.Errorf(state.KindNotFound, "snapshot %s not found", snap.ID)
	}
	if err := s.snaps.Restore(ctx, snap.ID, c.images.Path(id), size, thick); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return state.Errorf(state.KindNotFound, "snapshot %s not found", snap.ID)
		}
		return imageError(err, "restoring volume %s from snapshot %s", id, snap.ID)
	}
	return nil
}

// errNoSnapshots answers the snapshot RPCs of a controller that does not
// serve snapshots.
var errNoSnapshots = state.Errorf(state.KindUnimplemented, "snapshots are not served")

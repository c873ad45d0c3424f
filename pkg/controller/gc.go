package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// Collect finds the volumes (images, and records without one) and the
// snapshots of this node whose IDs req.Referenced lacks, and with
// req.Delete deletes them through DeleteVolume's and DeleteSnapshot's own
// paths. It never deletes a kind that req does not say the listing covers,
// nor one that changed within req.MinAge (a volume just made may not have
// its PersistentVolume yet; a record without an image counts from the
// record's last change), nor a volume staged, published or being
// restored, nor a snapshot being taken or restored: each is checked again
// under the lock its deletion takes, and reported kept with the reason.
// A listing that names nothing this node holds is refused whole
// (checkListed).
func (c *Controller) Collect(ctx context.Context, req volstatus.GCRequest) ([]volstatus.Orphan, error) {
	now := time.Now()
	referenced := map[string]bool{}
	for _, id := range req.Referenced {
		referenced[id] = true
	}
	images, err := c.pools.Images()
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for id := range images {
		ids[id] = true
	}
	for _, v := range c.store.List() {
		ids[v.ID] = true
	}
	snapshots, err := c.snapshotsHeld()
	if err != nil {
		return nil, err
	}
	if err := c.checkListed(req, referenced, ids, snapshots); err != nil {
		return nil, err
	}
	var out []volstatus.Orphan
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		if referenced[id] || ctx.Err() != nil {
			continue
		}
		if o, ok := c.collectVolume(id, now, req); ok {
			out = append(out, o)
		}
	}
	// A group is kept whole: its members go together, once none of them
	// (nor the group) is referenced.
	groupHeld := map[string]bool{}
	for _, s := range snapshots {
		if s.Group != "" && (referenced[s.ID] || referenced[s.Group]) {
			groupHeld[s.Group] = true
		}
	}
	for _, s := range snapshots {
		if referenced[s.ID] || ctx.Err() != nil {
			continue
		}
		if groupHeld[s.Group] {
			out = append(out, volstatus.Orphan{Kind: "snapshot", ID: s.ID, Pool: s.pool, Bytes: s.Size, Changed: s.Created,
				Kept: fmt.Sprintf("a member of group snapshot %s, another member of which is referenced", s.Group)})
			continue
		}
		out = append(out, c.collectSnapshot(s.pool, s.SnapshotInfo, now, req))
	}
	return out, ctx.Err()
}

// heldSnapshot is a snapshot of this node and its pool.
type heldSnapshot struct {
	devices.SnapshotInfo
	pool string
}

// snapshotsHeld lists the snapshots of every pool, none when snapshots are
// not served.
func (c *Controller) snapshotsHeld() ([]heldSnapshot, error) {
	if c.snapshots == nil {
		return nil, nil
	}
	var out []heldSnapshot
	for _, p := range c.pools.All() {
		all, err := p.Snapshots()
		if err != nil {
			return nil, classified.Errorf(classified.KindInternal, "listing the snapshots of pool %s: %w", p.Name(), err)
		}
		for _, info := range all {
			out = append(out, heldSnapshot{SnapshotInfo: info, pool: p.Name()})
		}
	}
	return out, nil
}

// checkListed refuses (FAILED_PRECONDITION) a listing that names none of
// the volumes and snapshots this node holds while it would leave them
// over: a listing of another cluster (kubectl's context; the driver's name
// and the node's may well be the same there) or one narrowed by a
// selector names other volumes of the driver, and would have every volume
// here deleted. Only the IDs this node holds count, not a PV's node
// affinity nor the node named in a handle: another cluster may have a node
// of this name. The operator's word that the cluster names nothing of this
// node (req.NodeUnlisted) lets such a listing through; a listing that
// names something here while the word says otherwise is refused too.
func (c *Controller) checkListed(req volstatus.GCRequest, referenced, volumes map[string]bool, snapshots []heldSnapshot) error {
	node := c.topology[contract.TopologyKey]
	named := ""
	for _, id := range slices.Sorted(maps.Keys(volumes)) {
		if referenced[id] {
			named = "volume " + id
			break
		}
	}
	for _, s := range snapshots {
		if named == "" && referenced[s.ID] {
			named = "snapshot " + s.ID
		}
	}
	switch {
	case req.NodeUnlisted && named != "":
		return classified.Errorf(classified.KindFailedPrecondition, "--node-has-no-pvs, but the input names %s, which node %s holds: nothing is deleted; drop the flag", named, node)
	case req.NodeUnlisted || named != "":
		return nil
	case !(req.Volumes && len(volumes) > 0) && !(req.Snapshots && len(snapshots) > 0):
		return nil // nothing here would be left over
	}
	return classified.Errorf(classified.KindFailedPrecondition, "the input names none of the %d volumes and %d snapshots that node %s holds, so every one would be left over: "+
		"it may list another cluster (kubectl's current context) or fewer PersistentVolumes than the cluster has (a selector). Nothing is deleted. "+
		"Check that kubectl lists the cluster of node %s (kubectl config current-context; kubectl get pv lists the volumes csi-node status shows here); "+
		"if no PersistentVolume or VolumeSnapshotContent of that cluster names a volume or snapshot of this node, add --node-has-no-pvs",
		len(volumes), len(snapshots), node, node)
}

const (
	// notCoveredVolumes and notCoveredSnapshots say why a kind the
	// listing does not cover stays, and what the operator can do.
	notCoveredVolumes   = "the input names no PersistentVolume of the driver; if the cluster has none, add --cluster-has-no-pvs"
	notCoveredSnapshots = "the input names no VolumeSnapshotContent of the driver; if the cluster has none, add --cluster-has-no-snapshots"
)

// collectVolume decides on volume id under its pool's lock; ok is false
// when it is gone meanwhile.
func (c *Controller) collectVolume(id string, now time.Time, req volstatus.GCRequest) (o volstatus.Orphan, ok bool) {
	p, missing := c.pools.ForVolume(id)
	if missing != nil {
		return volstatus.Orphan{Kind: "volume", ID: id, Pool: missing.Name(), Kept: fmt.Sprintf("its pool %s is not on this node", missing.Name())}, true
	}
	o = volstatus.Orphan{Kind: "volume", ID: id, Pool: p.Name()}
	err := p.Within(func(pr pool.Promise) error {
		v, _ := c.store.Get(id)
		changed, size, err := p.ImageChanged(id)
		switch {
		case errors.Is(err, os.ErrNotExist) && v == nil:
			return errGone
		case errors.Is(err, os.ErrNotExist):
			// A record without an image: a static volume's pinned
			// identity and provenance, or what is left of a removal.
			changed = v.Changed
		case err != nil:
			return err
		}
		o.Bytes, o.Changed = size, changed
		if !req.Volumes {
			o.Kept = notCoveredVolumes
			return nil
		}
		if age := now.Sub(changed); age < req.MinAge {
			o.Kept = fmt.Sprintf("changed %s ago, within the least age %s", age.Round(time.Second), req.MinAge)
			return nil
		}
		if v != nil && v.HasNodeIntent() {
			o.Kept = "staged or published on this node"
			return nil
		}
		if r := p.RestoreOf(id); r != nil {
			o.Kept = "being restored from snapshot " + r.SnapshotID()
			return nil
		}
		if !req.Delete {
			return nil
		}
		// Judged an orphan, and not yet deleted.
		// gofail: var controllerGCBeforeDelete struct{}
		if err := c.deleteWithin(p, pr, id); err != nil {
			return err
		}
		o.Deleted = true
		klog.InfoS("Deleted a volume nothing references (csi-node gc)", "volumeID", id, "pool", p.Name(), "bytes", o.Bytes)
		return nil
	})
	switch {
	case errors.Is(err, errGone):
		return o, false
	case err != nil:
		o.Kept = err.Error()
	}
	return o, true
}

// errGone says a volume went while it was being collected.
var errGone = errors.New("gone")

// collectSnapshot decides on the snapshot under the snapshots' lock.
func (c *Controller) collectSnapshot(pool string, info devices.SnapshotInfo, now time.Time, req volstatus.GCRequest) volstatus.Orphan {
	o := volstatus.Orphan{Kind: "snapshot", ID: info.ID, Pool: pool, Bytes: info.Size, Changed: info.Created}
	if !req.Snapshots {
		o.Kept = notCoveredSnapshots
		return o
	}
	if age := now.Sub(info.Created); age < req.MinAge {
		o.Kept = fmt.Sprintf("taken %s ago, within the least age %s", age.Round(time.Second), req.MinAge)
		return o
	}
	if !req.Delete {
		return o
	}
	c.snapshots.mu.Lock()
	defer c.snapshots.mu.Unlock()
	if info.Group != "" && c.askedGroup(info.Group) != nil {
		o.Kept = fmt.Sprintf("a member of group snapshot %s, which is being taken", info.Group)
		return o
	}
	if err := c.deleteSnapshotLocked(info.ID); err != nil {
		o.Kept = err.Error()
		return o
	}
	o.Deleted = true
	klog.InfoS("Deleted a snapshot nothing references (csi-node gc)", "snapshotID", info.ID, "pool", pool)
	return o
}

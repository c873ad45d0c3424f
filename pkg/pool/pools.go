package pool

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// Pools are the node's storage pools, by name: each promises its own data
// directory's space under its own lock. They answer which pool holds a
// volume (ForVolume) or a snapshot (Snapshot), and the status of each
// (Statuses).
type Pools struct {
	byName map[string]*Pool
	names  []string
	// ordered are the pools in the order they were given (the default
	// pool first, then as configured), which the status keeps.
	ordered []*Pool
	store   Store
	// unserved are the pools configured and not served (Open says why),
	// reported with their error after the others.
	unserved []volstatus.PoolStatus
}

// NewPools returns the set of pools, whose names are distinct; store
// holds the volumes' records, which name their pool.
func NewPools(store Store, pools ...*Pool) *Pools {
	ps := &Pools{byName: make(map[string]*Pool, len(pools)), ordered: pools, store: store}
	for _, p := range pools {
		ps.byName[p.Name()] = p
		ps.names = append(ps.names, p.Name())
	}
	sort.Strings(ps.names)
	return ps
}

// Open returns the pools of opts (the default pool first) that this node
// has, whose records are in store: the default pool's directory is made
// when missing; another pool's directory is the operator's (a filesystem
// mounted there), and a node where it does not exist has no such pool:
// one DaemonSet serves nodes with and without it. A pool on the
// filesystem of a pool before it is not served (both would promise the
// same space): most often its own disk is not mounted, and refusing the
// start would stop every other pool's volumes on the node; it is reported
// with that error (Statuses) instead. A pool on the filesystem of the
// kubelet's directory kubeletDir guards it from the kubelet's evictions
// (capacity.DefaultGuardFor, checkGuard). What a crash left in the pools
// is removed, and their filesystems probed, by Repair and Probe.
func Open(store Store, opts []Options, kubeletDir string) (*Pools, error) {
	kubeletDev, err := devices.FilesystemHolding(kubeletDir)
	if err != nil {
		return nil, fmt.Errorf("finding the filesystem of the kubelet's directory: %w", err)
	}
	byDev := map[uint64]string{}
	var out []*Pool
	var unserved []volstatus.PoolStatus
	for _, o := range opts {
		if o.Name == state.DefaultPool {
			if err := os.MkdirAll(o.Dir, 0o700); err != nil {
				return nil, fmt.Errorf("creating pool %s's directory %s: %w", o.Name, o.Dir, err)
			}
		} else if _, err := os.Stat(o.Dir); errors.Is(err, os.ErrNotExist) {
			klog.InfoS("Storage pool is not on this node: its directory does not exist", "pool", o.Name, "dir", o.Dir)
			continue
		}
		dev, err := devices.FilesystemOf(o.Dir)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", o.Name, err)
		}
		if other, ok := byDev[dev]; ok {
			out, unserved = leaveOut(out, unserved, other, o)
			continue
		}
		byDev[dev] = o.Name
		o.KubeletFilesystem = dev == kubeletDev
		p := New(store, o)
		if err := p.checkGuard(kubeletDir); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	ps := NewPools(store, out...)
	ps.unserved = unserved
	return ps, nil
}

// leaveOut leaves pool o out, found on the filesystem of pool other, one
// of those served so far (out), and reports it with the others left out
// (unserved). Neither of two pools other than the default one can tell
// which of them is on its own disk: both are left out. The default pool's
// directory is csi-node's, on the filesystem it was given.
func leaveOut(out []*Pool, unserved []volstatus.PoolStatus, other string, o Options) ([]*Pool, []volstatus.PoolStatus) {
	err := fmt.Errorf("pools %s and %s are on one filesystem: each pool needs a filesystem of its own, or both would promise the same space; is pool %s's disk mounted at %s?", other, o.Name, o.Name, o.Dir)
	klog.ErrorS(err, "Storage pool not served", "pool", o.Name, "dir", o.Dir)
	unserved = append(unserved, volstatus.PoolStatus{Name: o.Name, Dir: o.Dir, Error: err.Error()})
	if i := slices.IndexFunc(out, func(p *Pool) bool { return p.name == other }); i >= 0 && other != state.DefaultPool {
		oerr := fmt.Errorf("pools %s and %s are on one filesystem: each pool needs a filesystem of its own, or both would promise the same space; is pool %s's disk mounted at %s?", other, o.Name, other, out[i].images.Dir)
		klog.ErrorS(oerr, "Storage pool not served", "pool", other, "dir", out[i].images.Dir)
		unserved = append(unserved, volstatus.PoolStatus{Name: other, Dir: out[i].images.Dir, Error: oerr.Error()})
		out = slices.Delete(out, i, i+1)
	}
	return out, unserved
}

// Unserved returns the pool this node has configured and does not serve
// (Open says why), by name, with the reason; "" when name is not one.
func (ps *Pools) Unserved(name string) string {
	for _, st := range ps.unserved {
		if st.Name == name {
			return st.Error
		}
	}
	return ""
}

// UnservedNames returns the names of the pools this node has configured
// and does not serve.
func (ps *Pools) UnservedNames() []string {
	var out []string
	for _, st := range ps.unserved {
		out = append(out, st.Name)
	}
	return out
}

// Get returns pool name, nil when the node has no such pool.
func (ps *Pools) Get(name string) *Pool { return ps.byName[name] }

// ForVolume returns the pool of volume id, as its record names it (the
// default pool without one). When this node does not have that pool (a
// volume made in a pool configured then), it returns nil and the Missing
// pool in its place, which names it and refuses for it (Missing.Err).
func (ps *Pools) ForVolume(id string) (*Pool, *Missing) {
	v, _ := ps.store.Get(id)
	name := state.PoolOf(v)
	if p := ps.byName[name]; p != nil {
		return p, nil
	}
	m := ps.Missing(name)
	return nil, &m
}

// Missing returns pool name as a pool this node does not have, beside the
// pools it has.
func (ps *Pools) Missing(name string) Missing { return NewMissing(name, ps.names) }

// Configured returns the pools in the order they were given: the default
// pool first, then as configured, the order of start-up's log and of the
// status.
func (ps *Pools) Configured() []*Pool { return slices.Clone(ps.ordered) }

// All returns the pools in name order.
func (ps *Pools) All() []*Pool {
	out := make([]*Pool, 0, len(ps.names))
	for _, n := range ps.names {
		out = append(out, ps.byName[n])
	}
	return out
}

// Images returns the ID of every volume image of every pool, with the
// pool that holds it.
func (ps *Pools) Images() (map[string]*Pool, error) {
	where := map[string]*Pool{}
	for _, p := range ps.All() {
		in, err := p.images.List()
		if err != nil {
			return nil, classified.Errorf(classified.KindInternal, "listing the volumes of pool %s: %w", p.Name(), err)
		}
		for _, id := range in {
			where[id] = p
		}
	}
	return where, nil
}

// Snapshot returns snapshot id, and the pool that holds it; an error
// matching os.ErrNotExist when no pool does.
func (ps *Pools) Snapshot(id string) (devices.SnapshotInfo, *Pool, error) {
	for _, p := range ps.All() {
		info, err := p.snapshots.Get(id)
		if err == nil {
			return info, p, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return devices.SnapshotInfo{}, nil, err
		}
	}
	return devices.SnapshotInfo{}, nil, fmt.Errorf("snapshot %s: %w", id, os.ErrNotExist)
}

// RestoresFrom counts the restores, in any pool, copying from snapshot id.
func (ps *Pools) RestoresFrom(id string) int {
	n := 0
	for _, p := range ps.byName {
		n += p.restores.from(id)
	}
	return n
}

// Close ends every pool's restores and waits for them.
func (ps *Pools) Close() {
	for _, p := range ps.byName {
		p.Close()
	}
}

// Statuses reports every pool (Pool.Status), in the order they were given;
// node is this node's name. A pool whose status cannot be read is reported
// with the error alone (PoolStatus.Error), beside the others: one failing
// disk must not hide the rest of the node.
func (ps *Pools) Statuses(node string) []volstatus.PoolStatus {
	out := make([]volstatus.PoolStatus, 0, len(ps.ordered))
	for _, p := range ps.ordered {
		st, err := p.Status(node)
		if err != nil {
			st = volstatus.PoolStatus{Name: p.name, Dir: p.images.Dir, Node: node, Error: err.Error()}
		}
		out = append(out, st)
	}
	for _, st := range ps.unserved {
		st.Node = node
		out = append(out, st)
	}
	return out
}

// ImageSize returns the size of volume id's image in the pool its record
// names (ForVolume); an error matching os.ErrNotExist when that pool has
// none, and one saying so when this node does not have the pool.
func (ps *Pools) ImageSize(id string) (int64, error) {
	p, missing := ps.ForVolume(id)
	if missing != nil {
		return missing.ImageSize(id)
	}
	return p.ImageSize(id)
}

// Dirs returns the data directory of every pool, by name: what the
// observer watches.
func (ps *Pools) Dirs() map[string]string {
	out := make(map[string]string, len(ps.byName))
	for name, p := range ps.byName {
		out[name] = p.Dir()
	}
	return out
}

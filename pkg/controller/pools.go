package controller

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// Pools are the node's storage pools, by name: each promises its own data
// directory's space under its own lock. They answer which pool holds a
// volume (Of), and the status of each (Statuses).
type Pools struct {
	byName map[string]*Pool
	names  []string
	// ordered are the pools in the order they were given (the default
	// pool first, then as configured), which the status keeps.
	ordered []*Pool
	store   Store
	// unserved are the pools configured and not served (OpenPools says
	// why), reported with their error after the others.
	unserved []volstatus.PoolStatus
}

// NewPools returns the pools of spaces, whose names are distinct; store
// holds the volumes' records, which name their pool.
func NewPools(store Store, spaces ...*Pool) *Pools {
	ps := &Pools{byName: make(map[string]*Pool, len(spaces)), ordered: spaces, store: store}
	for _, s := range spaces {
		ps.byName[s.Name()] = s
		ps.names = append(ps.names, s.Name())
	}
	sort.Strings(ps.names)
	return ps
}

// Unserved returns the pool this node has configured and does not serve
// (OpenPools says why), by name, with the reason; "" when name is not one.
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

// Get returns the space of pool name, nil when the node has no such pool.
func (ps *Pools) Get(name string) *Pool { return ps.byName[name] }

// Configured returns the pools in the order they were given: the default
// pool first, then as configured, the order of start-up's log and of the
// status.
func (ps *Pools) Configured() []*Pool { return slices.Clone(ps.ordered) }

// All returns the spaces in pool name order.
func (ps *Pools) All() []*Pool {
	out := make([]*Pool, 0, len(ps.names))
	for _, n := range ps.names {
		out = append(out, ps.byName[n])
	}
	return out
}

// images returns the ID of every volume image of every pool, with the
// space of its pool.
func (ps *Pools) images() (map[string]*Pool, error) {
	where := map[string]*Pool{}
	for _, space := range ps.All() {
		in, err := space.images.List()
		if err != nil {
			return nil, classified.Errorf(classified.KindInternal, "listing the volumes of pool %s: %w", space.Name(), err)
		}
		for _, id := range in {
			where[id] = space
		}
	}
	return where, nil
}

// Of returns the name of the pool of volume id, as its record says (the
// default pool without one), and its space: nil when this node has no
// such pool.
func (ps *Pools) Of(id string) (string, *Pool) {
	v, _ := ps.store.Get(id)
	name := state.PoolOf(v)
	return name, ps.byName[name]
}

// noPool is the failure of a request about a pool this node does not have.
func (ps *Pools) noPool(name string) error {
	return classified.Errorf(classified.KindResourceExhausted, "this node has no storage pool %s (it has %s)", name, strings.Join(ps.names, ", "))
}

// parsePool reads the pool a request's parameters name: INVALID_ARGUMENT
// for a name no pool can have, RESOURCE_EXHAUSTED for one this node does
// not have (the provisioner then tries another node, as for a full pool).
func (ps *Pools) parsePool(params map[string]string) (string, *Pool, error) {
	name, ok := params[contract.PoolKey]
	if !ok {
		name = state.DefaultPool
	}
	if err := state.ValidPoolName(name); err != nil {
		return "", nil, classified.Errorf(classified.KindInvalidArgument, "%s: %w", contract.PoolKey, err)
	}
	s := ps.byName[name]
	if s == nil {
		return name, nil, ps.noPool(name)
	}
	return name, s, nil
}

// snapshot returns snapshot id, and the space of the pool that holds it;
// an error matching os.ErrNotExist when no pool does.
func (ps *Pools) snapshot(id string) (devices.SnapshotInfo, *Pool, error) {
	for _, s := range ps.All() {
		info, err := s.snapshots.Get(id)
		if err == nil {
			return info, s, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return devices.SnapshotInfo{}, nil, err
		}
	}
	return devices.SnapshotInfo{}, nil, fmt.Errorf("snapshot %s: %w", id, os.ErrNotExist)
}

// restoresFrom counts the restores, in any pool, copying from snapshot id.
func (ps *Pools) restoresFrom(id string) int {
	n := 0
	for _, s := range ps.byName {
		n += s.restores.from(id)
	}
	return n
}

// Close ends every pool's restores and waits for them.
func (ps *Pools) Close() {
	for _, s := range ps.byName {
		s.Close()
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
// names (Of).
func (ps *Pools) ImageSize(id string) (int64, error) {
	name, p := ps.Of(id)
	if p == nil {
		return 0, fmt.Errorf("this node has no storage pool %q (--pool)", name)
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

package controller

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// Pools are the capacity promises of the node's storage pools, by name:
// each pool's Space promises its own data directory's space under its own
// lock.
type Pools struct {
	byName map[string]*Space
	names  []string
	store  Store
}

// NewPools returns the pools of spaces, whose names are distinct; store
// holds the volumes' records, which name their pool.
func NewPools(store Store, spaces ...*Space) *Pools {
	ps := &Pools{byName: make(map[string]*Space, len(spaces)), store: store}
	for _, s := range spaces {
		ps.byName[s.Name()] = s
		ps.names = append(ps.names, s.Name())
	}
	sort.Strings(ps.names)
	return ps
}

// Get returns the space of pool name, nil when the node has no such pool.
func (ps *Pools) Get(name string) *Space { return ps.byName[name] }

// All returns the spaces in pool name order.
func (ps *Pools) All() []*Space {
	out := make([]*Space, 0, len(ps.names))
	for _, n := range ps.names {
		out = append(out, ps.byName[n])
	}
	return out
}

// images returns the ID of every volume image of every pool, with the
// space of its pool.
func (ps *Pools) images() (map[string]*Space, error) {
	where := map[string]*Space{}
	for _, space := range ps.All() {
		in, err := space.images.List()
		if err != nil {
			return nil, state.Errorf(state.KindInternal, "listing the volumes of pool %s: %w", space.Name(), err)
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
func (ps *Pools) Of(id string) (string, *Space) {
	v, _ := ps.store.Get(id)
	name := state.PoolOf(v)
	return name, ps.byName[name]
}

// noPool is the failure of a request about a pool this node does not have.
func (ps *Pools) noPool(name string) error {
	return state.Errorf(state.KindResourceExhausted, "this node has no storage pool %s (it has %s)", name, strings.Join(ps.names, ", "))
}

// parsePool reads the pool a request's parameters name: INVALID_ARGUMENT
// for a name no pool can have, RESOURCE_EXHAUSTED for one this node does
// not have (the provisioner then tries another node, as for a full pool).
func (ps *Pools) parsePool(params map[string]string) (string, *Space, error) {
	name, ok := params[contract.PoolKey]
	if !ok {
		name = state.DefaultPool
	}
	if err := state.ValidPoolName(name); err != nil {
		return "", nil, state.Errorf(state.KindInvalidArgument, "%s: %w", contract.PoolKey, err)
	}
	s := ps.byName[name]
	if s == nil {
		return name, nil, ps.noPool(name)
	}
	return name, s, nil
}

// GrowImage grows the image of volume id in pool, within that pool's
// promise (Space.GrowImage); the node's reconciler calls it.
func (ps *Pools) GrowImage(pool, id string, size int64) (int64, error) {
	s := ps.byName[pool]
	if s == nil {
		return 0, ps.noPool(pool)
	}
	return s.GrowImage(id, size)
}

// snapshot returns snapshot id, and the space of the pool that holds it;
// an error matching os.ErrNotExist when no pool does.
func (ps *Pools) snapshot(id string) (devices.SnapshotInfo, *Space, error) {
	for _, s := range ps.All() {
		if s.opts.Snapshots == nil {
			continue
		}
		info, err := s.opts.Snapshots.Get(id)
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

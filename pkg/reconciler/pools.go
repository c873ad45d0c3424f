package reconciler

import (
	"slices"

	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// A storage pool of the node is a Pool of the reconciler's, and so is a
// pool it does not have.
var (
	_ Pool = (*pool.Pool)(nil)
	_ Pool = pool.Missing{}
)

// poolOf resolves the storage pool of v, as its record names it
// (state.PoolOf): once per volume and pass (plan), so that every call about
// the volume's image and snapshots goes to one pool. A pool this node does
// not have (a volume made in a pool configured then) is a pool.Missing,
// whose every call fails saying so.
func (r *Reconciler) poolOf(v *state.Volume) (string, Pool) {
	name := state.PoolOf(v)
	if p, ok := r.cfg.Pools[name]; ok && p != nil {
		return name, p
	}
	has := make([]string, 0, len(r.cfg.Pools))
	for n := range r.cfg.Pools {
		has = append(has, n)
	}
	slices.Sort(has)
	return name, pool.NewMissing(name, has)
}

package reconciler

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// poolOf resolves the storage pool of v, as its record names it
// (state.PoolOf): once per volume and pass (plan), so that every call about
// the volume's image and snapshots goes to one pool. A pool this node does
// not have (a volume made in a pool configured then) is a missingPool.
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
	return name, missingPool{name: name, has: has}
}

// missingPool is a pool this node does not have: its volumes have no image
// here, and every call about one fails saying so.
type missingPool struct {
	name string
	has  []string // the pools the node has, by name
}

func (p missingPool) err() error {
	return fmt.Errorf("this node has no storage pool %q (--pool)", p.name)
}

func (p missingPool) Image(string) string             { return "" }
func (p missingPool) IDOf(string) (string, bool)      { return "", false }
func (p missingPool) ImageSize(string) (int64, error) { return 0, p.err() }
func (p missingPool) Reserve(string) error            { return p.err() }
func (p missingPool) Blank(string) (bool, error)      { return false, p.err() }
func (p missingPool) GrowImage(string, int64) (int64, error) {
	return 0, classified.Errorf(classified.KindResourceExhausted, "this node has no storage pool %s (it has %s)", p.name, strings.Join(p.has, ", "))
}
func (p missingPool) Flush(image string) error             { return fmt.Errorf("%s: %w", image, os.ErrNotExist) }
func (p missingPool) Taken(string) (bool, error)           { return false, p.err() }
func (p missingPool) Guard() capacity.Guard                { return capacity.Guard{} }
func (p missingPool) DeleteSnapshot(string) error          { return p.err() }
func (p missingPool) CopyMode() devices.CopyMode           { return "" }
func (p missingPool) ImageAllocated(string) (int64, error) { return 0, p.err() }
func (p missingPool) Take(context.Context, string, string, devices.SnapshotOf, time.Time) (devices.SnapshotInfo, error) {
	return devices.SnapshotInfo{}, p.err()
}

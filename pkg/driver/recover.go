package driver

import (
	"fmt"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/state"
)

// recover repairs what the last run left on disk, before anything is
// served, in this order:
//
//  1. the store's log, replayed when construct opened the store
//     (openStore), which says how many records it replayed;
//  2. in each pool, in the order they were given, what interrupted image creations and snapshot copies
//     left, removed (pool.Pool.Repair);
//  3. then each pool's filesystem probed (pool.Pool.Probe): after step 2,
//     which frees what the leftovers may have filled;
//  4. the intents of the snapshots only an interrupted clone needed,
//     forgotten (dropTempSnapshotIntents).
//
// The volumes' devices and mounts are repaired by the reconciler's first
// passes (start-up reconstruction), which serve starts: the plugin is
// ready (/readyz, Identity.Probe) once they are done.
//
// A pool that cannot be repaired (a read-only filesystem keeps what an
// interrupted copy left) or probed is logged and served as it is: refusing
// to start would stop every pool's volumes on the node, and the pool's
// own trouble shows in its status (converge_data_directory_unreadable,
// ConvergePoolUnreadable) and in its volumes' conditions.
func (p *plugin) recover() error {
	for _, pool := range p.pools.Configured() {
		if err := pool.Repair(); err != nil {
			klog.ErrorS(err, "Cannot remove what interrupted work left in the storage pool; serving it as it is", "pool", pool.Name())
		}
		pool.Probe()
	}
	return dropTempSnapshotIntents(p.store, p.pools.Get(state.DefaultPool).IsTempSnapshot)
}

// dropTempSnapshotIntents forgets the intents of the snapshots only a clone
// needed (see controller.cloneSource): a restart ended the CreateVolume that
// waited for them, and its retry asks again. With their files, which
// Pool.Repair removed, nothing of an interrupted clone outlives a restart.
func dropTempSnapshotIntents(store *state.Store, isTemp func(id string) bool) error {
	for _, v := range store.List() {
		var temps []string
		for _, id := range v.SnapshotIDs() {
			if isTemp(id) {
				temps = append(temps, id)
			}
		}
		if len(temps) == 0 {
			continue
		}
		if _, err := store.Update(v.ID, func(cur *state.Volume) error {
			for _, id := range temps {
				if s := cur.Snapshots[id]; s != nil {
					cur.ForgetSnapshot(id, s.Generation)
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("forgetting the snapshots of interrupted clones of %s: %w", v.ID, err)
		}
	}
	return nil
}

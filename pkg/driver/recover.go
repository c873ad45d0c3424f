package driver

import (
	"fmt"

	"github.com/converge-csi/converge/pkg/state"
)

// recover repairs what the last run left on disk, before anything is
// served, in this order:
//
//  1. the store's log, replayed when construct opened the store
//     (openStore), which says how many records it replayed;
//  2. in each pool, in the order they were given, what interrupted image creations and snapshot copies
//     left, removed (controller.Pool.Repair);
//  3. then each pool's filesystem probed (controller.Pool.Probe): after step 2,
//     which frees what the leftovers may have filled;
//  4. the intents of the snapshots only an interrupted clone needed,
//     forgotten (dropTempSnapshotIntents).
//
// The volumes' devices and mounts are repaired by the reconciler's first
// passes (start-up reconstruction), which serve starts: the plugin is
// ready (/readyz, Identity.Probe) once they are done.
func (p *plugin) recover() error {
	for _, pool := range p.pools.Configured() {
		if err := pool.Repair(); err != nil {
			return err
		}
		if err := pool.Probe(); err != nil {
			return err
		}
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

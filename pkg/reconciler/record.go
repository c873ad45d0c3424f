package reconciler

import "github.com/converge-csi/converge/pkg/state"

// recordMount records the unique ID of the mount at the staging path
// (act.target "") or at a target, unless the intent changed meanwhile.
func (r *Reconciler) recordMount(id string, act action) error {
	return r.recordKernelState(id, func(v *state.Volume) error {
		v.RecordMountID(act.target, act.generation, act.mountID)
		return nil
	})
}

// recordKernelState writes a change of id's record that only follows the
// kernel's state (a mount's unique ID; a mount or device verified gone)
// without waiting for the disk: a crash of the plugin leaves it in the
// store's log, and a crash of the machine takes the mounts and devices it
// speaks of too, so that what the record says after either still holds.
// The next durable write, or a clean stop, makes it durable.
func (r *Reconciler) recordKernelState(id string, fn func(v *state.Volume) error) error {
	_, _, err := r.cfg.Store.UpdateUnsynced(id, fn)
	return err
}

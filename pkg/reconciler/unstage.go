package reconciler

import (
	"fmt"
	"strings"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// mayHoldOwnMount fails, to be retried, while a mount of the volume whose
// owner could not be told is there: forgetting an intent would forget the
// unique ID that shows a moved mount of it as the plugin's own.
func (a *actual) mayHoldOwnMount() error {
	if len(a.unknownMounts) > 0 {
		return fmt.Errorf("cannot tell yet whether the mount at %s is the plugin's own; keeping the record", strings.Join(a.unknownMounts, ", "))
	}
	return nil
}

// unstage tears a stage down: unmount the staging mount, detach the device,
// forget the stage (once verified gone). It goes on to the next step only
// where the operation can see the one before done: the staging mount was
// the filesystem's only mount in the observation and its unmount succeeded,
// or the device is gone once detached. Otherwise (a device another user
// holds open, say) the next pass's observation decides.
func (r *Reconciler) unstage(v *state.Volume, a *actual) error {
	st := v.Stage
	if err := a.mayHoldOwnMount(); err != nil {
		return err
	}
	if len(a.foreignMounts) > 0 {
		// Someone else's mount of the filesystem outside the roots:
		// unstaging would pull it from under them. Refuse; never touch it.
		return classified.Terminalf(classified.KindFailedPrecondition, "volume %s is still mounted at %s; unmount it before unstaging", v.ID, strings.Join(a.foreignMounts, ", "))
	}
	if a.stageInPlace && !a.block {
		if err := r.cfg.Filesystems.Unmount(st.Path); err != nil {
			return fmt.Errorf("unmounting staging path %s: %w", st.Path, err)
		}
		// Unmounted; the device is still attached.
		// gofail: var reconcilerUnstageAfterUnmount struct{}
		if a.deviceMounts != 1 {
			return nil
		}
	}
	if a.loop != nil && !a.static {
		gone, err := r.cfg.Loops.Detach(a.loop.Device)
		if err != nil {
			return fmt.Errorf("detaching %s: %w", a.loop.Device, err)
		}
		if !gone {
			return nil
		}
	}
	// Detached; the stage's record remains.
	// gofail: var reconcilerUnstageAfterDetach struct{}
	gen := st.Generation
	return r.recordKernelState(v.ID, func(cur *state.Volume) error {
		cur.ForgetStage(gen)
		return nil
	})
}

// release takes one step of releasing an orphaned device: unmount one of
// its mounts inside the allowed roots, else detach it. A mount outside the
// roots is not the plugin's; the device is then left attached and reported.
func (r *Reconciler) release(a *actual) error {
	for _, m := range a.foreignMounts {
		if _, _, err := host.Beneath(m, r.cfg.Roots); err != nil {
			return classified.Errorf(classified.KindFailedPrecondition, "orphaned device %s is mounted at %s, outside the plugin's roots; leaving it", a.loop.Device, m)
		}
		if err := r.cfg.Filesystems.Unmount(m); err != nil {
			return fmt.Errorf("unmounting orphaned mount %s of %s: %w", m, a.loop.Device, err)
		}
		return nil
	}
	if _, err := r.cfg.Loops.Detach(a.loop.Device); err != nil {
		return fmt.Errorf("detaching orphaned %s: %w", a.loop.Device, err)
	}
	return nil
}

// unmountStray unmounts the plugin's own mount id, found at path, which no
// record names (a rename carried it there). If another mount is on top of
// it by now, that one is someone else's: nothing is unmounted, and the next
// pass decides again.
func (r *Reconciler) unmountStray(path string, id uint64) error {
	if err := r.cfg.Filesystems.UnmountOwned(path, id); err != nil {
		return fmt.Errorf("unmounting stray %s: %w", path, err)
	}
	return nil
}

// unmountStaging unmounts an unusable staging mount and keeps the stage: the
// next pass mounts the filesystem again, and mount-utils runs fsck before a
// read-write mount, so a damaged filesystem is checked before it is used.
func (r *Reconciler) unmountStaging(v *state.Volume) error {
	if err := r.cfg.Filesystems.Unmount(v.Stage.Path); err != nil {
		return fmt.Errorf("unmounting unusable staging path %s: %w", v.Stage.Path, err)
	}
	return nil
}

// keepDevice clears the auto-clear flag of the volume's loop device.
func (r *Reconciler) keepDevice(a *actual) error {
	if err := r.cfg.Loops.Keep(a.loop.Device); err != nil {
		return fmt.Errorf("keeping %s attached: %w", a.loop.Device, err)
	}
	return nil
}

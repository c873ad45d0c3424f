package reconciler

import (
	"context"
	"fmt"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// growImage grows the volume's image to the size its expansion asks for.
// What the node cannot hold (RESOURCE_EXHAUSTED, OUT_OF_RANGE) or a data
// directory that cannot allocate ahead of writes is final for the request:
// retrying would fail the same way until something else changes, and the
// kubelet's next NodeExpandVolume tries again. The image is left as it was.
func (r *Reconciler) growImage(v *state.Volume, a *actual) error {
	_, err := a.home.GrowImage(v.ID, v.Expand.Bytes)
	switch e := classified.AsError(err); {
	case e == nil:
		return nil
	case e.Kind == classified.KindResourceExhausted, e.Kind == classified.KindOutOfRange, e.Kind == classified.KindFailedPrecondition:
		return classified.Terminalf(e.Kind, "growing the image of volume %s from %d to %d bytes: %w", v.ID, a.loop.BackingSize, v.Expand.Bytes, err)
	}
	return err
}

// growFsOffline grows an ext4 that nothing uses the way it grows best:
// unmounted (an online resize needs CAP_SYS_RESOURCE and locks out writers
// for a while). It unmounts the staging mount and stages the volume again,
// which checks and grows the filesystem before it mounts it. A growth that
// did not happen then is a failure (retried with backoff, reported), so
// that the loop does not unmount the volume again at once.
func (r *Reconciler) growFsOffline(ctx context.Context, v *state.Volume, a *actual) error {
	if err := r.cfg.Filesystems.Unmount(v.Stage.Path); err != nil {
		return fmt.Errorf("unmounting %s to grow its filesystem: %w", v.Stage.Path, err)
	}
	// Unmounted for the growth; the stage's record still says mounted.
	// gofail: var reconcilerExpandAfterUnmount struct{}
	unmounted := *a
	unmounted.stageInPlace, unmounted.stagingMount = false, nil
	if err := r.stage(ctx, v, &unmounted); err != nil {
		return err
	}
	cur, err := r.cfg.Store.Get(v.ID)
	if err != nil {
		return err
	}
	if cur.FsSize < a.loop.Size {
		return fmt.Errorf("growing the filesystem of volume %s unmounted: it still fills %d of %d bytes (the log says why)", v.ID, cur.FsSize, a.loop.Size)
	}
	return nil
}

// growDevice makes the loop device take its image's size.
func (r *Reconciler) growDevice(a *actual) error {
	if err := r.cfg.Loops.Grow(a.loop.Device); err != nil {
		return err
	}
	// The device is grown; the filesystem is not.
	// gofail: var reconcilerExpandAfterGrowDevice struct{}
	return nil
}

// growFs grows the staged filesystem online to fill the device and records
// the device size it now fills. A failure is retried and reported; it never
// touches the mounts.
func (r *Reconciler) growFs(ctx context.Context, v *state.Volume, a *actual) error {
	if err := r.cfg.Filesystems.Resize(ctx, a.loop.Device, v.Stage.Path); err != nil {
		return deviceError(err, "growing volume %s", v.ID)
	}
	// The filesystem is grown; the size it fills is not recorded.
	// gofail: var reconcilerExpandAfterGrowFs struct{}
	size := a.loop.Size
	_, err := r.cfg.Store.Update(v.ID, func(cur *state.Volume) error {
		cur.FsSize = max(cur.FsSize, size)
		return nil
	})
	return err
}

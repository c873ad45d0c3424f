package reconciler

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// publish bind mounts the staging mount at target, creating the target
// directory (the kubelet creates its parent), and records the new mount's
// unique ID.
func (r *Reconciler) publish(v *state.Volume, a *actual, target string) error {
	p := v.Publishes[target]
	if m := a.targets[target]; m != nil {
		if err := r.checkParent(target); err != nil {
			return err
		}
		return classified.Errorf(classified.KindFailedPrecondition, "target %s holds another mount (%s)", target, m.Source)
	}
	if a.block {
		if err := r.checkParent(target); err != nil {
			return err
		}
		// The target is a file, created by the plugin, on which the
		// device node is bind mounted.
		id, err := r.cfg.Filesystems.BindDevice(a.loop.Device, target, p.ReadOnly)
		if err != nil {
			if errors.Is(err, devices.ErrSymlink) || errors.Is(err, devices.ErrOutsideRoots) {
				return pathError("target path", target, err)
			}
			return deviceError(err, "bind mounting %s at %s", a.loop.Device, target)
		}
		// The device is bound at the target file, its mount ID not recorded.
		// gofail: var reconcilerPublishAfterBindDevice struct{}
		return r.recordMount(v.ID, action{kind: actRecordMount, target: target, mountID: id, generation: p.Generation})
	}
	// The parent is checked only when the mkdir fails, to say why: the
	// mkdir resolves it as the check does, and a second resolution costs
	// every publish (docs/performance.md, "Figures behind the code's
	// choices").
	if err := r.cfg.Paths.Mkdir(target); err != nil {
		if err := r.checkParent(target); err != nil {
			return err
		}
		if errors.Is(err, devices.ErrSymlink) {
			return pathError("target path", target, err)
		}
		return fmt.Errorf("creating target: %w", err)
	}
	// The target directory is made; nothing is mounted on it.
	// gofail: var reconcilerPublishAfterMkdir struct{}
	opts := slices.Clone(p.MountFlags)
	if p.ReadOnly {
		opts = append(opts, "ro")
	}
	id, err := r.cfg.Filesystems.BindMount(v.Stage.Path, target, opts)
	if err != nil {
		return deviceError(err, "bind mounting %s at %s", v.Stage.Path, target)
	}
	// Mounted, and its mount ID not recorded.
	// gofail: var reconcilerPublishAfterBind struct{}

	// Recorded at once, wherever a rename may carry the mount meanwhile:
	// it is the plugin's own only while the record says so.
	return r.recordMount(v.ID, action{kind: actRecordMount, target: target, mountID: id, generation: p.Generation})
}

// checkParent fails unless the parent of target, which the kubelet
// creates, is a directory reached without symlinks.
func (r *Reconciler) checkParent(target string) error {
	if err := r.cfg.Paths.CheckDir(filepath.Dir(target)); err != nil {
		return pathError("parent of target path", filepath.Dir(target), err)
	}
	return nil
}

// unpublish unmounts target and removes it; once the target is verified
// gone it forgets the publish.
func (r *Reconciler) unpublish(v *state.Volume, a *actual, target string) error {
	if err := a.mayHoldOwnMount(); err != nil {
		return err
	}
	if a.targets[target] != nil {
		if err := r.cfg.Filesystems.Unmount(target); err != nil {
			return fmt.Errorf("unmounting %s: %w", target, err)
		}
	}
	// Unmounted; the target directory and the publish's record remain.
	// gofail: var reconcilerUnpublishAfterUnmount struct{}
	err := r.cfg.Paths.Remove(target)
	switch {
	case errors.Is(err, devices.ErrSymlink), errors.Is(err, devices.ErrOutsideRoots):
		// The plugin never creates a target through a symlink, so
		// nothing of ours can be there; leave the foreign path alone.
	case err != nil:
		return fmt.Errorf("removing target: %w", err)
	}
	// The target is gone; the publish's record remains.
	// gofail: var reconcilerUnpublishAfterRemove struct{}
	gen := v.Publishes[target].Generation
	return r.recordKernelState(v.ID, func(cur *state.Volume) error {
		cur.ForgetPublish(target, gen)
		return nil
	})
}

// unmountTarget unmounts the top mount at path and leaves the directory: an
// unusable publish mount (the next pass mounts the target again). The
// target is sealed first (made immutable beneath the mount): the kubelet
// restarts a pod's containers meanwhile without asking the driver, and the
// runtime binds the bare target into them, whose writes would go to the
// node's disk and later hide under the volume. A seal that fails is logged
// and the repair goes on: an unusable volume helps no one.
func (r *Reconciler) unmountTarget(logger klog.Logger, path string) error {
	if err := r.cfg.Paths.Seal(path); err != nil {
		logger.Error(err, "Target left unsealed during its repair: a container started meanwhile can write to the node's disk")
	} else {
		logger.Info("Sealed the target for its repair: a container started before the volume is back cannot write to the node's disk")
	}
	if err := r.cfg.Filesystems.Unmount(path); err != nil {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	return nil
}

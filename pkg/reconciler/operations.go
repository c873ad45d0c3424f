package reconciler

import (
	"context"
	"errors"

	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// fsTypeOf returns the filesystem a stage asks for.
func fsTypeOf(st *state.Stage) string {
	if st.FsType == "" {
		return host.DefaultFsType
	}
	return st.FsType
}

// pathError classifies a failure to resolve a request path: a missing or
// symlinked path is the caller's to fix, so it is terminal.
func pathError(what, path string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return state.Terminalf(state.KindFailedPrecondition, "%s %s does not exist", what, path)
	case errors.Is(err, devices.ErrSymlink):
		return state.Terminalf(state.KindInvalidArgument, "%s %s: a path component is a symlink", what, path)
	case errors.Is(err, devices.ErrOutsideRoots):
		return state.Terminalf(state.KindInvalidArgument, "%s %s is outside the allowed roots", what, path)
	}
	return fmt.Errorf("%s %s: %w", what, path, err)
}

// deviceError classifies a failure of the device layer: what retrying
// cannot fix (a mount the kernel refuses as invalid, a privilege the plugin
// lacks, a device without the filesystem asked for where none may be made,
// a filesystem fsck cannot repair) is terminal, with its real kind, so that
// the request answers it at once instead of a deadline; everything else is
// retried. The cause stays wrapped.
func deviceError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	switch {
	case errors.Is(err, devices.ErrRefused):
		return state.Terminalf(state.KindInvalidArgument, "%s: %w", msg, err)
	case errors.Is(err, devices.ErrNotPermitted), errors.Is(err, devices.ErrNotFormattable):
		return state.Terminalf(state.KindFailedPrecondition, "%s: %w", msg, err)
	case errors.Is(err, devices.ErrFilesystemDamaged):
		// Kept and reported under pods that use it; never formatted.
		return state.Terminalf(state.KindDataLoss, "%s: %w", msg, err)
	}
	return fmt.Errorf("%s: %w", msg, err)
}

// stage attaches the volume's image, checks the filesystem provenance,
// formats only where allowed (invariant 4), mounts the filesystem at the
// staging path and records the provenance.
func (r *Reconciler) stage(ctx context.Context, v *state.Volume, a *actual) error {
	st := v.Stage
	if done, err := r.stageChecks(v, a); done || err != nil {
		return err
	}
	blank := r.blank(v, a)
	dev, devSize, err := r.stageDevice(v, a)
	if err != nil || st.Access == state.AccessBlock {
		// A raw block volume is attached, never formatted nor mounted.
		return err
	}
	want := fsTypeOf(st)
	probe, err := r.filesystemOn(ctx, v, dev, want, blank, !a.static)
	if err != nil {
		return err
	}
	have := probe.Type
	grown := int64(0)
	if have == host.FsExt4 && !st.MountsReadOnly() && v.FsSize < devSize {
		// ext4 grows best before it is mounted: an online resize needs
		// CAP_SYS_RESOURCE and locks out writers for a while. A failure
		// here is left to the online grow after the mount.
		if err := r.cfg.Filesystems.GrowUnmounted(ctx, dev, have); err != nil {
			klog.Background().Error(err, "Cannot grow the filesystem before mounting; will grow it online", "volumeID", v.ID, "device", dev)
		} else {
			grown = devSize
		}
	}
	id, err := r.cfg.Filesystems.FormatAndMount(ctx, probe, st.Path, want, stageOptions(st, want, v.Thin()), st.MkfsOptions)
	if err != nil {
		return deviceError(err, "mounting %s at %s", dev, st.Path)
	}
	if have == "" {
		// Formatted just now: the filesystem fills the device.
		grown = devSize
	}
	return r.recordFormatted(v.ID, want, grown, id, st.Generation)
}

// stageChecks refuses a stage that must not go on, and finishes one whose
// filesystem is already mounted (done).
func (r *Reconciler) stageChecks(v *state.Volume, a *actual) (done bool, err error) {
	st := v.Stage
	if err := r.cfg.Paths.CheckDir(st.Path); err != nil {
		return false, pathError("staging path", st.Path, err)
	}
	if len(a.extraLoops) > 0 {
		// Two devices on one image would let one filesystem be mounted
		// twice, which corrupts it.
		return false, state.Errorf(state.KindFailedPrecondition, "image of volume %s is attached more than once (%s and %s); refusing to mount it",
			v.ID, a.loop.Device, strings.Join(a.extraLoops, ", "))
	}
	if a.staged && !a.block {
		return true, r.recordFormatted(v.ID, a.stagingMount.FsType, 0, 0, 0)
	}
	if a.stagingMount != nil {
		return false, state.Errorf(state.KindFailedPrecondition, "staging path %s holds another mount (%s)", st.Path, a.stagingMount.Source)
	}
	if a.static {
		return false, r.checkIdentity(v, a)
	}
	return false, nil
}

// stageDevice returns the volume's device, attaching its image if needed,
// and the device's size, which a new filesystem fills.
func (r *Reconciler) stageDevice(v *state.Volume, a *actual) (string, int64, error) {
	var devSize int64
	var err error
	if !a.static {
		devSize, err = r.cfg.Images.Size(v.ID)
	}
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, state.Terminalf(state.KindNotFound, "volume %s does not exist", v.ID)
	}
	if err != nil {
		return "", 0, fmt.Errorf("checking image: %w", err)
	}
	if a.loop != nil {
		return a.loop.Device, a.loop.Size, nil
	}
	// Discards are set before anything writes to the device: mkfs
	// discards it whole, which would hand a thick volume's space back; a
	// thin volume's device passes them, so that freed space goes back.
	dev, err := r.cfg.Loops.Attach(r.cfg.Images.Path(v.ID), v.Thin())
	if errors.Is(err, devices.ErrNoLoopDevice) {
		return "", 0, state.Errorf(state.KindResourceExhausted, "attaching volume %s: %w", v.ID, err)
	}
	if err != nil {
		return "", 0, fmt.Errorf("attaching volume %s: %w", v.ID, err)
	}
	return dev, devSize, nil
}

// blank reports whether the image of a volume about to be attached holds
// no data at all, so that its device needs no blkid (the stage's slowest
// command but mkfs): what holds no byte but zeros holds no filesystem nor
// partition table, which is more than blkid can tell. It is asked before
// the device exists, so no write through the device can hide in the
// device's cache; a device attached already, a static device, a raw block
// volume, or an image that cannot be read is probed by blkid.
func (r *Reconciler) blank(v *state.Volume, a *actual) bool {
	if a.static || a.loop != nil || v.Stage.Access == state.AccessBlock {
		return false
	}
	blank, err := r.cfg.Images.Blank(v.ID)
	if err != nil {
		klog.Background().V(2).Info("Cannot tell whether the image holds data; blkid will", "volumeID", v.ID, "err", err)
	}
	return blank && err == nil
}

// filesystemOn probes dev, unless its image was blank, and returns the
// probe (its Type: the filesystem on dev, "" for none), or why the stage
// must not format nor mount it: a partition table, a filesystem the plugin
// made that is gone, another filesystem than want, an empty device staged
// read-only, or the start of a filesystem whose mkfs never finished where
// it was not the plugin's own to finish. A probe that fails fails closed.
// The mount decides from the same probe.
//
// A mkfs that never finished on the volume's own image (own: not a static
// device), which the record says was never formatted, was the plugin's
// own, cut short (unfinished_linux.go): it is done again. Taken for the
// filesystem asked for, it would never mount.
func (r *Reconciler) filesystemOn(ctx context.Context, v *state.Volume, dev, want string, blank, own bool) (devices.Probe, error) {
	var probe devices.Probe
	var err error
	if blank {
		probe = devices.BlankProbe(dev)
	} else {
		probe, err = r.cfg.Filesystems.DiskFormat(ctx, dev)
	}
	if err == nil && probe.Unfinished {
		switch {
		case v.Formatted != "":
			return devices.Probe{}, state.Terminalf(state.KindDataLoss, "volume %s was formatted %s but %s now holds a %s whose mkfs never finished; refusing to format or mount it", v.ID, v.Formatted, dev, probe.Type)
		case !own:
			return devices.Probe{}, state.Terminalf(state.KindFailedPrecondition, "device %s of volume %s holds a %s whose mkfs never finished; refusing to format or mount it", dev, v.ID, probe.Type)
		}
		klog.Background().Info("Formatting anew: the volume's image holds a filesystem whose mkfs never finished", "volumeID", v.ID, "device", dev, "fsType", probe.Type)
		probe = probe.Redo()
	}
	have := probe.Type
	switch {
	case errors.Is(err, devices.ErrPartitioned) && v.Formatted != "":
		// The filesystem the plugin made is gone: as a wiped one.
		return devices.Probe{}, state.Terminalf(state.KindDataLoss, "volume %s was formatted %s but its device %s now carries a partition table; refusing to format or mount it", v.ID, v.Formatted, dev)
	case errors.Is(err, devices.ErrPartitioned):
		return devices.Probe{}, state.Terminalf(state.KindFailedPrecondition, "device of volume %s carries a partition table; refusing to format or mount it", v.ID)
	case err != nil:
		return devices.Probe{}, fmt.Errorf("cannot tell whether %s holds data, refusing to format: %w", dev, err)
	case v.Formatted != "" && have == "":
		return devices.Probe{}, state.Terminalf(state.KindDataLoss, "volume %s was formatted %s but no filesystem is found on %s; refusing to format it again", v.ID, v.Formatted, dev)
	case have != "" && have != want:
		return devices.Probe{}, state.Terminalf(state.KindFailedPrecondition, "volume %s holds a %s filesystem, %s was asked for", v.ID, have, want)
	case have == "" && v.Stage.MountsReadOnly():
		return devices.Probe{}, state.Terminalf(state.KindFailedPrecondition, "volume %s has no filesystem and is staged read-only; it cannot be formatted", v.ID)
	}
	return probe, nil
}

// recordFormatted sets the provenance of a volume once, the device size its
// filesystem is known to fill (0: not known) and, for a staging mount just
// made for the stage of generation gen, the mount's unique ID (0: none), in
// one write that does not wait for the disk.
//
// The provenance guards data written onto the filesystem, and data reaches
// it only through a publish, whose request answers only once its own intent,
// appended to the same log after this record, is durable: the fdatasync that
// makes it so makes this record durable too. A crash of the machine before
// it loses a filesystem with nothing written to it through the plugin, and
// with it at worst the record that it was made here: the next stage finds
// the filesystem (mkfs syncs what it wrote) and records it again, or, had
// the filesystem gone too, formats the device anew, which is what blkid
// allows for a device that positively holds nothing. The size is a hint: a
// lost one makes the next stage grow the filesystem, a no-op. So the stage
// pays no fdatasync of its own after its mkfs and mount (0.5 ms here).
func (r *Reconciler) recordFormatted(id, fsType string, fsSize int64, mountID uint64, gen int64) error {
	_, _, err := r.cfg.Store.Write(id, func(v *state.Volume) error {
		if v.Formatted == "" {
			v.Formatted = fsType
		}
		v.FsSize = max(v.FsSize, fsSize)
		if mountID != 0 {
			v.RecordMountID("", gen, mountID)
		}
		return nil
	})
	return err
}

// stageOptions returns the mount options of a staging mount, of a thin
// volume when thin.
func stageOptions(st *state.Stage, fsType string, thin bool) []string {
	opts := slices.Clone(st.MountFlags)
	if st.ReadOnly {
		opts = append(opts, "ro")
	}
	if thin && !st.MountsReadOnly() && !slices.ContainsFunc(opts, func(o string) bool { return o == "nodiscard" || strings.HasPrefix(o, "discard") }) {
		// A thin volume hands the space its files free back to the data
		// directory as they are deleted: the loop device turns each
		// discard into a hole in the image. btrfs batches them.
		if fsType == host.FsBtrfs {
			opts = append(opts, "discard=async")
		} else {
			opts = append(opts, "discard")
		}
	}
	if fsType == host.FsExt4 && !slices.ContainsFunc(opts, func(o string) bool { return strings.HasPrefix(o, "errors=") }) {
		// Stop writing at the first error instead of piling more writes on
		// a damaged filesystem; the reconciler reports it and remounts
		// after fsck once no pod uses it.
		opts = append(opts, "errors=remount-ro")
	}
	if fsType == host.FsXFS && !slices.Contains(opts, "nouuid") {
		// Clones of one image share a UUID; xfs refuses the second mount.
		opts = append(opts, "nouuid")
	}
	return opts
}

// reserve allocates the holes of the image of a volume that is not thin. A
// volume made before provisioning was recorded is thick from then on.
func (r *Reconciler) reserve(v *state.Volume, a *actual) error {
	if err := r.cfg.Images.Reserve(v.ID); err != nil {
		return err
	}
	klog.Background().Info("Reserved the space of a volume", "volumeID", v.ID, "bytes", a.holes())
	if v.Provisioning != "" {
		return nil
	}
	_, err := r.cfg.Store.Update(v.ID, func(v *state.Volume) error {
		if v.Provisioning == "" {
			v.Provisioning = state.ProvisionThick
		}
		return nil
	})
	return err
}

// publish bind mounts the staging mount at target, creating the target
// directory (the kubelet creates its parent), and records the new mount's
// unique ID.
func (r *Reconciler) publish(v *state.Volume, a *actual, target string) error {
	p := v.Publishes[target]
	if err := r.cfg.Paths.CheckDir(filepath.Dir(target)); err != nil {
		return pathError("parent of target path", filepath.Dir(target), err)
	}
	if m := a.targets[target]; m != nil {
		return state.Errorf(state.KindFailedPrecondition, "target %s holds another mount (%s)", target, m.Source)
	}
	if a.block {
		// The target is a file, created by the plugin, on which the
		// device node is bind mounted.
		id, err := r.cfg.Filesystems.BindDevice(a.loop.Device, target, p.ReadOnly)
		if err != nil {
			if errors.Is(err, devices.ErrSymlink) || errors.Is(err, devices.ErrOutsideRoots) {
				return pathError("target path", target, err)
			}
			return deviceError(err, "bind mounting %s at %s", a.loop.Device, target)
		}
		return r.recordMount(v.ID, action{kind: actRecordMount, target: target, mountID: id, generation: p.Generation})
	}
	if err := r.cfg.Paths.Mkdir(target); err != nil {
		if errors.Is(err, devices.ErrSymlink) {
			return pathError("target path", target, err)
		}
		return fmt.Errorf("creating target: %w", err)
	}
	opts := slices.Clone(p.MountFlags)
	if p.ReadOnly {
		opts = append(opts, "ro")
	}
	id, err := r.cfg.Filesystems.BindMount(v.Stage.Path, target, opts)
	if err != nil {
		return deviceError(err, "bind mounting %s at %s", v.Stage.Path, target)
	}
	// Recorded at once, wherever a rename may carry the mount meanwhile:
	// it is the plugin's own only while the record says so.
	return r.recordMount(v.ID, action{kind: actRecordMount, target: target, mountID: id, generation: p.Generation})
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
	err := r.cfg.Paths.Remove(target)
	switch {
	case errors.Is(err, devices.ErrSymlink), errors.Is(err, devices.ErrOutsideRoots):
		// The plugin never creates a target through a symlink, so
		// nothing of ours can be there; leave the foreign path alone.
	case err != nil:
		return fmt.Errorf("removing target: %w", err)
	}
	gen := v.Publishes[target].Generation
	return r.recordKernelState(v.ID, func(cur *state.Volume) error {
		cur.ForgetPublish(target, gen)
		return nil
	})
}

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
		return state.Terminalf(state.KindFailedPrecondition, "volume %s is still mounted at %s; unmount it before unstaging", v.ID, strings.Join(a.foreignMounts, ", "))
	}
	if a.staged && !a.block {
		if err := r.cfg.Filesystems.Unmount(st.Path); err != nil {
			return fmt.Errorf("unmounting staging path %s: %w", st.Path, err)
		}
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
			return state.Errorf(state.KindFailedPrecondition, "orphaned device %s is mounted at %s, outside the plugin's roots; leaving it", a.loop.Device, m)
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

// unmountTarget unmounts the top mount at path and leaves the directory: an
// unusable publish mount (the next pass mounts the target again).
func (r *Reconciler) unmountTarget(path string) error {
	if err := r.cfg.Filesystems.Unmount(path); err != nil {
		return fmt.Errorf("unmounting %s: %w", path, err)
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
	_, _, err := r.cfg.Store.Write(id, fn)
	return err
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

// growImage grows the volume's image to the size its expansion asks for.
// What the node cannot hold (RESOURCE_EXHAUSTED, OUT_OF_RANGE) or a data
// directory that cannot allocate ahead of writes is final for the request:
// retrying would fail the same way until something else changes, and the
// kubelet's next NodeExpandVolume tries again. The image is left as it was.
func (r *Reconciler) growImage(v *state.Volume, a *actual) error {
	_, err := r.cfg.ImagePromise.GrowImage(v.ID, v.Expand.Bytes)
	switch e := state.AsError(err); {
	case e == nil:
		return nil
	case e.Kind == state.KindResourceExhausted, e.Kind == state.KindOutOfRange, e.Kind == state.KindFailedPrecondition:
		return state.Terminalf(e.Kind, "growing the image of volume %s from %d to %d bytes: %w", v.ID, a.loop.BackingSize, v.Expand.Bytes, err)
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
	unmounted := *a
	unmounted.staged, unmounted.stagingMount = false, nil
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
	return r.cfg.Loops.Grow(a.loop.Device)
}

// growFs grows the staged filesystem online to fill the device and records
// the device size it now fills. A failure is retried and reported; it never
// touches the mounts.
func (r *Reconciler) growFs(ctx context.Context, v *state.Volume, a *actual) error {
	if err := r.cfg.Filesystems.Resize(ctx, a.loop.Device, v.Stage.Path); err != nil {
		return deviceError(err, "growing volume %s", v.ID)
	}
	size := a.loop.Size
	_, err := r.cfg.Store.Update(v.ID, func(cur *state.Volume) error {
		cur.FsSize = max(cur.FsSize, size)
		return nil
	})
	return err
}

// checkIdentity makes sure a static volume's device is there and is the
// device it was first staged on, and records its identity at the first
// stage. Another device at the same path is refused for good: fail closed.
func (r *Reconciler) checkIdentity(v *state.Volume, a *actual) error {
	st := v.Stage
	if r.cfg.Static == nil {
		return state.Terminalf(state.KindInvalidArgument, "volume %s names device %s, but static devices are not enabled", v.ID, st.Device)
	}
	if a.loop == nil {
		_, err := r.cfg.Static.Resolve(st.Device)
		if errors.Is(err, devices.ErrOutsideRoots) {
			return state.Terminalf(state.KindInvalidArgument, "device %s of volume %s: %w", st.Device, v.ID, err)
		}
		// Missing for now (a disk not yet attached): retried.
		return state.Errorf(state.KindFailedPrecondition, "device %s of volume %s is not usable: %w", st.Device, v.ID, err)
	}
	id, err := r.cfg.Static.Identity(*a.loop)
	if err != nil {
		return fmt.Errorf("identifying %s: %w", a.loop.Device, err)
	}
	switch {
	case id == "":
		return state.Terminalf(state.KindFailedPrecondition, "device %s (%s) of volume %s has no WWID, serial or other identity; refusing to use a device that cannot be told from another", st.Device, a.loop.Device, v.ID)
	case v.DeviceID != "" && id != v.DeviceID:
		return state.Terminalf(state.KindFailedPrecondition, "device %s of volume %s is now %s (%s), not %s that it was first staged on; refusing it", st.Device, v.ID, a.loop.Device, id, v.DeviceID)
	case v.DeviceID == "":
		_, err := r.cfg.Store.Update(v.ID, func(cur *state.Volume) error {
			if cur.DeviceID == "" {
				cur.DeviceID = id
			}
			return nil
		})
		return err
	}
	return nil
}

package reconciler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
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
	// The image is attached and not yet probed nor formatted.
	// gofail: var reconcilerStageAfterAttach struct{}
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
	// Grown (when it was to be), and not mounted.
	// gofail: var reconcilerStageAfterGrow struct{}
	id, err := r.cfg.Filesystems.FormatAndMount(ctx, probe, st.Path, want, stageOptions(st, want, v.Thin()), st.MkfsOptions)
	if err != nil {
		return deviceError(err, "mounting %s at %s", dev, st.Path)
	}
	if have == "" {
		// Formatted just now: the filesystem fills the device.
		grown = devSize
	}
	// Mounted, and neither its provenance nor its mount ID recorded.
	// gofail: var reconcilerStageAfterMount struct{}
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
		return false, classified.Errorf(classified.KindFailedPrecondition, "image of volume %s is attached more than once (%s and %s); refusing to mount it",
			v.ID, a.loop.Device, strings.Join(a.extraLoops, ", "))
	}
	if a.stageInPlace && !a.block {
		return true, r.recordFormatted(v.ID, a.stagingMount.FsType, 0, 0, 0)
	}
	if a.stagingMount != nil {
		return false, classified.Errorf(classified.KindFailedPrecondition, "staging path %s holds another mount (%s)", st.Path, a.stagingMount.Source)
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
		devSize, err = a.home.ImageSize(v.ID)
	}
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, classified.Terminalf(classified.KindNotFound, "volume %s does not exist", v.ID)
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
	dev, err := r.cfg.Loops.Attach(a.home.Image(v.ID), v.Thin())
	if errors.Is(err, devices.ErrNoLoopDevice) {
		return "", 0, classified.Errorf(classified.KindResourceExhausted, "attaching volume %s: %w", v.ID, err)
	}
	if err != nil {
		return "", 0, fmt.Errorf("attaching volume %s: %w", v.ID, err)
	}
	r.noteDevice(v.ID, dev)
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
	blank, err := a.home.Blank(v.ID)
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
			return devices.Probe{}, classified.Terminalf(classified.KindDataLoss, "volume %s was formatted %s but %s now holds a %s whose mkfs never finished; refusing to format or mount it", v.ID, v.Formatted, dev, probe.Type)
		case !own:
			return devices.Probe{}, classified.Terminalf(classified.KindFailedPrecondition, "device %s of volume %s holds a %s whose mkfs never finished; refusing to format or mount it", dev, v.ID, probe.Type)
		}
		klog.Background().Info("Formatting anew: the volume's image holds a filesystem whose mkfs never finished", "volumeID", v.ID, "device", dev, "fsType", probe.Type)
		probe = probe.Redo()
	}
	have := probe.Type
	switch {
	case errors.Is(err, devices.ErrPartitioned) && v.Formatted != "":
		// The filesystem the plugin made is gone: as a wiped one.
		return devices.Probe{}, classified.Terminalf(classified.KindDataLoss, "volume %s was formatted %s but its device %s now carries a partition table; refusing to format or mount it", v.ID, v.Formatted, dev)
	case errors.Is(err, devices.ErrPartitioned):
		return devices.Probe{}, classified.Terminalf(classified.KindFailedPrecondition, "device of volume %s carries a partition table; refusing to format or mount it", v.ID)
	case err != nil:
		return devices.Probe{}, fmt.Errorf("cannot tell whether %s holds data, refusing to format: %w", dev, err)
	case v.Formatted != "" && have == "":
		return devices.Probe{}, classified.Terminalf(classified.KindDataLoss, "volume %s was formatted %s but no filesystem is found on %s; refusing to format it again", v.ID, v.Formatted, dev)
	case have != "" && have != want:
		return devices.Probe{}, classified.Terminalf(classified.KindFailedPrecondition, "volume %s holds a %s filesystem, %s was asked for", v.ID, have, want)
	case have == "" && v.Stage.MountsReadOnly():
		return devices.Probe{}, classified.Terminalf(classified.KindFailedPrecondition, "volume %s has no filesystem and is staged read-only; it cannot be formatted", v.ID)
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
// pays no fdatasync of its own after its mkfs and mount
// (docs/performance.md, "Figures behind the code's choices").
func (r *Reconciler) recordFormatted(id, fsType string, fsSize int64, mountID uint64, gen int64) error {
	_, _, err := r.cfg.Store.UpdateUnsynced(id, func(v *state.Volume) error {
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

// checkIdentity makes sure a static volume's device is there and is the
// device it was first staged on, and records its identity at the first
// stage. Another device at the same path is refused for good: fail closed.
func (r *Reconciler) checkIdentity(v *state.Volume, a *actual) error {
	st := v.Stage
	if r.cfg.Static == nil {
		return classified.Terminalf(classified.KindInvalidArgument, "volume %s names device %s, but static devices are not enabled", v.ID, st.Device)
	}
	if a.loop == nil {
		_, err := r.cfg.Static.Resolve(st.Device)
		if errors.Is(err, devices.ErrOutsideRoots) {
			return classified.Terminalf(classified.KindInvalidArgument, "device %s of volume %s: %w", st.Device, v.ID, err)
		}
		// Missing for now (a disk not yet attached): retried.
		return classified.Errorf(classified.KindFailedPrecondition, "device %s of volume %s is not usable: %w", st.Device, v.ID, err)
	}
	id, err := r.cfg.Static.Identity(*a.loop)
	if err != nil {
		return fmt.Errorf("identifying %s: %w", a.loop.Device, err)
	}
	switch {
	case id == "":
		return classified.Terminalf(classified.KindFailedPrecondition, "device %s (%s) of volume %s has no WWID, serial or other identity; refusing to use a device that cannot be told from another", st.Device, a.loop.Device, v.ID)
	case v.DeviceID != "" && id != v.DeviceID:
		return classified.Terminalf(classified.KindFailedPrecondition, "device %s of volume %s is now %s (%s), not %s that it was first staged on; refusing it", st.Device, v.ID, a.loop.Device, id, v.DeviceID)
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

// reserve allocates the holes of the image of a volume that is not thin. A
// volume made before provisioning was recorded is thick from then on.
func (r *Reconciler) reserve(v *state.Volume, a *actual) error {
	if err := a.home.Reserve(v.ID); err != nil {
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

package pool

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// Within runs fn holding the pool's promise still: no image is made,
// grown, restored or removed and no snapshot is asked for until fn
// returns, and fn's checks and changes go through pr. It returns fn's
// failure.
func (p *Pool) Within(fn func(pr Promise) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fn(Promise{p})
}

// Promise is a pool's promise of space held still by Within, which alone
// hands one out: every check of what the pool can promise, and every
// change of its images' space, is a method of it, so it is made within.
type Promise struct{ p *Pool }

// Account is the state of the pool's space as CreateVolume and
// GetCapacity see it, with its filesystem's size: the volumes being
// restored are promised their size, and the guard nothing.
func (p *Pool) Account() (capacity.Account, int64, error) {
	return account(p.images, p.store, p.ratio, p.guard, p.mode(), p.restores.promised())
}

// mode is how snapshots are copied here ("" when none are served: copies).
func (p *Pool) mode() devices.CopyMode {
	return p.snapshots.Mode
}

// account derives the state of a pool's space from its images and
// their records, for thin volumes at ratio, the guard kept free, and
// snapshots copied as mode says. The volumes being restored (by ID) are promised their size (and
// provisioning) already: until a copy is an image, it is accounted as an
// image of that size holding what the copy wrote so far, which the free
// space no longer counts; once it is, the image counts itself. The images
// are listed before the copies are looked at, so a copy renamed to its
// image in between is counted once, whole, rather than twice.
func account(images *devices.Images, store Store, ratio float64, guard capacity.Guard, mode devices.CopyMode, restoring map[string]capacity.Image) (capacity.Account, int64, error) {
	total, free, err := images.Capacity()
	if err != nil {
		return capacity.Account{}, 0, err
	}
	usages, err := images.Usages()
	if err != nil {
		return capacity.Account{}, 0, fmt.Errorf("listing images: %w", err)
	}
	ims := make([]capacity.Image, 0, len(usages)+len(restoring))
	made := make(map[string]bool, len(usages))
	for _, u := range usages {
		im := imageOf(u)
		if v, err := store.Get(u.ID); err == nil {
			im.Thin = v.Thin()
			im.Copying = int64(len(v.Snapshots)) * snapshotNeed(mode, u)
		}
		ims = append(ims, im)
		made[u.ID] = true
	}
	for id, im := range restoring {
		if made[id] {
			continue
		}
		if u, err := images.Copying(id); err == nil {
			im.Allocated, im.Shared = u.Allocated, u.Shared
		} else {
			// Unknown: the whole size stays owed.
			klog.ErrorS(err, "Cannot tell what a restore copied so far; counting its whole size", "volumeID", id)
		}
		ims = append(ims, im)
	}
	return capacity.New(free, guard.Threshold(total), ratio, ims), total, nil
}

// Available is what can still be promised to a volume, thin or thick,
// above the guard (0 for a thin one while the pool is nearly
// full), and the largest volume that could be: exactly what a
// CreateVolume would be promised now.
func (p *Pool) Available(thin bool) (avail, largest int64, err error) {
	acc, total, err := p.Account()
	if err != nil {
		return 0, 0, classified.Errorf(classified.KindInternal, "%w", err)
	}
	// Thin volumes may be promised more than the filesystem holds, but no
	// one of them can be larger than it.
	avail = acc.Available(thin)
	return avail, min(avail, total), nil
}

// CheckVolume checks that an image of have bytes may grow to size bytes (have
// 0: a new one), thin or thick: RESOURCE_EXHAUSTED when the pool
// cannot hold it above its guard, or for a thin volume when it is nearly
// full; OUT_OF_RANGE when it never could. Volumes made already are never
// checked: one promised before the guard was (the pool past its guard)
// keeps its space, and only what more is asked is refused.
func (pr Promise) CheckVolume(thin bool, size, have int64) error {
	p := pr.p
	acc, total, err := p.Account()
	if err != nil {
		return classified.Errorf(classified.KindInternal, "%w", err)
	}
	if size > total {
		return classified.Errorf(classified.KindOutOfRange, "%d bytes is more than the %d bytes of pool %s's filesystem", size, total, p.name)
	}
	kind := state.ProvisionThick
	if thin {
		kind = state.ProvisionThin
		if acc.NearlyFull() {
			return classified.Errorf(classified.KindResourceExhausted, "pool %s is nearly full (%d bytes free, below its guard of %d bytes): no volume is created or grown in it until it has room", p.name, acc.Free, acc.Guard)
		}
	}
	if avail := acc.Available(thin); size-have > avail {
		return classified.Errorf(classified.KindResourceExhausted, "%d more bytes requested, %d bytes of pool %s can still be promised to a %s volume (%d bytes free, %d of them kept free by its guard, %d owed to thick volumes, %d promised to thin volumes at an overprovisioning ratio of %g)",
			size-have, avail, p.name, kind, acc.Free, acc.Guard, acc.ThickOwed, acc.ThinPromised, p.ratio)
	}
	return nil
}

// CheckSnapshots checks that the pool can hold a snapshot of each of
// the volumes ids (one, or a group's members) together without breaking a
// promise (snapshotNeed says what each takes): NOT_FOUND when a volume has
// no image here, RESOURCE_EXHAUSTED when the space is
// not there or the pool is below its guard, where a snapshot that takes
// nothing at once still keeps blocks that a deletion would free. The
// snapshots asked for and not yet taken are promised theirs already
// (capacity.Account.Copying).
func (pr Promise) CheckSnapshots(ids ...string) error {
	p := pr.p
	var need int64
	for _, id := range ids {
		u, err := p.images.Usage(id)
		if errors.Is(err, os.ErrNotExist) {
			return state.NotFound(id)
		}
		if err != nil {
			return classified.Errorf(classified.KindInternal, "checking volume %s: %w", id, err)
		}
		need += snapshotNeed(p.mode(), u)
	}
	what := "a snapshot of volume " + strings.Join(ids, "") + " needs"
	if len(ids) > 1 {
		what = "snapshots of volumes " + strings.Join(ids, ", ") + " together need"
	}
	acc, _, err := p.Account()
	if err != nil {
		return classified.Errorf(classified.KindInternal, "%w", err)
	}
	if acc.NearlyFull() {
		return classified.Errorf(classified.KindResourceExhausted, "pool %s is nearly full (%d bytes free, below its guard of %d bytes): no snapshot is taken in it until it has room", p.name, acc.Free, acc.Guard)
	}
	if avail := acc.ThickAvailable(); need > avail {
		return classified.Errorf(classified.KindResourceExhausted, "%s %d bytes of pool %s (copied by %s), %d can still be promised (%d bytes free, %d of them kept free by its guard)",
			what, need, p.name, p.mode(), avail, acc.Free, acc.Guard)
	}
	return nil
}

// snapshotNeed is the space a snapshot of an image whose usage is u takes
// from the pool's promises, copied as mode says: by a copy,
// its allocated blocks at once; by a reflink nothing at once, but every
// block the image held of its own (capacity.Image.Own) is shared then and
// a write there takes a new one: a thick image owes them, and a thin one
// no longer holds them, so its promise needs them backed anew. Thick or
// thin, the promise grows by at most that.
func snapshotNeed(mode devices.CopyMode, u devices.Usage) int64 {
	if mode != devices.CopyReflink {
		return u.Allocated
	}
	return imageOf(u).Own()
}

// imageOf is what the accounting knows of an image whose usage is u,
// before its record says how it was provisioned.
func imageOf(u devices.Usage) capacity.Image {
	return capacity.Image{Size: u.Size, Allocated: u.Allocated, Shared: u.Shared}
}

// GrowImage grows id's image to at least size bytes (in whole 4 KiB
// blocks), allocating the new space of a thick volume, once the pool can
// promise it, and returns the image's size. An image already
// that large is left as it is: images never shrink. The node's reconciler
// calls it for NodeExpandVolume, while the volume is staged: the device and
// the filesystem grow after it. A missing image is NOT_FOUND; a size the
// pool cannot hold now is RESOURCE_EXHAUSTED, one it never could
// OUT_OF_RANGE.
func (p *Pool) GrowImage(id string, size int64) (grown int64, err error) {
	err = p.Within(func(pr Promise) error {
		grown, err = pr.grow(id, size)
		return err
	})
	return grown, err
}

// grow is GrowImage within the promise.
func (pr Promise) grow(id string, size int64) (int64, error) {
	p := pr.p
	cur, err := p.images.Size(id)
	if errors.Is(err, os.ErrNotExist) {
		return 0, state.NotFound(id)
	}
	if err != nil {
		return 0, classified.Errorf(classified.KindInternal, "checking volume %s: %w", id, err)
	}
	if size <= cur {
		return cur, nil
	}
	if size, err = SizeFor(state.Range{Required: size}, MinVolumeSize); err != nil {
		return 0, err
	}
	thin := false
	if v, err := p.store.Get(id); err == nil {
		thin = v.Thin()
	}
	if err := pr.CheckVolume(thin, size, cur); err != nil {
		return 0, err
	}
	size, err = p.images.Grow(id, size, !thin)
	if err != nil {
		return 0, imageError(err, "growing volume %s", id)
	}
	klog.V(2).InfoS("Grew volume image", "volumeID", id, "pool", p.name, "from", cur, "bytes", size, "thin", thin)
	return size, nil
}

// Record notes that volume id (named name) is made as prov in this pool
// (the default pool recorded as none, as before pools), for access (see
// state.Volume.Access: a record that says block already stays so), held
// to limits (its class's IO limits; none when zero), before its image is:
// an image is then never accounted as another provisioning than it was
// made with, and a crash before the image leaves a record that accounts
// for nothing, which the retry of the request makes the image of. The
// name tells this volume's image from one that a volume made before IDs
// named their node left under this ID.
func (pr Promise) Record(id, name string, prov state.Provisioning, access state.AccessType, limits host.IOLimits) error {
	_, err := pr.p.store.Update(id, func(v *state.Volume) error {
		v.RecordMade(name, pr.p.name, prov, access, limits)
		return nil
	})
	return err
}

// unrecord undoes Record for a volume whose image was not made. Should
// that fail, the record accounts for nothing (accounting goes by images)
// and the next CreateVolume of the name writes it again.
func (pr Promise) unrecord(id string) {
	if _, err := pr.p.store.Update(id, func(v *state.Volume) error { v.ForgetMade(); return nil }); err != nil {
		klog.ErrorS(err, "Cannot clear the record of a volume that was not made", "volumeID", id)
	}
}

// MakeImage makes the image of a new volume id of size bytes, promised
// already; on failure the record is cleared as for any volume not made.
func (pr Promise) MakeImage(id string, size int64, prov state.Provisioning) error {
	if err := pr.p.images.Create(id, size, prov == state.ProvisionThick); err != nil {
		pr.unrecord(id)
		return imageError(err, "creating volume %s", id)
	}
	return nil
}

// Remove removes the image of volume id, whose record is marked as being
// removed, then forgets the volume. An image gone already is no error.
func (pr Promise) Remove(id string) error {
	p := pr.p
	if err := p.images.Delete(id); err != nil {
		return classified.Errorf(classified.KindInternal, "deleting image of %s: %w", id, err)
	}
	// The image is gone; the record still says the removal started.
	// gofail: var poolDeleteAfterImage struct{}
	if _, err := p.store.Update(id, func(v *state.Volume) error { v.FinishRemoval(); return nil }); err != nil {
		return err
	}
	p.store.DropTerminalFailures(id)
	return nil
}

// imageError classifies a failure to size an image: no space is
// RESOURCE_EXHAUSTED, a filesystem that cannot allocate ahead of writes is
// FAILED_PRECONDITION, and anything else INTERNAL.
func imageError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	switch {
	case state.NoSpace(err):
		return classified.Errorf(classified.KindResourceExhausted, "%s: %w", msg, err)
	case errors.Is(err, devices.ErrCannotAllocate):
		return classified.Errorf(classified.KindFailedPrecondition, "%s: %w; thick volumes cannot be kept here, ask for %s: %s", msg, err, contract.ProvisioningKey, state.ProvisionThin)
	}
	return classified.Errorf(classified.KindInternal, "%s: %w", msg, err)
}

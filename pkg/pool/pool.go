package pool

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/locks"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// Store is what a pool needs of the store of volume records: a volume's
// record says which pool holds it and how it was provisioned, and the
// promise writes that a volume is made, or removed, in it.
type Store interface {
	Get(id string) (*state.Volume, error)
	Update(id string, fn func(v *state.Volume) error) (*state.Volume, error)
	DropTerminalFailures(id string)
}

// Options configure a storage pool.
type Options struct {
	// Name is the storage pool's name; empty for the default pool.
	Name string
	// Dir is the pool's data directory, on a filesystem of its own: the
	// images of its volumes, and their snapshots in Dir/snapshots (made
	// at the first snapshot).
	Dir string
	// Ratio is the overprovisioning ratio of thin volumes (at least 1).
	Ratio float64
	// Guard is the free space that no promise takes: no volume, thick or
	// thin, is created or grown into it, nor a snapshot that takes space
	// taken; below it, no volume is created or grown and no snapshot
	// taken at all. Nil: the default for the pool's filesystem
	// (capacity.DefaultGuardFor).
	Guard *capacity.Guard
	// KubeletFilesystem is true when the pool's filesystem holds the
	// kubelet's directory, whose free space the kubelet evicts pods to
	// keep (Open finds out).
	KubeletFilesystem bool
	// CopyMode is how snapshots are copied until Probe finds out what the
	// pool's filesystem can do; Probe's answer replaces it. Empty, no
	// copy is made before Probe: csi-node probes every pool before it
	// serves, and tests that do not probe name a mode.
	CopyMode devices.CopyMode
	// Copy makes the image of a restored volume from its snapshot; nil is
	// CopySnapshot. Tests hold copies up or make them fail through it.
	Copy CopyFunc
}

// CopyFunc makes the image of volume id in pool into, of size bytes (every
// block allocated when thick), from snapshot snap, which pool from holds
// (into or another). It leaves the image whole or absent.
type CopyFunc func(ctx context.Context, into *Pool, id string, from *Pool, snap devices.SnapshotInfo, size int64, thick bool) error

// Pool is one storage pool of this node: a data directory on a filesystem
// of its own, which holds its volumes' images and their snapshots, with
// its guard, its overprovisioning ratio and what its filesystem can do
// (Probe), and its capacity promise: what its images, the snapshots asked
// for and the restores under way were promised, and what can still be.
// Every change of an image's space (made, grown, restored, removed) and
// every snapshot asked for is decided within one lock (Within), so no two
// of them promise the same free space. The node's reconciler reaches a
// volume's images and snapshots through it (GrowImage, Take...), and the
// CSI controller makes, restores and removes them.
type Pool struct {
	images    *devices.Images
	snapshots *devices.Snapshots
	store     Store
	name      string
	ratio     float64
	guard     capacity.Guard
	kubeletFS bool
	// fsType and punchesHoles are what Probe found of the pool's
	// filesystem.
	fsType       string
	punchesHoles bool
	restores     restores
	// copies is the context of the restores' copies; Close ends it.
	copies context.Context
	cancel context.CancelFunc

	// mu is held for each promise and the change it allows (Within).
	// Lock order: the controller's snapshot lock, then mu, then
	// restores.mu.
	mu locks.Mutex
	// copy makes a restored volume's image (Options.Copy).
	copy CopyFunc
}

// New returns storage pool opts.Name, whose volumes' records are in
// store. It opens nothing: Repair and Probe look at its directory.
func New(store Store, opts Options) *Pool {
	if opts.Name == "" {
		opts.Name = state.DefaultPool
	}
	p := &Pool{
		images:    &devices.Images{Dir: opts.Dir},
		snapshots: &devices.Snapshots{Dir: filepath.Join(opts.Dir, "snapshots"), Mode: opts.CopyMode},
		store:     store, name: opts.Name, ratio: opts.Ratio, kubeletFS: opts.KubeletFilesystem,
		guard: capacity.DefaultGuardFor(opts.KubeletFilesystem),
		copy:  opts.Copy,
	}
	if opts.Guard != nil {
		p.guard = *opts.Guard
	}
	if p.copy == nil {
		p.copy = CopySnapshot
	}
	p.copies, p.cancel = context.WithCancel(context.Background())
	return p
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.name }

// Close ends the restores' copies, which leave no image (the retried
// CreateVolume makes it anew), and waits for them. A pool closed already
// has nothing to end.
func (p *Pool) Close() {
	p.cancel()
	p.restores.stop()
}

// What a pool is besides its promise (promise.go): its directory, repaired
// and probed at start-up, the calls of the node's reconciler about a
// volume's image and snapshots, and its status.

// Repair removes what interrupted image creations and snapshot copies left
// in the pool; a pool with nothing left over is left as it is.
func (p *Pool) Repair() error {
	if err := p.images.RemoveStaleTemps(); err != nil {
		return fmt.Errorf("pool %s: removing interrupted image creations: %w", p.name, err)
	}
	if err := devices.RemoveStaleTemps(p.snapshots.Dir); err != nil {
		return fmt.Errorf("pool %s: removing interrupted snapshots: %w", p.name, err)
	}
	return nil
}

// Probe finds out how the pool's filesystem copies (reflinks where it
// shares blocks; the copies are made in the data directory, on the same
// filesystem as the snapshots) and whether it punches holes, and reports
// the pool. Run it once what a crash left is gone (Repair), which frees
// what the leftovers may have filled, and before anything is served. A
// probe that fails (a full or read-only filesystem cannot take the probe's
// files) is logged and never stops the start, which would stop every
// pool's volumes on the node; it is made again at the next start.
func (p *Pool) Probe() {
	var holesErr error
	if p.fsType, p.punchesHoles, holesErr = devices.ProbeFilesystem(p.images.Dir); holesErr != nil {
		klog.ErrorS(holesErr, "Cannot tell whether the storage pool punches holes; reported as not until csi-node starts again", "pool", p.name)
	}
	mode, err := devices.ProbeCopyMode(p.images.Dir)
	// Where images share blocks with their snapshots, a thick image
	// owes what it shares: its writes there take new blocks.
	p.images.Shares = mode == devices.CopyReflink
	if err != nil {
		// Copies then never share blocks: correct anywhere, only slower
		// where reflinks would have worked. On a filesystem that may
		// reflink (what snapshots made before share), images' shared
		// blocks are still looked for, so that a thick image is never
		// owed too little; FIEMAP finds none where nothing was shared.
		p.images.Shares = p.fsType == "xfs" || p.fsType == "btrfs"
		klog.ErrorS(err, "Cannot tell whether the storage pool shares blocks; snapshots are copied without reflinks until csi-node starts again", "pool", p.name, "countsShared", p.images.Shares)
		mode = devices.CopySparse
	}
	p.snapshots.Mode = mode
	klog.InfoS("Storage pool", "pool", p.name, "dir", p.images.Dir, "fsType", p.fsType, "copy", mode, "punchesHoles", p.punchesHoles,
		"guard", p.guard, "kubeletFilesystem", p.kubeletFS, "ratio", p.ratio)
	if !p.punchesHoles && holesErr == nil {
		klog.InfoS("Storage pool cannot punch holes: its thin volumes never give back what they freed", "pool", p.name)
	}
}

// checkGuard says so loudly when the pool's guard keeps the kubelet's
// filesystem below the kubelet's eviction threshold, and when the pool is
// nearly full already (volumes promised before it keep their space; only
// new promises are refused). A guard below the threshold is not refused:
// the kubelet's thresholds can be configured, which csi-node cannot see,
// and a plugin that does not start serves none of the node's volumes.
func (p *Pool) checkGuard(kubeletDir string) error {
	total, free, err := p.images.Capacity()
	if err != nil {
		return fmt.Errorf("pool %s: %w", p.name, err)
	}
	guard := p.guard.Threshold(total)
	if p.kubeletFS && p.guard.BelowKubeletEviction(total) {
		klog.ErrorS(nil, "Storage pool's guard is below the kubelet's eviction threshold: its volumes may fill the kubelet's filesystem until the kubelet evicts the node's pods; raise the guard unless the kubelet's own threshold is lower",
			"pool", p.name, "dir", p.images.Dir, "kubeletDir", kubeletDir, "guard", p.guard, "guardBytes", guard, "sizeBytes", total,
			"kubeletEvictionPercent", capacity.KubeletEvictionPercent, "defaultGuard", capacity.KubeletGuard)
	}
	if capacity.NearlyFull(free, guard) {
		klog.ErrorS(nil, "Storage pool is below its guard: no volume is created or grown in it until space is freed; its volumes keep working",
			"pool", p.name, "dir", p.images.Dir, "freeBytes", free, "guardBytes", guard, "guard", p.guard)
	}
	return nil
}

// FsType and CopyMode are what Probe found of the pool's filesystem: its
// type, and how it copies a snapshot ("" before Probe, unless
// Options.CopyMode said).
func (p *Pool) FsType() string             { return p.fsType }
func (p *Pool) CopyMode() devices.CopyMode { return p.snapshots.Mode }

// PunchesHoles is what Probe found of whether the pool's filesystem gives
// back what thin volumes free (false when the probe could not tell).
func (p *Pool) PunchesHoles() bool { return p.punchesHoles }

// Dir is the pool's data directory.
func (p *Pool) Dir() string { return p.images.Dir }

// Guard is the pool's guard: the free space no promise takes, below which
// it is nearly full (capacity.NearlyFull).
func (p *Pool) Guard() capacity.Guard { return p.guard }

// Image is the image of volume id in the pool, whether or not it exists.
func (p *Pool) Image(id string) string { return p.images.Path(id) }

// IDOf returns the volume whose image path is, when it is one of the
// pool's.
func (p *Pool) IDOf(path string) (string, bool) { return p.images.IDOf(path) }

// ImageSize returns the size of volume id's image; an error matching
// os.ErrNotExist when it has none here.
func (p *Pool) ImageSize(id string) (int64, error) { return p.images.Size(id) }

// ImageChanged returns when volume id's image last changed, and its size;
// an error matching os.ErrNotExist when it has none here.
func (p *Pool) ImageChanged(id string) (time.Time, int64, error) { return p.images.Changed(id) }

// RestoreOf returns the restore under way into volume id's image; nil when
// none is.
func (p *Pool) RestoreOf(id string) *Restore { return p.restores.get(id) }

// ImageAllocated is what id's image allocates, in bytes; an error matching
// os.ErrNotExist when it has none here.
func (p *Pool) ImageAllocated(id string) (int64, error) {
	u, err := p.images.Usage(id)
	return u.Allocated, err
}

// Reserve allocates the holes of volume id's image.
func (p *Pool) Reserve(id string) error { return p.images.Reserve(id) }

// Blank reports whether volume id's image holds no data at all.
func (p *Pool) Blank(id string) (bool, error) { return p.images.Blank(id) }

// Flush writes out what is dirty of an image.
func (p *Pool) Flush(image string) error { return p.images.Flush(image) }

// Taken reports whether snapshot id exists in the pool.
func (p *Pool) Taken(id string) (bool, error) { return p.snapshots.Taken(id) }

// Take copies image, of the volume of, to snapshot id of the pool; an
// error matching os.ErrExist when id exists. The snapshot is whole or
// absent.
func (p *Pool) Take(ctx context.Context, id, image string, of devices.SnapshotOf, now time.Time) (devices.SnapshotInfo, error) {
	return p.snapshots.Take(ctx, id, image, of, now)
}

// Snapshot returns snapshot id of the pool; an error matching
// os.ErrNotExist when the pool has none of that ID.
func (p *Pool) Snapshot(id string) (devices.SnapshotInfo, error) { return p.snapshots.Get(id) }

// Snapshots lists the pool's snapshots, sorted by ID.
func (p *Pool) Snapshots() ([]devices.SnapshotInfo, error) { return p.snapshots.List() }

// DeleteSnapshot removes snapshot id of the pool; one that is not there
// is no error. It does not ask whether a restore copies from it: the
// controller does, under its snapshot lock (Pools.RestoresFrom).
func (p *Pool) DeleteSnapshot(id string) error { return p.snapshots.Delete(id) }

// TempSnapshotID is the ID of a snapshot of the pool that only a clone
// named name needs: never listed, and removed by Repair.
func (p *Pool) TempSnapshotID(name string) string { return p.snapshots.TempID(name) }

// IsTempSnapshot reports whether snapshot id is one only a clone needed.
func (p *Pool) IsTempSnapshot(id string) bool { return p.snapshots.IsTemp(id) }

// Status reports the pool's space as GetCapacity sees it, what its
// filesystem can do, its snapshots and the restores under way in it;
// node is this node's name.
func (p *Pool) Status(node string) (volstatus.PoolStatus, error) {
	acc, total, err := p.Account()
	if err != nil {
		return volstatus.PoolStatus{}, err
	}
	st := volstatus.PoolStatus{
		Name: p.name, Dir: p.images.Dir, Node: node,
		SizeBytes: total, FreeBytes: acc.Free,
		ThickPromisedBytes: acc.ThickPromised, ThickOwedBytes: acc.ThickOwed,
		ThinPromisedBytes: acc.ThinPromised, ThinAllocatedBytes: acc.ThinAllocated,
		ThickAvailableBytes: acc.ThickAvailable(), ThinAvailableBytes: acc.ThinAvailable(),
		CopyingBytes:          acc.Copying,
		OverprovisioningRatio: p.ratio, GuardBytes: acc.Guard, NearlyFull: acc.NearlyFull(),
		KubeletFilesystem:         p.kubeletFS,
		GuardBelowKubeletEviction: p.kubeletFS && p.guard.BelowKubeletEviction(total),
		FsType:                    p.fsType, PunchesHoles: p.punchesHoles,
	}
	for _, r := range p.Restoring() {
		st.Restores = append(st.Restores, volstatus.Restore{VolumeID: r.VolumeID, SnapshotID: r.SnapshotID, SizeBytes: r.Bytes,
			CopiedBytes: r.Copied, SourceBytes: r.SourceBytes})
	}
	snaps, err := p.snapshots.List()
	if err != nil {
		return volstatus.PoolStatus{}, fmt.Errorf("listing snapshots: %w", err)
	}
	st.Snapshots, st.CopyMode = len(snaps), string(p.snapshots.Mode)
	for _, sn := range snaps {
		st.SnapshotBytes += sn.Allocated
	}
	return st, nil
}

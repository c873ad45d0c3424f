package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/locks"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// PoolOptions configure a storage pool.
type PoolOptions struct {
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
	// keep (OpenPools finds out).
	KubeletFilesystem bool
}

// Pool is one storage pool of this node: a data directory on a filesystem
// of its own, which holds its volumes' images and their snapshots, with
// its guard, its overprovisioning ratio and what its filesystem can do
// (Probe), and its capacity promise: what its images, the snapshots asked
// for and the restores under way were promised, and what can still be.
// Every change of an image's space (made, grown, restored, removed) and
// every snapshot asked for is decided within one lock (within), so no two
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

	// mu is held for each promise and the change it allows (within).
	// Lock order: the snapshot service's mu, then mu, then restores.mu.
	mu locks.Mutex
	// restoreImage copies a snapshot into a volume's image (copySnapshot;
	// tests hold it up).
	restoreImage func(ctx context.Context, id string, from *Pool, snap devices.SnapshotInfo, size int64, thick bool) error
}

// NewPool returns storage pool opts.Name, whose volumes' records are in
// store. It opens nothing: Repair and Probe look at its directory.
func NewPool(store Store, opts PoolOptions) *Pool {
	if opts.Name == "" {
		opts.Name = state.DefaultPool
	}
	s := &Pool{
		images: &devices.Images{Dir: opts.Dir}, snapshots: &devices.Snapshots{Dir: filepath.Join(opts.Dir, "snapshots")},
		store: store, name: opts.Name, ratio: opts.Ratio, kubeletFS: opts.KubeletFilesystem,
		guard: capacity.DefaultGuardFor(opts.KubeletFilesystem),
	}
	if opts.Guard != nil {
		s.guard = *opts.Guard
	}
	s.copies, s.cancel = context.WithCancel(context.Background())
	s.restoreImage = s.copySnapshot
	return s
}

// Name is the pool's name.
func (s *Pool) Name() string { return s.name }

// Close ends the restores' copies, which leave no image (the retried
// CreateVolume makes it anew), and waits for them.
func (s *Pool) Close() {
	s.cancel()
	s.restores.stop()
}

// What a pool is besides its promise (space.go): its directory, repaired
// and probed at start-up, the calls of the node's reconciler about a
// volume's image and snapshots, and its status.

// Repair removes what interrupted image creations and snapshot copies left
// in the pool.
func (s *Pool) Repair() error {
	if err := s.images.RemoveStaleTemps(); err != nil {
		return fmt.Errorf("pool %s: removing interrupted image creations: %w", s.name, err)
	}
	if err := devices.RemoveStaleTemps(s.snapshots.Dir); err != nil {
		return fmt.Errorf("pool %s: removing interrupted snapshots: %w", s.name, err)
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
func (s *Pool) Probe() {
	var holesErr error
	if s.fsType, s.punchesHoles, holesErr = devices.ProbeFilesystem(s.images.Dir); holesErr != nil {
		klog.ErrorS(holesErr, "Cannot tell whether the storage pool punches holes; reported as not until csi-node starts again", "pool", s.name)
	}
	mode, err := devices.ProbeCopyMode(s.images.Dir)
	// Where images share blocks with their snapshots, a thick image
	// owes what it shares: its writes there take new blocks.
	s.images.Shares = mode == devices.CopyReflink
	if err != nil {
		// Copies then never share blocks: correct anywhere, only slower
		// where reflinks would have worked. On a filesystem that may
		// reflink (what snapshots made before share), images' shared
		// blocks are still looked for, so that a thick image is never
		// owed too little; FIEMAP finds none where nothing was shared.
		s.images.Shares = s.fsType == "xfs" || s.fsType == "btrfs"
		klog.ErrorS(err, "Cannot tell whether the storage pool shares blocks; snapshots are copied without reflinks until csi-node starts again", "pool", s.name, "countsShared", s.images.Shares)
		mode = devices.CopySparse
	}
	s.snapshots.Mode = mode
	klog.InfoS("Storage pool", "pool", s.name, "dir", s.images.Dir, "fsType", s.fsType, "copy", mode, "punchesHoles", s.punchesHoles,
		"guard", s.guard, "kubeletFilesystem", s.kubeletFS, "ratio", s.ratio)
	if !s.punchesHoles && holesErr == nil {
		klog.InfoS("Storage pool cannot punch holes: its thin volumes never give back what they freed", "pool", s.name)
	}
}

// checkGuard says so loudly when the pool's guard keeps the kubelet's
// filesystem below the kubelet's eviction threshold, and when the pool is
// nearly full already (volumes promised before it keep their space; only
// new promises are refused). A guard below the threshold is not refused:
// the kubelet's thresholds can be configured, which csi-node cannot see,
// and a plugin that does not start serves none of the node's volumes.
func (s *Pool) checkGuard(kubeletDir string) error {
	total, free, err := s.images.Capacity()
	if err != nil {
		return fmt.Errorf("pool %s: %w", s.name, err)
	}
	guard := s.guard.Threshold(total)
	if s.kubeletFS && s.guard.BelowKubeletEviction(total) {
		klog.ErrorS(nil, "Storage pool's guard is below the kubelet's eviction threshold: its volumes may fill the kubelet's filesystem until the kubelet evicts the node's pods; raise the guard unless the kubelet's own threshold is lower",
			"pool", s.name, "dir", s.images.Dir, "kubeletDir", kubeletDir, "guard", s.guard, "guardBytes", guard, "sizeBytes", total,
			"kubeletEvictionPercent", capacity.KubeletEvictionPercent, "defaultGuard", capacity.KubeletGuard)
	}
	if capacity.NearlyFull(free, guard) {
		klog.ErrorS(nil, "Storage pool is below its guard: no volume is created or grown in it until space is freed; its volumes keep working",
			"pool", s.name, "dir", s.images.Dir, "freeBytes", free, "guardBytes", guard, "guard", s.guard)
	}
	return nil
}

// FsType and CopyMode are what Probe found of the pool's filesystem: its
// type, and how it copies a snapshot ("" before Probe).
func (s *Pool) FsType() string             { return s.fsType }
func (s *Pool) CopyMode() devices.CopyMode { return s.snapshots.Mode }

// PunchesHoles is what Probe found of whether the pool's filesystem gives
// back what thin volumes free (false when the probe could not tell).
func (s *Pool) PunchesHoles() bool { return s.punchesHoles }

// Dir is the pool's data directory.
func (s *Pool) Dir() string { return s.images.Dir }

// Guard is the pool's guard: the free space no promise takes, below which
// it is nearly full (capacity.NearlyFull).
func (s *Pool) Guard() capacity.Guard { return s.guard }

// Image is the image of volume id in the pool.
func (s *Pool) Image(id string) string { return s.images.Path(id) }

// IDOf returns the volume whose image path is, when it is one of the
// pool's.
func (s *Pool) IDOf(path string) (string, bool) { return s.images.IDOf(path) }

// ImageSize returns the size of volume id's image; an error matching
// os.ErrNotExist when it has none here.
func (s *Pool) ImageSize(id string) (int64, error) { return s.images.Size(id) }

// Reserve allocates the holes of volume id's image.
func (s *Pool) Reserve(id string) error { return s.images.Reserve(id) }

// Blank reports whether volume id's image holds no data at all.
func (s *Pool) Blank(id string) (bool, error) { return s.images.Blank(id) }

// Flush writes out what is dirty of an image.
func (s *Pool) Flush(image string) error { return s.images.Flush(image) }

// Taken reports whether snapshot id exists in the pool.
func (s *Pool) Taken(id string) (bool, error) { return s.snapshots.Taken(id) }

// Take copies image, of the volume of, to snapshot id of the pool.
func (s *Pool) Take(ctx context.Context, id, image string, of devices.SnapshotOf, now time.Time) (devices.SnapshotInfo, error) {
	return s.snapshots.Take(ctx, id, image, of, now)
}

// restore returns the restore under way into volume id's image; nil when
// none is.
func (s *Pool) restore(id string) *restore { return s.restores.get(id) }

// imageChanged returns when volume id's image last changed, and its size;
// an error matching os.ErrNotExist when there is none.
func (s *Pool) imageChanged(id string) (time.Time, int64, error) { return s.images.Changed(id) }

// snapshot returns snapshot id of the pool; an error matching
// os.ErrNotExist when the pool has none of that ID.
func (s *Pool) snapshot(id string) (devices.SnapshotInfo, error) { return s.snapshots.Get(id) }

// tempSnapshotID is the ID of a snapshot of the pool that only a clone
// named name needs: never listed, and removed by Repair.
func (s *Pool) tempSnapshotID(name string) string { return s.snapshots.TempID(name) }

// DeleteSnapshot removes snapshot id; one that is not there is no error.
func (s *Pool) DeleteSnapshot(id string) error { return s.snapshots.Delete(id) }

// ImageAllocated is what id's image allocates, in bytes.
func (s *Pool) ImageAllocated(id string) (int64, error) {
	u, err := s.images.Usage(id)
	return u.Allocated, err
}

// deleteSnapshot deletes snapshot id of the pool; a no-op when it has none.
func (s *Pool) deleteSnapshot(id string) error { return s.snapshots.Delete(id) }

// listSnapshots lists the pool's snapshots.
func (s *Pool) listSnapshots() ([]devices.SnapshotInfo, error) { return s.snapshots.List() }

// IsTempSnapshot reports whether snapshot id is one only a clone needed.
func (s *Pool) IsTempSnapshot(id string) bool { return s.snapshots.IsTemp(id) }

// Status reports the pool's space as GetCapacity sees it, what its
// filesystem can do, its snapshots and the restores under way in it;
// node is this node's name.
func (s *Pool) Status(node string) (volstatus.PoolStatus, error) {
	acc, total, err := s.Account()
	if err != nil {
		return volstatus.PoolStatus{}, err
	}
	p := volstatus.PoolStatus{
		Name: s.name, Dir: s.images.Dir, Node: node,
		SizeBytes: total, FreeBytes: acc.Free,
		ThickPromisedBytes: acc.ThickPromised, ThickOwedBytes: acc.ThickOwed,
		ThinPromisedBytes: acc.ThinPromised, ThinAllocatedBytes: acc.ThinAllocated,
		ThickAvailableBytes: acc.ThickAvailable(), ThinAvailableBytes: acc.ThinAvailable(),
		CopyingBytes:          acc.Copying,
		OverprovisioningRatio: s.ratio, GuardBytes: acc.Guard, NearlyFull: acc.NearlyFull(),
		KubeletFilesystem:         s.kubeletFS,
		GuardBelowKubeletEviction: s.kubeletFS && s.guard.BelowKubeletEviction(total),
		FsType:                    s.fsType, PunchesHoles: s.punchesHoles,
	}
	for _, r := range s.Restoring() {
		p.Restores = append(p.Restores, volstatus.Restore{VolumeID: r.VolumeID, SnapshotID: r.SnapshotID, SizeBytes: r.Bytes,
			CopiedBytes: r.Copied, SourceBytes: r.SourceBytes})
	}
	snaps, err := s.snapshots.List()
	if err != nil {
		return volstatus.PoolStatus{}, fmt.Errorf("listing snapshots: %w", err)
	}
	p.Snapshots, p.CopyMode = len(snaps), string(s.snapshots.Mode)
	for _, sn := range snaps {
		p.SnapshotBytes += sn.Allocated
	}
	return p, nil
}

// OpenPools returns the pools of opts (the default pool first) that this
// node has, whose records are in store: the default pool's directory is
// made when missing; another pool's directory is the operator's (a
// filesystem mounted there), and a node where it does not exist has no
// such pool: one DaemonSet serves nodes with and without it. A pool on the
// filesystem of a pool before it is not served (both would promise the
// same space): most often its own disk is not mounted, and refusing the
// start would stop every other pool's volumes on the node; it is reported
// with that error (Statuses) instead. A pool
// on the filesystem of the kubelet's directory kubeletDir guards it from
// the kubelet's evictions (capacity.DefaultGuardFor, checkGuard). What a
// crash left in the pools is removed, and their filesystems probed, by
// Repair and Probe.
func OpenPools(store Store, opts []PoolOptions, kubeletDir string) (*Pools, error) {
	kubeletDev, err := devices.FilesystemHolding(kubeletDir)
	if err != nil {
		return nil, fmt.Errorf("finding the filesystem of the kubelet's directory: %w", err)
	}
	byDev := map[uint64]string{}
	var out []*Pool
	var unserved []volstatus.PoolStatus
	for _, o := range opts {
		if o.Name == state.DefaultPool {
			if err := os.MkdirAll(o.Dir, 0o700); err != nil {
				return nil, fmt.Errorf("creating pool %s's directory %s: %w", o.Name, o.Dir, err)
			}
		} else if _, err := os.Stat(o.Dir); errors.Is(err, os.ErrNotExist) {
			klog.InfoS("Storage pool is not on this node: its directory does not exist", "pool", o.Name, "dir", o.Dir)
			continue
		}
		dev, err := devices.FilesystemOf(o.Dir)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", o.Name, err)
		}
		if other, ok := byDev[dev]; ok {
			err := fmt.Errorf("pools %s and %s are on one filesystem: each pool needs a filesystem of its own, or both would promise the same space; is pool %s's disk mounted at %s?", other, o.Name, o.Name, o.Dir)
			klog.ErrorS(err, "Storage pool not served", "pool", o.Name, "dir", o.Dir)
			unserved = append(unserved, volstatus.PoolStatus{Name: o.Name, Dir: o.Dir, Error: err.Error()})
			// Neither of two pools other than the default one can tell
			// which of them is on its own disk: both are left out. The
			// default pool's directory is csi-node's, on the filesystem
			// it was given.
			if i := slices.IndexFunc(out, func(p *Pool) bool { return p.name == other }); i >= 0 && other != state.DefaultPool {
				oerr := fmt.Errorf("pools %s and %s are on one filesystem: each pool needs a filesystem of its own, or both would promise the same space; is pool %s's disk mounted at %s?", other, o.Name, other, out[i].images.Dir)
				klog.ErrorS(oerr, "Storage pool not served", "pool", other, "dir", out[i].images.Dir)
				unserved = append(unserved, volstatus.PoolStatus{Name: other, Dir: out[i].images.Dir, Error: oerr.Error()})
				out = slices.Delete(out, i, i+1)
			}
			continue
		}
		byDev[dev] = o.Name
		o.KubeletFilesystem = dev == kubeletDev
		p := NewPool(store, o)
		if err := p.checkGuard(kubeletDir); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	ps := NewPools(store, out...)
	ps.unserved = unserved
	return ps, nil
}

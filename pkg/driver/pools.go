package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/controller"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// PoolSpec is a storage pool as --pool declares it:
// NAME=DIR[,guard=G][,ratio=R].
type PoolSpec struct {
	// Name is the pool's name (state.ValidPoolName).
	Name string
	// Dir is its data directory, on a filesystem of its own.
	Dir string
	// Guard and Ratio override --pool-guard and
	// --thin-overprovisioning-ratio for this pool; empty and 0 take them.
	Guard string
	Ratio float64
}

// ParsePoolSpec parses the value of a --pool flag.
func ParsePoolSpec(s string) (PoolSpec, error) {
	first, opts, _ := strings.Cut(s, ",")
	name, dir, ok := strings.Cut(first, "=")
	if !ok {
		return PoolSpec{}, fmt.Errorf("--pool %q: want NAME=DIR[,guard=G][,ratio=R]", s)
	}
	p := PoolSpec{Name: name, Dir: dir}
	if err := state.ValidPoolName(name); err != nil {
		return PoolSpec{}, fmt.Errorf("--pool %q: %w", s, err)
	}
	for opts != "" {
		var opt string
		opt, opts, _ = strings.Cut(opts, ",")
		k, v, _ := strings.Cut(opt, "=")
		switch k {
		case "guard":
			if _, err := capacity.ParseGuard(v); err != nil {
				return PoolSpec{}, fmt.Errorf("--pool %q: guard %w", s, err)
			}
			p.Guard = v
		case "ratio":
			r, err := strconv.ParseFloat(v, 64)
			if err == nil {
				err = capacity.CheckRatio(r)
			}
			if err != nil {
				return PoolSpec{}, fmt.Errorf("--pool %q: ratio %q: %v", s, v, err)
			}
			p.Ratio = r
		default:
			return PoolSpec{}, fmt.Errorf("--pool %q: unknown option %q; want guard= or ratio=", s, opt)
		}
	}
	return p, nil
}

// pool is a storage pool as configured: its spec with the defaults filled.
type pool struct {
	name, dir string
	// guard is the pool's guard, and guardSet whether it was configured
	// (its guard=, or --pool-guard). One not configured is the default
	// for the pool's filesystem, which findPools finds out
	// (capacity.DefaultGuardFor).
	guard    capacity.Guard
	guardSet bool
	// kubeletFS is true when the pool's filesystem holds the kubelet's
	// directory, whose free space the kubelet evicts pods to keep.
	kubeletFS bool
	ratio     float64
}

// resolvePools returns the configured pools, the default pool (DataDir)
// first: a pool named like another, or a directory twice, is refused.
func (c Config) resolvePools() ([]pool, error) {
	out := []pool{c.poolOf(state.DefaultPool, c.DataDir, "")}
	names, dirs := map[string]bool{state.DefaultPool: true}, map[string]string{c.DataDir: state.DefaultPool}
	for _, s := range c.Pools {
		if names[s.Name] {
			if s.Name == state.DefaultPool {
				return nil, fmt.Errorf("--pool %s: the default pool is --data-dir's", s.Name)
			}
			return nil, fmt.Errorf("--pool %s is declared twice", s.Name)
		}
		if !filepath.IsAbs(s.Dir) || filepath.Clean(s.Dir) != s.Dir || s.Dir == "/" {
			return nil, fmt.Errorf("--pool %s: directory %q must be an absolute, clean path other than /", s.Name, s.Dir)
		}
		if other, ok := dirs[s.Dir]; ok {
			return nil, fmt.Errorf("--pool %s: directory %s is pool %s's too", s.Name, s.Dir, other)
		}
		names[s.Name], dirs[s.Dir] = true, s.Name
		p := c.poolOf(s.Name, s.Dir, s.Guard)
		if s.Ratio != 0 {
			p.ratio = s.Ratio
		}
		out = append(out, p)
	}
	return out, nil
}

// poolOf is pool name at dir with the configuration's ratio and guard, or
// the guard given (checked by ParsePoolSpec) when it is not empty.
func (c Config) poolOf(name, dir, guard string) pool {
	p := pool{name: name, dir: dir, ratio: c.OverprovisioningRatio}
	switch {
	case guard != "":
		p.guard, p.guardSet = capacity.MustParseGuard(guard), true
	case c.guard != nil:
		p.guard, p.guardSet = *c.guard, true
	}
	return p
}

// findPools creates the default pool's directory when missing, refuses
// two pools on one filesystem (both would promise the same space), and
// returns the pools this node has, with their specs: another pool's
// directory is the operator's (a filesystem mounted there), and a node
// where it does not exist has no such pool: one DaemonSet serves nodes with
// and without it. A pool on the filesystem of the kubelet's directory
// kubeletDir guards it from the kubelet's evictions (guardFor). What a
// crash left in the pools is removed, and their filesystems probed, by
// recover (repairPool, probePool).
func findPools(specs []pool, kubeletDir string) ([]pool, []*devices.Pool, error) {
	kubeletDev, err := devices.FilesystemHolding(kubeletDir)
	if err != nil {
		return nil, nil, fmt.Errorf("finding the filesystem of the kubelet's directory: %w", err)
	}
	byDev := map[uint64]string{}
	var here []pool
	var out []*devices.Pool
	for _, p := range specs {
		if p.name == state.DefaultPool {
			if err := os.MkdirAll(p.dir, 0o700); err != nil {
				return nil, nil, fmt.Errorf("creating pool %s's directory %s: %w", p.name, p.dir, err)
			}
		} else if _, err := os.Stat(p.dir); errors.Is(err, os.ErrNotExist) {
			klog.InfoS("Storage pool is not on this node: its directory does not exist", "pool", p.name, "dir", p.dir)
			continue
		}
		dev, err := devices.FilesystemOf(p.dir)
		if err != nil {
			return nil, nil, fmt.Errorf("pool %s: %w", p.name, err)
		}
		if other, ok := byDev[dev]; ok {
			return nil, nil, fmt.Errorf("pools %s and %s are on one filesystem: each pool needs a filesystem of its own, or both would promise the same space", other, p.name)
		}
		byDev[dev] = p.name
		images := &devices.Images{Dir: p.dir}
		if p, err = guardFor(p, dev == kubeletDev, images, kubeletDir); err != nil {
			return nil, nil, err
		}
		here = append(here, p)
		// The snapshot directory is made at the first snapshot.
		out = append(out, &devices.Pool{Name: p.name, Images: images, Snapshots: &devices.Snapshots{Dir: filepath.Join(p.dir, "snapshots")}})
	}
	return here, out, nil
}

// repairPool removes what interrupted image creations and snapshot copies
// left in pool p.
func repairPool(p *devices.Pool) error {
	if err := p.Images.RemoveStaleTemps(); err != nil {
		return fmt.Errorf("pool %s: removing interrupted image creations: %w", p.Name, err)
	}
	if err := devices.RemoveStaleTemps(p.Snapshots.Dir); err != nil {
		return fmt.Errorf("pool %s: removing interrupted snapshots: %w", p.Name, err)
	}
	return nil
}

// probePool finds out how pool p's filesystem copies (reflinks where it
// shares blocks; the copies are made in the data directory, on the same
// filesystem as the snapshots) and whether it punches holes, and reports
// the pool as spec configures it.
func probePool(spec pool, p *devices.Pool) error {
	mode, err := devices.ProbeCopyMode(spec.dir)
	if err != nil {
		// Never a reason not to start (the volumes' mounts are restored
		// by the start): copies then never share blocks, which is correct
		// anywhere, only slower where reflinks would have worked.
		klog.ErrorS(err, "Cannot tell whether the data directory shares blocks; snapshots are copied without")
		mode = devices.CopySparse
	}
	p.Snapshots.Mode = mode
	// Where images share blocks with their snapshots, a thick image
	// owes what it shares: its writes there take new blocks.
	p.Images.Shares = mode == devices.CopyReflink
	if p.FsType, p.PunchesHoles, err = devices.ProbeFilesystem(spec.dir); err != nil {
		return fmt.Errorf("pool %s: %w", p.Name, err)
	}
	klog.InfoS("Storage pool", "pool", p.Name, "dir", spec.dir, "fsType", p.FsType, "copy", mode, "punchesHoles", p.PunchesHoles,
		"guard", spec.guard, "kubeletFilesystem", spec.kubeletFS, "ratio", spec.ratio)
	if !p.PunchesHoles {
		klog.InfoS("Storage pool cannot punch holes: its thin volumes never give back what they freed", "pool", p.Name)
	}
	return nil
}

// guardFor returns pool p, on the kubelet's filesystem or not, with its
// guard: the one configured, else the default for its filesystem. It
// says so loudly when the guard keeps the kubelet's filesystem below the
// kubelet's eviction threshold, and when the pool is past its guard
// already (volumes promised before it keep their space; only new promises
// are refused). A guard below the threshold is not refused: the kubelet's
// thresholds can be configured, which csi-node cannot see, and a plugin
// that does not start serves none of the node's volumes.
func guardFor(p pool, kubeletFS bool, images *devices.Images, kubeletDir string) (pool, error) {
	p.kubeletFS = kubeletFS
	if !p.guardSet {
		p.guard = capacity.DefaultGuardFor(kubeletFS)
	}
	total, free, err := images.Capacity()
	if err != nil {
		return p, fmt.Errorf("pool %s: %w", p.name, err)
	}
	guard := p.guard.Threshold(total)
	if kubeletFS && p.guard.BelowKubeletEviction(total) {
		klog.ErrorS(nil, "Storage pool's guard is below the kubelet's eviction threshold: its volumes may fill the kubelet's filesystem until the kubelet evicts the node's pods; raise the guard unless the kubelet's own threshold is lower",
			"pool", p.name, "dir", p.dir, "kubeletDir", kubeletDir, "guard", p.guard, "guardBytes", guard, "sizeBytes", total,
			"kubeletEvictionPercent", capacity.KubeletEvictionPercent, "defaultGuard", capacity.KubeletGuard)
	}
	if free < guard {
		klog.ErrorS(nil, "Storage pool is below its guard: no volume is created or grown in it until space is freed; its volumes keep working",
			"pool", p.name, "dir", p.dir, "freeBytes", free, "guardBytes", guard, "guard", p.guard)
	}
	return p, nil
}

// spaces returns the capacity promise of each pool.
func spaces(specs []pool, pools []*devices.Pool, store *state.Store) []*controller.Space {
	out := make([]*controller.Space, len(pools))
	for i, p := range pools {
		out[i] = controller.NewSpace(p.Images, store, controller.SpaceOptions{Name: p.Name, Ratio: specs[i].ratio,
			Guard: specs[i].guard, Snapshots: p.Snapshots})
	}
	return out
}

// poolStatuses reports every pool's space as GetCapacity sees it, and the
// restores under way in it, in the order of specs.
func poolStatuses(node string, specs []pool, promises *controller.Pools, pools *devices.Pools) ([]volstatus.Pool, error) {
	out := make([]volstatus.Pool, 0, len(specs))
	for _, spec := range specs {
		dp := pools.Get(spec.name)
		p, err := poolStatus(node, spec, promises.Get(spec.name), dp.Snapshots)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", spec.name, err)
		}
		p.FsType, p.PunchesHoles = dp.FsType, dp.PunchesHoles
		out = append(out, p)
	}
	return out, nil
}

// poolStatus reports one pool's space as GetCapacity sees it, and the
// restores under way in it.
func poolStatus(node string, spec pool, space *controller.Space, snapshots *devices.Snapshots) (volstatus.Pool, error) {
	acc, total, err := space.Account()
	if err != nil {
		return volstatus.Pool{}, err
	}
	p := volstatus.Pool{
		Name: spec.name, Dir: spec.dir, Node: node,
		SizeBytes: total, FreeBytes: acc.Free,
		ThickPromisedBytes: acc.ThickPromised, ThickOwedBytes: acc.ThickOwed,
		ThinPromisedBytes: acc.ThinPromised, ThinAllocatedBytes: acc.ThinAllocated,
		ThickAvailableBytes: acc.ThickAvailable(), ThinAvailableBytes: acc.ThinAvailable(),
		CopyingBytes:          acc.Copying,
		OverprovisioningRatio: spec.ratio, GuardBytes: acc.Guard, NearlyFull: acc.NearlyFull(),
		KubeletFilesystem:         spec.kubeletFS,
		GuardBelowKubeletEviction: spec.kubeletFS && spec.guard.BelowKubeletEviction(total),
	}
	for _, r := range space.Restoring() {
		p.Restores = append(p.Restores, volstatus.Restore{VolumeID: r.VolumeID, SnapshotID: r.SnapshotID, SizeBytes: r.Bytes,
			CopiedBytes: r.Copied, SourceBytes: r.SourceBytes})
	}
	snaps, err := snapshots.List()
	if err != nil {
		return volstatus.Pool{}, fmt.Errorf("listing snapshots: %w", err)
	}
	p.Snapshots, p.CopyMode = len(snaps), string(snapshots.Mode)
	for _, s := range snaps {
		p.SnapshotBytes += s.Allocated
	}
	return p, nil
}

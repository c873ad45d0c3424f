package reconciler

import (
	"context"
	"time"

	"k8s.io/utils/clock"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// What the reconciler is given: the interfaces of the store and of the
// device layer it works through, and its configuration.

// Store is the subset of the desired-state store the reconciler needs.
type Store interface {
	List() []*state.Volume
	Get(id string) (*state.Volume, error)
	Update(id string, fn func(v *state.Volume) error) (*state.Volume, error)
	UpdateUnsynced(id string, fn func(v *state.Volume) error) (*state.Volume, func() error, error)
	SetResult(id string, key state.IntentKey, r state.Result)
	Fulfilled(id string, key state.IntentKey, gen int64, path string)
	SetTerminalFailure(id string, key state.IntentKey, f state.TerminalFailure)
	SetCondition(id string, c state.Condition)
}

// Observer reads the actual state of the machine.
type Observer interface {
	Observe() (*host.Observation, error)
	// ObserveVolume is the observation of one volume whose devices are
	// known: the loop devices named in loops (as "/dev/loopN") that are
	// attached, the mounts of the filesystems on them and on devs, and the
	// top mount at each of paths, as a lookup of the path reaches it. It
	// answers every question observeVolume asks of that volume as Observe
	// would, but for a mount at one of paths that a lookup does not reach
	// (devices.Observer.ObserveVolume says when).
	ObserveVolume(loops []string, devs []host.DevNum, paths []string) (*host.Observation, error)
	// CheckMount returns the unique ID of the top mount at path (0 when
	// unknown) and the error of a corrupted mount there (ENOTCONN, ESTALE,
	// EIO...), nil otherwise.
	CheckMount(path string) (uint64, error)
}

// Loops attaches and detaches loop devices.
type Loops interface {
	// Attach attaches an image to a new device that passes discards on
	// to it or refuses them.
	Attach(image string, discards bool) (string, error)
	// Detach detaches a device and reports whether it is gone when Detach
	// returns; a device another user holds open goes at its last close.
	Detach(dev string) (gone bool, err error)
	// Keep clears the auto-clear flag of an attached device.
	Keep(dev string) error
	// Grow makes a device take its backing file's size.
	Grow(dev string) error
	// SetDiscards makes a device pass discards on to its backing file
	// (which punches holes in it) or refuse them.
	SetDiscards(dev string, on bool) error
}

// Filesystems probes, formats and mounts. The commands of the calls that
// take a ctx (blkid, fsck, mkfs, resize) are killed when it ends.
type Filesystems interface {
	// DiskFormat probes dev once; FormatAndMount decides from that probe.
	DiskFormat(ctx context.Context, dev string) (devices.Probe, error)
	// FormatAndMount returns the new mount's unique ID.
	FormatAndMount(ctx context.Context, probe devices.Probe, target, fsType string, options, mkfsOptions []string) (uint64, error)
	// BindMount and BindDevice return the new mount's unique ID.
	BindMount(source, target string, options []string) (uint64, error)
	Unmount(target string) error
	// UnmountOwned unmounts the top mount at target only if its unique
	// mount ID is id.
	UnmountOwned(target string, id uint64) error
	// Resize grows the filesystem on dev, mounted at mountPath, online.
	Resize(ctx context.Context, dev, mountPath string) error
	// GrowUnmounted checks and grows the unmounted filesystem on dev.
	GrowUnmounted(ctx context.Context, dev, fsType string) error
	// BindDevice bind mounts the device node dev on the file target,
	// creating the file.
	BindDevice(dev, target string, ro bool) (uint64, error)
}

// Paths checks, creates, seals and removes paths without following
// symlinks.
type Paths interface {
	CheckDir(path string) error
	Mkdir(path string) error
	Remove(path string) error
	// Seal makes the target at path immutable beneath what is mounted on
	// it, until Remove removes it: see unmountTarget.
	Seal(path string) error
	// Freeze freezes the filesystem mounted at path (devices.ErrFrozen
	// when it is frozen already); Thaw thaws it, a no-op when it is not.
	Freeze(path string) error
	Thaw(path string) error
	// Sync writes out what is dirty in the filesystem mounted at path.
	Sync(path string) error
}

// Pool is one storage pool of the node as the reconciler needs it: a data
// directory on a filesystem of its own, holding the images of its volumes
// and their snapshots. The reconciler resolves a volume's pool once per
// pass, from its record (state.PoolOf), and every call about the volume's
// image or snapshots goes to that pool.
type Pool interface {
	// Image is the image (backing file) of volume id in this pool.
	Image(id string) string
	// IDOf returns the volume whose image path is, when it is one of this
	// pool's.
	IDOf(path string) (string, bool)
	// ImageSize returns the size of id's image; an error matching
	// os.ErrNotExist when it has none.
	ImageSize(id string) (int64, error)
	// Reserve allocates the holes of id's image.
	Reserve(id string) error
	// Blank reports whether id's image holds no data at all.
	Blank(id string) (bool, error)
	// GrowImage grows the image of volume id to at least size bytes
	// within the pool's capacity promise (the one CreateVolume keeps too)
	// and returns its size; an image already that large is left as it
	// is. A size the pool cannot hold is a *classified.Error of
	// KindResourceExhausted (not now) or KindOutOfRange (never).
	GrowImage(id string, size int64) (int64, error)
	// Flush writes out what is dirty of an image.
	Flush(image string) error
	// Taken reports whether snapshot id exists in this pool.
	Taken(id string) (bool, error)
	// Take copies image, the image of the volume of, to snapshot id of
	// this pool, stamped with of and now; an error matching os.ErrExist
	// when id exists. A snapshot is a file of its own, whole or absent,
	// never half made.
	Take(ctx context.Context, id, image string, of devices.SnapshotOf, now time.Time) (devices.SnapshotInfo, error)
	// DeleteSnapshot removes snapshot id of this pool; one that is not
	// there is no error.
	DeleteSnapshot(id string) error
	// CopyMode is how the pool's filesystem copies an image.
	CopyMode() devices.CopyMode
	// ImageAllocated is what id's image allocates, in bytes; an error
	// matching os.ErrNotExist when it has none.
	ImageAllocated(id string) (int64, error)
	// Guard is the free space of the pool's filesystem below which it is
	// nearly full (capacity.NearlyFull): its thin volumes are reported
	// as at risk.
	Guard() capacity.Guard
}

// Throttler holds the IO that pods do on a device to limits, as the
// kernel's blk-throttle rules in their cgroups (devices.CgroupIO). Only
// the cgroups of the pods that publish a volume ever get its rules:
// csi-node's own mkfs, fsck and resize run in csi-node's cgroup, which is
// no such pod's, and are never throttled.
type Throttler interface {
	// PodCgroups returns the cgroups of the pod that need the rules for
	// its IO to be limited; an error wrapping
	// devices.ErrPodCgroupNotFound when the pod has none on this node.
	PodCgroups(podUID string) ([]string, error)
	// Throttle returns the rules in force in the cgroup dir for dev, 0
	// for each count that has none; an error wrapping
	// devices.ErrCgroupGone only when dir is gone (a dir that is there
	// without the rules' file is another error: its pod is not limited).
	Throttle(dir string, dev host.DevNum) (host.IOLimits, error)
	// SetThrottle makes the rules in force in dir for dev equal l (the
	// zero l removes them), writing only what differs; an error wrapping
	// devices.ErrCgroupGone only when dir is gone.
	SetThrottle(dir string, dev host.DevNum, l host.IOLimits) error
}

// Static resolves the existing block devices of static volumes.
type Static interface {
	// Resolve returns the device at a stable path.
	Resolve(path string) (host.Device, error)
	// Identity returns what identifies the device, "" when nothing does.
	Identity(l host.Device) (string, error)
}

// Defaults of Config.
const (
	DefaultResyncPeriod = 10 * time.Second
	// DefaultFastWorkers: the quick operations include the unstage, whose
	// unmount writes the filesystem's journal out and waits for the disk,
	// so many more workers than cores tear a burst down sooner.
	DefaultFastWorkers = 64
	// DefaultSlowWorkers: a mkfs waits on the disk more than it runs, so
	// more of them than cores keep both busy; past 16, a burst's volumes
	// wait longer each (both: docs/performance.md, "Figures behind the
	// code's choices").
	DefaultSlowWorkers    = 16
	DefaultBackoffInitial = 500 * time.Millisecond
	DefaultBackoffMax     = 2 * time.Minute
)

// Config configures a Reconciler. Zero durations and counts take defaults.
type Config struct {
	Store       Store
	Observer    Observer
	Loops       Loops
	Filesystems Filesystems
	Paths       Paths
	// Pools are the node's storage pools by name; a volume whose record
	// names a pool not here has no image on this node.
	Pools map[string]Pool
	Clock clock.WithTickerAndDelayedExecution
	// Static resolves static volumes' devices; nil when they are off.
	Static Static
	// Recorder receives operations and passes, for metrics; nil for none.
	Recorder Recorder
	// Throttler applies volumes' IO limits in the cgroups of the pods
	// that publish them; nil when this node cannot (no io controller),
	// and NoThrottler then says why, for the volumes that ask for limits.
	Throttler   Throttler
	NoThrottler string
	// KubeletDir is the kubelet's root directory: a publish target below
	// it, laid out as the kubelet does, names the pod it is for
	// (contract.PodOfTarget), whose cgroups get the volume's IO limits.
	KubeletDir string

	// Roots are the directories the plugin may unmount orphaned mounts in;
	// mounts elsewhere are never touched.
	Roots []string

	// ResyncPeriod is the time between passes when nothing kicks the loop.
	ResyncPeriod time.Duration
	// FastWorkers bounds concurrent quick operations (bind mounts, unmounts).
	FastWorkers int
	// SlowWorkers bounds concurrent slow operations (attach, mkfs, fsck).
	SlowWorkers int
	// BackoffInitial is the delay after the first transient failure.
	BackoffInitial time.Duration
	// BackoffMax caps the delay between retries.
	BackoffMax time.Duration

	// spawn runs an operation; nil runs each on a goroutine of its own.
	// The simulation and the benchmark run them inline, one after the
	// other, so that a run is the same every time.
	spawn func(func())
}

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
	Observe() (*host.Snapshot, error)
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

// Paths checks, creates and removes paths without following symlinks.
type Paths interface {
	CheckDir(path string) error
	Mkdir(path string) error
	Remove(path string) error
	// Freeze freezes the filesystem mounted at path (devices.ErrFrozen
	// when it is frozen already); Thaw thaws it, a no-op when it is not.
	Freeze(path string) error
	Thaw(path string) error
	// Sync writes out what is dirty in the filesystem mounted at path.
	Sync(path string) error
}

// Snapshots takes the snapshots of volumes: a snapshot is a file of its
// own, whole or absent, never half made, in its volume's storage pool.
type Snapshots interface {
	// Taken reports whether snapshot id exists in pool.
	Taken(pool, id string) (bool, error)
	// Flush writes out what is dirty of an image.
	Flush(image string) error
	// Take copies image, the image of the volume of, to snapshot id of
	// pool, stamped with of and now; an error matching os.ErrExist when id
	// exists.
	Take(ctx context.Context, pool, id, image string, of devices.SnapshotOf, now time.Time) (devices.SnapshotInfo, error)
}

// Images locates and checks the backing files of volumes, each in the data
// directory of its storage pool (state.PoolOf).
type Images interface {
	// Path is the image of volume id in pool; "" when this node has no
	// such pool.
	Path(pool, id string) string
	// IDOf returns the volume whose image path is, in any pool.
	IDOf(path string) (string, bool)
	Size(pool, id string) (int64, error)
	// Reserve allocates the holes of id's image.
	Reserve(pool, id string) error
	// Blank reports whether id's image holds no data at all.
	Blank(pool, id string) (bool, error)
}

// ImagePromise grows the images of volumes within the node's capacity
// promise (controller.Space), the one that CreateVolume keeps too.
type ImagePromise interface {
	// GrowImage grows the image of volume id in pool to at least size
	// bytes and returns its size; an image already that large is left as
	// it is. A size the pool cannot hold is a *state.Error of
	// KindResourceExhausted (not now) or KindOutOfRange (never).
	GrowImage(pool, id string, size int64) (int64, error)
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
	// unmount writes the filesystem's journal out and waits for the disk.
	// 100 volumes torn down at once on 2 cores took 111-173 ms with 16 and
	// 98-151 ms with 64, faster in 7 of 8 pairs of runs.
	DefaultFastWorkers = 64
	// DefaultSlowWorkers: a mkfs waits on the disk more than it runs, so
	// more of them than cores keep both busy. 100 volumes staged at once
	// on 2 cores took 886-978 ms with 8, 758-778 ms with 16, 664-763 ms
	// with 32 (whose per-volume median was worse than 16's).
	DefaultSlowWorkers    = 16
	DefaultBackoffInitial = 500 * time.Millisecond
	DefaultBackoffMax     = 2 * time.Minute
)

// Config configures a Reconciler. Zero durations and counts take defaults.
type Config struct {
	Store        Store
	Observer     Observer
	Loops        Loops
	Filesystems  Filesystems
	Paths        Paths
	Images       Images
	ImagePromise ImagePromise
	Snapshots    Snapshots
	Clock        clock.WithTickerAndDelayedExecution
	// Static resolves static volumes' devices; nil when they are off.
	Static Static
	// Recorder receives operations and passes, for metrics; nil for none.
	Recorder Recorder

	// PoolGuard is the free space of a pool's data directory below which
	// its thin volumes are reported as at risk; PoolGuards overrides it by
	// pool.
	PoolGuard  capacity.Guard
	PoolGuards map[string]capacity.Guard

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
}

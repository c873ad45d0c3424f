package devices

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// Pool is one storage pool of the node: a data directory on a filesystem
// of its own, holding its volumes' images and their snapshots.
type Pool struct {
	// Name is the pool's name (state.ValidPoolName).
	Name      string
	Images    *Images
	Snapshots *Snapshots
	// FsType and PunchesHoles are what ProbeFilesystem found of its
	// filesystem at start-up.
	FsType       string
	PunchesHoles bool
}

// Pools are the node's storage pools, by name. They locate a volume's
// image and snapshots in the pool its record names, for the reconciler.
type Pools struct {
	byName map[string]*Pool
	names  []string
}

// NewPools returns the pools ps, which must have distinct names.
func NewPools(ps ...*Pool) *Pools {
	out := &Pools{byName: make(map[string]*Pool, len(ps))}
	for _, p := range ps {
		out.byName[p.Name] = p
		out.names = append(out.names, p.Name)
	}
	sort.Strings(out.names)
	return out
}

// Get returns pool name, nil when the node has none of that name.
func (ps *Pools) Get(name string) *Pool { return ps.byName[name] }

// All returns the pools in name order.
func (ps *Pools) All() []*Pool {
	out := make([]*Pool, 0, len(ps.names))
	for _, n := range ps.names {
		out = append(out, ps.byName[n])
	}
	return out
}

// Names returns the pools' names, in order.
func (ps *Pools) Names() []string { return append([]string(nil), ps.names...) }

// errNoPool is the failure of a call about a pool the node does not have
// (a volume made in a pool that was configured then).
func errNoPool(name string) error {
	return fmt.Errorf("this node has no storage pool %q (--pool)", name)
}

// Path is the image of volume id in pool; "" when there is no such pool.
func (ps *Pools) Path(pool, id string) string {
	if p := ps.byName[pool]; p != nil {
		return p.Images.Path(id)
	}
	return ""
}

// IDOf returns the volume whose image path is, in any pool.
func (ps *Pools) IDOf(path string) (string, bool) {
	for _, p := range ps.byName {
		if id, ok := p.Images.IDOf(path); ok {
			return id, true
		}
	}
	return "", false
}

// Size returns the size of volume id's image in pool.
func (ps *Pools) Size(pool, id string) (int64, error) {
	p := ps.byName[pool]
	if p == nil {
		return 0, errNoPool(pool)
	}
	return p.Images.Size(id)
}

// Reserve allocates the holes of volume id's image in pool.
func (ps *Pools) Reserve(pool, id string) error {
	p := ps.byName[pool]
	if p == nil {
		return errNoPool(pool)
	}
	return p.Images.Reserve(id)
}

// Blank reports whether volume id's image in pool holds no data at all.
func (ps *Pools) Blank(pool, id string) (bool, error) {
	p := ps.byName[pool]
	if p == nil {
		return false, errNoPool(pool)
	}
	return p.Images.Blank(id)
}

// Taken reports whether snapshot id exists in pool.
func (ps *Pools) Taken(pool, id string) (bool, error) {
	p := ps.byName[pool]
	if p == nil {
		return false, errNoPool(pool)
	}
	return p.Snapshots.Taken(id)
}

// Flush writes out what is dirty of an image.
func (ps *Pools) Flush(image string) error { return flushFile(image) }

// Take copies image, of the volume of in pool, to snapshot id of that pool.
func (ps *Pools) Take(ctx context.Context, pool, id, image string, of SnapshotOf, now time.Time) (SnapshotInfo, error) {
	p := ps.byName[pool]
	if p == nil {
		return SnapshotInfo{}, errNoPool(pool)
	}
	return p.Snapshots.Take(ctx, id, image, of, now)
}

// FilesystemOf returns the number of the device whose filesystem holds
// dir: two directories of one filesystem have the same.
func FilesystemOf(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, err
	}
	return st.Dev, nil
}

// FilesystemHolding is FilesystemOf for a path that may not exist yet:
// the filesystem of its nearest existing ancestor, on which it would be
// made (a kubelet directory that the kubelet has not made yet).
func FilesystemHolding(path string) (uint64, error) {
	for {
		dev, err := FilesystemOf(path)
		if !errors.Is(err, os.ErrNotExist) || path == filepath.Dir(path) {
			if err != nil {
				return 0, fmt.Errorf("stat %s: %w", path, err)
			}
			return dev, nil
		}
		path = filepath.Dir(path)
	}
}

// Filesystem magic numbers (statfs f_type) of what a pool is likely on.
var fsMagics = map[int64]string{
	unix.EXT4_SUPER_MAGIC:      "ext4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlay",
}

// ProbeFilesystem finds out what dir's filesystem is (its type, from
// statfs; "0x<magic>" for one not known here) and whether it punches holes
// in a file (a real fallocate(PUNCH_HOLE) on a file of its own, which a
// thin volume's discards need to give space back).
func ProbeFilesystem(dir string) (fsType string, punchesHoles bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	fsType, ok := fsMagics[int64(st.Type)]
	if !ok {
		fsType = fmt.Sprintf("0x%x", st.Type)
	}
	f, err := os.CreateTemp(dir, tempPrefix+"probe-")
	if err != nil {
		return fsType, false, fmt.Errorf("probing whether %s punches holes: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(make([]byte, 8192)); err != nil {
		return fsType, false, fmt.Errorf("probing whether %s punches holes: %w", dir, err)
	}
	switch err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); {
	case err == nil:
		return fsType, true, nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return fsType, false, nil
	default:
		return fsType, false, fmt.Errorf("probing whether %s punches holes: %w", dir, err)
	}
}

package driver

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
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

// resolvePools returns the configured pools, the default pool (DataDir)
// first: a pool named like another, or a directory twice, is refused.
func (c Config) resolvePools() ([]pool.Options, error) {
	out := []pool.Options{c.poolOf(state.DefaultPool, c.DataDir, "")}
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
			p.Ratio = s.Ratio
		}
		out = append(out, p)
	}
	return out, nil
}

// poolOf is pool name at dir with the configuration's ratio and guard, or
// the guard given (checked by ParsePoolSpec) when it is not empty. With
// neither, the guard is left to the pool's filesystem, which pool.Open
// finds out (capacity.DefaultGuardFor).
func (c Config) poolOf(name, dir, guard string) pool.Options {
	p := pool.Options{Name: name, Dir: dir, Ratio: c.OverprovisioningRatio, Guard: c.guard}
	if guard != "" {
		g := capacity.MustParseGuard(guard)
		p.Guard = &g
	}
	return p
}

// openPools opens cfg's pools (pool.Open) once no user but root
// can change or redirect their directories (checkPoolDirs): the plugin, as
// root, attaches and mounts the image files they hold, and an image
// swapped, or a pool redirected by a symlink, by another user or by a pod
// with a hostPath would be mounted in its place. The pools served are
// checked again once open, before anything reads or writes them: a
// directory missing at the first check may have been made since. On
// failure no pool is left open.
func openPools(store pool.Store, cfg Config) (*pool.Pools, error) {
	if err := checkPoolDirs(cfg.pools); err != nil {
		return nil, err
	}
	ps, err := pool.Open(store, cfg.pools, cfg.KubeletDir)
	if err != nil {
		return nil, err
	}
	dirs := ps.Dirs()
	served := slices.DeleteFunc(slices.Clone(cfg.pools), func(p pool.Options) bool { return dirs[p.Name] == "" })
	if err := checkPoolDirs(served); err != nil {
		ps.Close()
		return nil, err
	}
	return ps, nil
}

// checkPoolDirs checks the directory of every pool of pools
// (devices.CheckTrustedDir), in order, and returns the first failure,
// naming the pool. The default pool's directory is made, 0700, when
// missing, as csi-node's own (devices.MakeTrustedDir); another pool whose
// directory is missing is passed over: this node lacks it, and
// pool.Open serves no pool there.
func checkPoolDirs(pools []pool.Options) error {
	for _, p := range pools {
		check := devices.CheckTrustedDir
		if p.Name == state.DefaultPool {
			check = devices.MakeTrustedDir
		}
		err := check(p.Dir)
		if errors.Is(err, fs.ErrNotExist) && p.Name != state.DefaultPool {
			continue
		}
		if err != nil {
			return fmt.Errorf("pool %s: %w", p.Name, err)
		}
	}
	return nil
}

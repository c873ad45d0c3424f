package driver

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/controller"
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
func (c Config) resolvePools() ([]controller.PoolOptions, error) {
	out := []controller.PoolOptions{c.poolOf(state.DefaultPool, c.DataDir, "")}
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
// neither, the guard is left to the pool's filesystem, which OpenPools
// finds out (capacity.DefaultGuardFor).
func (c Config) poolOf(name, dir, guard string) controller.PoolOptions {
	p := controller.PoolOptions{Name: name, Dir: dir, Ratio: c.OverprovisioningRatio, Guard: c.guard}
	if guard != "" {
		g := capacity.MustParseGuard(guard)
		p.Guard = &g
	}
	return p
}

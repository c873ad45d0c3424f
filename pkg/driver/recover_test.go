package driver

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// TestRecoverFreesAFullPoolBeforeProbingIt checks that a start removes
// what an interrupted image creation and snapshot copy left, keeps every
// image and snapshot, and probes the pool only then: the leftovers of a
// crash may have filled the pool's filesystem, where the probe, which
// writes, would fail and the plugin never start.
func TestRecoverFreesAFullPoolBeforeProbingIt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	snapDir := filepath.Join(dir, "snapshots")
	if err := os.Mkdir(snapDir, 0o700); err != nil {
		t.Fatal(err)
	}
	kept := []string{filepath.Join(dir, "v1.img"), filepath.Join(snapDir, "s1_node.snap")}
	for _, f := range kept {
		if err := os.WriteFile(f, []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	leftovers := []string{filepath.Join(snapDir, ".tmp-s2_node.snap"), filepath.Join(dir, ".tmp-v2.img")}
	for _, f := range leftovers {
		fill(t, f)
	}
	p, pools := poolPlugin(t, dir)
	if err := p.recover(); err != nil {
		t.Fatalf("recovering a pool full of what a crash left: %v", err)
	}
	for _, f := range leftovers {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the start: got %v, want it removed", f, err)
		}
	}
	for _, f := range kept {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s after the start: got %v, want it kept", f, err)
		}
	}
	if got := pools.Get(state.DefaultPool); got.FsType() != "tmpfs" || got.CopyMode() == "" {
		t.Errorf("pool probed as %q copying %q, want tmpfs and a copy mode", got.FsType(), got.CopyMode())
	}
}

// poolPlugin returns a plugin of one default pool in dir, with a store of
// its own, and its pools, as start-up's recover sees them.
func poolPlugin(t *testing.T, dir string) (*plugin, *pool.Pools) {
	t.Helper()
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	pools := pool.NewPools(store, pool.New(store, pool.Options{Dir: dir, Ratio: 1}))
	return &plugin{store: store, pools: pools}, pools
}

// fill writes f until its filesystem has no space left.
func fill(t *testing.T, f string) {
	t.Helper()
	w, err := os.Create(f)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := w.Write(buf); errors.Is(err, unix.ENOSPC) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecoverServesAPoolItCannotProbe: a pool full of its volumes' own
// data (nothing a crash left to free), or read-only with what a crash left
// in it, cannot take the probe's file or lose the leftovers: the start
// goes on, the pool reported as punching no holes, since refusing to start
// would stop every pool's volumes on the node.
func TestRecoverServesAPoolItCannotProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	for _, tc := range []struct {
		name string
		// make fills the pool's directory; readOnly remounts it so.
		make     func(t *testing.T, dir string) (kept []string)
		readOnly bool
	}{
		{name: "full of its volumes' data", make: func(t *testing.T, dir string) []string {
			f := filepath.Join(dir, "v1.img")
			fill(t, f)
			return []string{f}
		}},
		{name: "read-only, with what a crash left", readOnly: true, make: func(t *testing.T, dir string) []string {
			f := filepath.Join(dir, ".tmp-v2.img")
			if err := os.WriteFile(f, []byte("half made"), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{f}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
			kept := tc.make(t, dir)
			if tc.readOnly {
				if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
					t.Fatal(err)
				}
			}
			p, pools := poolPlugin(t, dir)
			if err := p.recover(); err != nil {
				t.Fatalf("starting with the pool %s: %v, want it served", tc.name, err)
			}
			if got := pools.Get(state.DefaultPool); got.FsType() != "tmpfs" || got.PunchesHoles() {
				t.Errorf("pool probed as %q, punching holes %v; want tmpfs, reported as punching none", got.FsType(), got.PunchesHoles())
			}
			for _, f := range kept {
				if _, err := os.Stat(f); err != nil {
					t.Errorf("%s after the start: %v, want it there", f, err)
				}
			}
		})
	}
}

package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

func TestParsePoolSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PoolSpec
		err  string
	}{
		{in: "fast=/mnt/nvme/converge", want: PoolSpec{Name: "fast", Dir: "/mnt/nvme/converge"}},
		{in: "fast=/mnt/nvme,guard=10%,ratio=2", want: PoolSpec{Name: "fast", Dir: "/mnt/nvme", Guard: "10%", Ratio: 2}},
		{in: "fast", err: "NAME=DIR"},
		{in: "Fast=/x", err: "lower-case"},
		{in: "fast=/x,guard=lots", err: "guard"},
		{in: "fast=/x,ratio=0.5", err: "ratio"},
		{in: "fast=/x,size=1G", err: "unknown option"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePoolSpec(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("got %+v, %v; want an error naming %s", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestResolvePools(t *testing.T) {
	base := Config{NodeID: "n", Endpoint: "unix:///tmp/x.sock", StateDir: "/var/lib/converge"}
	for _, tc := range []struct {
		name  string
		pools []PoolSpec
		err   string
		names []string
	}{
		{name: "default only", names: []string{"default"}},
		{name: "two more", pools: []PoolSpec{{Name: "fast", Dir: "/mnt/a"}, {Name: "slow", Dir: "/mnt/b", Guard: "1Gi", Ratio: 3}}, names: []string{"default", "fast", "slow"}},
		{name: "default again", pools: []PoolSpec{{Name: "default", Dir: "/mnt/a"}}, err: "--data-dir"},
		{name: "twice", pools: []PoolSpec{{Name: "fast", Dir: "/mnt/a"}, {Name: "fast", Dir: "/mnt/b"}}, err: "twice"},
		{name: "one directory", pools: []PoolSpec{{Name: "fast", Dir: "/var/lib/converge/volumes"}}, err: "default's too"},
		{name: "relative", pools: []PoolSpec{{Name: "fast", Dir: "mnt/a"}}, err: "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Pools = tc.pools
			got, err := cfg.withDefaults()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("got %v, want an error naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range got.pools {
				names = append(names, p.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.names, ",") {
				t.Errorf("got pools %v, want %v", names, tc.names)
			}
			if len(got.pools) == 3 && (got.pools[2].Ratio != 3 || got.pools[2].Guard == nil || got.pools[2].Guard.Bytes != 1<<30 || got.pools[1].Ratio != 1) {
				t.Errorf("pool options: got %+v", got.pools)
			}
		})
	}
}

// TestPoolGuardFollowsTheKubeletsFilesystem opens the default pool of a
// temporary directory: with the kubelet's directory on the same filesystem
// (not made yet, as before the kubelet's first start) it keeps the
// kubelet's guard, 20%, and its promise keeps that free; with the
// kubelet's directory elsewhere (procfs) it keeps the default 5%; and a
// guard configured, by --pool-guard or a pool's guard=, is kept as it is
// on either.
func TestPoolGuardFollowsTheKubeletsFilesystem(t *testing.T) {
	for _, tc := range []struct {
		name, kubeletDir, poolGuard string
		kubeletFS                   bool
		want                        capacity.Guard
	}{
		{name: "on the kubelet's filesystem", kubeletDir: "kubelet", kubeletFS: true, want: capacity.Guard{Percent: 20}},
		{name: "elsewhere", kubeletDir: "/proc/kubelet", want: capacity.Guard{Percent: 5}},
		{name: "configured, on the kubelet's filesystem", kubeletDir: "kubelet", poolGuard: "2Gi", kubeletFS: true, want: capacity.Guard{Bytes: 2 << 30}},
		{name: "configured, elsewhere", kubeletDir: "/proc/kubelet", poolGuard: "30%", want: capacity.Guard{Percent: 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			kubeletDir := tc.kubeletDir
			if !filepath.IsAbs(kubeletDir) {
				kubeletDir = filepath.Join(dir, kubeletDir)
			}
			cfg, err := Config{NodeID: "n", Endpoint: "unix://" + dir + "/csi.sock", StateDir: dir, KubeletDir: kubeletDir, PoolGuard: tc.poolGuard}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			store, err := state.Open(filepath.Join(dir, "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			pools, err := pool.Open(store, cfg.pools, cfg.KubeletDir)
			if err != nil {
				t.Fatal(err)
			}
			got := pools.Get(state.DefaultPool)
			st, err := got.Status("n")
			if err != nil {
				t.Fatal(err)
			}
			if st.KubeletFilesystem != tc.kubeletFS || got.Guard() != tc.want {
				t.Errorf("pool on the kubelet's filesystem %v with guard %v, want %v with %v", st.KubeletFilesystem, got.Guard(), tc.kubeletFS, tc.want)
			}
			if want := tc.want.Threshold(st.SizeBytes); st.GuardBytes != want {
				t.Errorf("the promise keeps %d bytes free, want %d", st.GuardBytes, want)
			}
		})
	}
}

// TestPoolOwnGuardWins checks that a pool's guard= overrides --pool-guard,
// and that a pool without one takes --pool-guard when it is given, and the
// default of its filesystem (left to pool.Open) when it is not.
func TestPoolOwnGuardWins(t *testing.T) {
	base := Config{NodeID: "n", Endpoint: "unix:///tmp/x.sock", StateDir: "/var/lib/converge",
		Pools: []PoolSpec{{Name: "fast", Dir: "/mnt/a", Guard: "1Gi"}, {Name: "slow", Dir: "/mnt/b"}}}
	for _, tc := range []struct {
		name, poolGuard string
		// set and guards are, by pool in order, whether the guard was
		// configured and which.
		set    []bool
		guards []capacity.Guard
	}{
		{name: "no --pool-guard", set: []bool{false, true, false}, guards: []capacity.Guard{{}, {Bytes: 1 << 30}, {}}},
		{name: "--pool-guard 10%", poolGuard: "10%", set: []bool{true, true, true},
			guards: []capacity.Guard{{Percent: 10}, {Bytes: 1 << 30}, {Percent: 10}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.PoolGuard = tc.poolGuard
			got, err := cfg.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range got.pools {
				var guard capacity.Guard
				if p.Guard != nil {
					guard = *p.Guard
				}
				if (p.Guard != nil) != tc.set[i] || guard != tc.guards[i] {
					t.Errorf("pool %s: guard %v (configured %v), want %v (%v)", p.Name, guard, p.Guard != nil, tc.guards[i], tc.set[i])
				}
			}
		})
	}
}

// TestOpenPoolsChecksDirectories opens the pools of a temporary directory
// whose pool directories, or their ancestors, someone other than root
// could change or redirect: the start is refused with an error naming the
// pool, the component at fault and the fix, and the pools are opened when
// every directory is root's alone. The default pool's directory is made
// 0700; another pool's missing directory is passed over.
func TestOpenPoolsChecksDirectories(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup prepares base (the state directory is base/state, the
		// pool fast is base/pools/fast) and returns what the error must
		// name, none for a start that succeeds.
		setup func(t *testing.T, base string) []string
	}{
		{name: "good", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "pools", "fast"), 0o750)
			return nil
		}},
		{name: "pool missing", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "pools"), 0o755)
			return nil
		}},
		{name: "symlinked pool", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "pools", "real"), 0o700)
			must(t, os.Symlink("real", filepath.Join(base, "pools", "fast")))
			return []string{"pool fast", filepath.Join(base, "pools", "fast") + " is a symlink", "readlink -f"}
		}},
		{name: "pool not root's", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "pools", "fast"), 0o700)
			must(t, os.Chown(filepath.Join(base, "pools", "fast"), 65534, 65534))
			return []string{"pool fast", "is owned by uid 65534", "chown root " + filepath.Join(base, "pools", "fast")}
		}},
		{name: "pool group-writable", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "pools", "fast"), 0o770)
			return []string{"pool fast", "writable by its group (mode 0770)", "chmod go-w " + filepath.Join(base, "pools", "fast")}
		}},
		{name: "pool world-writable", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "pools", "fast"), 0o707)
			return []string{"pool fast", "writable by others (mode 0707)"}
		}},
		{name: "ancestor world-writable", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "pools", "fast"), 0o700)
			mkdirMode(t, filepath.Join(base, "pools"), 0o777)
			return []string{"pool fast", filepath.Join(base, "pools") + " is writable by its group and others"}
		}},
		{name: "default pool's ancestor group-writable", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "state"), 0o770)
			return []string{"pool default", filepath.Join(base, "state") + " is writable by its group"}
		}},
		{name: "default pool symlinked", setup: func(t *testing.T, base string) []string {
			mkdirMode(t, filepath.Join(base, "elsewhere"), 0o700)
			mkdirMode(t, filepath.Join(base, "state"), 0o700)
			must(t, os.Symlink("../elsewhere", filepath.Join(base, "state", "volumes")))
			return []string{"pool default", filepath.Join(base, "state", "volumes") + " is a symlink"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if os.Geteuid() != 0 {
				t.Skip("needs root: chown, and directories owned by root")
			}
			base := t.TempDir()
			want := tc.setup(t, base)
			cfg, err := Config{NodeID: "n", Endpoint: "unix://" + base + "/csi.sock", StateDir: filepath.Join(base, "state"),
				KubeletDir: filepath.Join(base, "kubelet"), Pools: []PoolSpec{{Name: "fast", Dir: filepath.Join(base, "pools", "fast")}}}.withDefaults()
			must(t, err)
			store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
			must(t, err)
			defer store.Close()
			pools, err := openPools(store, cfg)
			if want == nil {
				if err != nil {
					t.Fatalf("got %v, want the pools open", err)
				}
				pools.Close()
				if fi, err := os.Lstat(cfg.DataDir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
					t.Errorf("the default pool's directory: got %v, %v; want a directory of mode 0700", fi, err)
				}
				return
			}
			if err == nil {
				pools.Close()
				t.Fatalf("got the pools open, want an error naming %q", want)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got %q, want it to name %q", err, w)
				}
			}
		})
	}
}

// mkdirMode makes dir and its missing parents, and sets dir's mode to
// exactly mode, the umask aside.
func mkdirMode(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o700))
	must(t, os.Chmod(dir, mode))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestOpenStoreChecksItsDirectory opens the store in a state directory
// that others may write, and in one beneath a symlink: both are refused,
// naming the directory, and no store is made there; a missing one is
// made, root's alone.
func TestOpenStoreChecksItsDirectory(t *testing.T) {
	root := t.TempDir()
	open := filepath.Join(root, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{open, filepath.Join(root, "link", "state")} {
		_, err := openStore(context.Background(), Config{StateDir: dir})
		var unsafe *devices.UnsafeDirError
		if !errors.As(err, &unsafe) {
			t.Errorf("opening a store in %s: %v, want it refused as unsafe", dir, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "state.db")); err == nil {
			t.Errorf("a store was made in %s", dir)
		}
	}
	made := filepath.Join(root, "made", "state")
	store, err := openStore(context.Background(), Config{StateDir: made})
	if err != nil {
		t.Fatalf("opening a store in a new %s: %v", made, err)
	}
	store.Close()
	if fi, err := os.Stat(made); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s made: %v, %v; want mode 0700", made, fi, err)
	}
}

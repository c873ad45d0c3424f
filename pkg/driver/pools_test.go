package driver

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/controller"
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
			pools, err := controller.OpenPools(store, cfg.pools, cfg.KubeletDir)
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
// default of its filesystem (left to controller.OpenPools) when it is not.
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

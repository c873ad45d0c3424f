package driver

import (
	"strings"
	"testing"
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
				names = append(names, p.name)
			}
			if strings.Join(names, ",") != strings.Join(tc.names, ",") {
				t.Errorf("got pools %v, want %v", names, tc.names)
			}
			if len(got.pools) == 3 && (got.pools[2].ratio != 3 || got.pools[2].guard.Bytes != 1<<30 || got.pools[1].ratio != 1) {
				t.Errorf("pool options: got %+v", got.pools)
			}
		})
	}
}

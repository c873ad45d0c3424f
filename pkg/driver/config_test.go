package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigValidation(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	base := Config{Endpoint: "unix://" + dir + "/csi.sock", NodeID: "n", StateDir: dir + "/state", KubeletDir: dir + "/kubelet"}
	tests := []struct {
		name   string
		mutate func(c *Config)
		ok     bool
		// flag is the flag the error must name.
		flag string
	}{
		{name: "valid", mutate: func(c *Config) {}, ok: true},
		{name: "tcp endpoint", mutate: func(c *Config) { c.Endpoint = "tcp://127.0.0.1:9000" }},
		{name: "relative socket", mutate: func(c *Config) { c.Endpoint = "unix://csi.sock" }},
		{name: "unclean socket", mutate: func(c *Config) { c.Endpoint = "unix://" + dir + "/../csi.sock" }},
		{name: "no node ID", mutate: func(c *Config) { c.NodeID = "" }},
		{name: "relative state dir", mutate: func(c *Config) { c.StateDir = "state" }},
		{name: "root as prefix", mutate: func(c *Config) { c.AllowedPathPrefixes = []string{"/"} }},
		{name: "symlinked kubelet dir", mutate: func(c *Config) { c.KubeletDir = link }},
		{name: "negative max volumes", mutate: func(c *Config) { c.MaxVolumes = -1 }},
		{name: "status over tcp", mutate: func(c *Config) { c.HTTPAddress, c.HTTPStatus = "127.0.0.1:9810", true }, ok: true},
		{name: "status without tcp", mutate: func(c *Config) { c.HTTPStatus = true }, flag: "--http-status"},
		{name: "ratio 3", mutate: func(c *Config) { c.OverprovisioningRatio = 3 }, ok: true},
		{name: "ratio below 1", mutate: func(c *Config) { c.OverprovisioningRatio = 0.5 }, flag: "--thin-overprovisioning-ratio"},
		{name: "guard in bytes", mutate: func(c *Config) { c.PoolGuard = "2Gi" }, ok: true},
		{name: "malformed guard", mutate: func(c *Config) { c.PoolGuard = "5 percent" }, flag: "--pool-guard"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mutate(&c)
			got, err := c.withDefaults()
			if (err == nil) != tc.ok {
				t.Fatalf("got %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("error %q does not name %s", err, tc.flag)
			}
			if tc.ok && (got.DataDir != c.StateDir+"/volumes" || got.DriverName != DefaultDriverName) {
				t.Errorf("defaults: got data dir %s, driver %s", got.DataDir, got.DriverName)
			}
		})
	}
}

// Package sanity runs csi-sanity against the real csi-node binary on a
// unix socket, with real loop devices, filesystems and mounts.
package sanity

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/converge-csi/converge/test/testenv"
)

func TestSanity(t *testing.T) {
	p := testenv.New(t)
	p.Start()

	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + p.Socket
	cfg.TargetPath = filepath.Join(p.Root, "target")
	cfg.StagingPath = filepath.Join(p.Root, "staging")
	// Small volumes keep mkfs fast; the size still exercises real ext4.
	cfg.TestVolumeSize = 64 << 20
	cfg.TestVolumeExpandSize = 128 << 20
	// Each idempotency spec repeats every call this many times.
	cfg.IdempotentCount = 5
	cfg.TestNodeVolumeAttachLimit = false
	sanity.Test(t, cfg)

	if _, err := os.Stat(cfg.StagingPath); err == nil {
		t.Errorf("csi-sanity left %s behind", cfg.StagingPath)
	}
}

// Package sanityblock runs csi-sanity against the real csi-node binary with
// raw block volumes (csi-test allows one sanity run per package; the mount
// run is in test/sanity).
package sanityblock

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/converge-csi/converge/test/testenv"
)

func TestSanityBlock(t *testing.T) {
	p := testenv.New(t)
	p.Start()

	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + p.Socket
	cfg.TargetPath = filepath.Join(p.Root, "target")
	cfg.StagingPath = filepath.Join(p.Root, "staging")
	cfg.TestVolumeAccessType = "block"
	cfg.TestVolumeSize = 16 << 20
	cfg.TestVolumeExpandSize = 32 << 20
	cfg.IdempotentCount = 5
	cfg.TestNodeVolumeAttachLimit = false
	sanity.Test(t, cfg)

	if _, err := os.Stat(cfg.StagingPath); err == nil {
		t.Errorf("csi-sanity left %s behind", cfg.StagingPath)
	}
}

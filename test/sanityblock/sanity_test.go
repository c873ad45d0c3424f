// Package sanityblock runs csi-sanity against the real csi-node binary with
// raw block volumes (csi-test allows one sanity run per package; the mount
// run is in test/sanity).
package sanityblock

import (
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/converge-csi/converge/test/testenv"
)

func TestSanityBlock(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	cfg := p.SanityConfig(16 << 20)
	cfg.TestVolumeAccessType = "block"
	sanity.Test(t, cfg)
	testenv.CheckSanityCleanup(t, cfg)
}

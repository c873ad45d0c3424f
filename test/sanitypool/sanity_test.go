// Package sanitypool runs csi-sanity against the real csi-node binary with
// every volume in a storage pool of its own, an xfs that clones by reflink
// on a loop device of the test's (csi-test allows one sanity run per
// package; the default pool's run is in test/sanity).
package sanitypool

import (
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/converge-csi/converge/test/testenv"
)

func TestSanityPool(t *testing.T) {
	p := testenv.New(t)
	dir := testenv.PoolFilesystem(t, p, "fast", 1<<30, "xfs", "-q", "-f", "-m", "reflink=1")
	p.Args = append(p.Args, "--pool", "fast="+dir)
	p.Start()
	cfg := p.SanityConfig(16 << 20)
	cfg.TestVolumeParameters = map[string]string{"converge.csi.dev/pool": "fast"}
	sanity.Test(t, cfg)
	testenv.CheckSanityCleanup(t, cfg)
	created, inFast := 0, 0
	for _, line := range strings.Split(p.Log(), "\n") {
		if strings.Contains(line, `"Created volume"`) {
			created++
			if strings.Contains(line, `pool="fast"`) {
				inFast++
			}
		}
	}
	if created == 0 || inFast != created {
		t.Errorf("csi-sanity's volumes were not all made in pool fast: %d created, %d in fast", created, inFast)
	}
}

// Package sanity runs csi-sanity against the real csi-node binary on a
// unix socket, with real loop devices, filesystems and mounts, with the
// mount access type (test/sanityblock runs it with raw block).
package sanity

import (
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/converge-csi/converge/test/testenv"
)

func TestSanity(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	// Small volumes keep mkfs fast; the size still exercises real ext4.
	cfg := p.SanityConfig(64 << 20)
	sanity.Test(t, cfg)
	testenv.CheckSanityCleanup(t, cfg)
}

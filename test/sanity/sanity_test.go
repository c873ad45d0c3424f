// Package sanity runs csi-sanity against the real csi-node binary on a
// unix socket, with real loop devices, filesystems and mounts, with the
// mount access type and the alpha features csi-sanity knows turned on
// (test/sanityblock runs it with raw block and default flags).
package sanity

import (
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/converge-csi/converge/test/testenv"
)

func TestSanity(t *testing.T) {
	// csi-sanity v5.6 is built on CSI v1.13, whose snapshot topology and
	// volume health it tests; VolumeCondition is of older versions.
	p := testenv.New(t, "--feature-gates=SnapshotAccessibility=true,VolumeHealth=true,ModifyVolume=true")
	p.Start()
	// Small volumes keep mkfs fast; the size still exercises real ext4.
	cfg := p.SanityConfig(64 << 20)
	sanity.Test(t, cfg)
	testenv.CheckSanityCleanup(t, cfg)
}

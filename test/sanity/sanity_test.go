// Package sanity runs csi-sanity against the real csi-node binary on a
// unix socket, with real loop devices, filesystems and mounts, with the
// mount access type (test/sanityblock runs it with raw block).
package sanity

import (
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/converge-csi/converge/test/testenv"
)

// onlineExt4Spec grows a published volume, which csi-sanity makes ext4
// (it names no filesystem): only a process with CAP_SYS_RESOURCE can.
const onlineExt4Spec = "should work if node-expand is called after node-publish"

func TestSanity(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	// Small volumes keep mkfs fast; the size still exercises real ext4.
	cfg := p.SanityConfig(64 << 20)
	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	if !testenv.CanGrowExt4Online() {
		// The plugin answers FAILED_PRECONDITION and names the missing
		// capability (test/integration TestExpansion checks it, and the
		// growth of xfs and btrfs online).
		t.Logf("skipping %q: this process lacks CAP_SYS_RESOURCE, without which no one can grow a mounted ext4", onlineExt4Spec)
		suite.SkipStrings = append(suite.SkipStrings, onlineExt4Spec)
	}
	ginkgo.RunSpecs(t, "CSI Driver Test Suite", suite, reporter)
	sc.Finalize()
	testenv.CheckSanityCleanup(t, cfg)
}

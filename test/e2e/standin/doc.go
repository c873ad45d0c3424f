// Package standin holds the e2e suite's stand-in for node-driver-registrar,
// the one kubernetes-csi sidecar deploy/ runs whose release the suite
// cannot build (its Go module is refused by this machine's module proxy;
// csi-provisioner, csi-resizer and csi-snapshotter are built from their
// releases, ../sidecars.go). The suite runs it under the release's image
// name, in place of the release.
//
// The stand-in behaves as its release does with the flags deploy/ and the
// chart pass it, as read from the release's source at its tag: each flag
// it takes changes what it does as it changes what the release does, and
// it refuses, at start, every other flag of the release (exit 1), as it
// refuses what the release refuses (exit 2). A flag left out takes the
// release's default. This package's own tests check each flag value
// deploy/ passes, and each refusal, without a cluster; the suite (../)
// runs it on one.
package standin

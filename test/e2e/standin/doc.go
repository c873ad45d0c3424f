// Package standin holds the e2e suite's stand-ins for the kubernetes-csi
// sidecars deploy/ runs whose releases the suite cannot build (their Go
// modules are refused by this machine's module proxy): csi-provisioner,
// csi-resizer and node-driver-registrar. The suite runs
// each under its release's image name, in place of the release.
//
// A stand-in behaves as its release does with the flags deploy/ and the
// chart pass it, as read from the release's source at its tag: each flag
// a stand-in takes changes what it does as it changes what the release
// does, and it refuses, at start, every other flag of the release and
// every value of a flag it does not implement (exit 1), as it refuses
// what the release refuses (exit 2). A flag left out takes the release's
// default. This package's own tests check each flag value deploy/ passes,
// and each refusal, without a cluster; the suite (../) runs them on one.
package standin

// Package failpoints builds a csi-node with the source's failpoints made
// code, and lists them. A failpoint is a `// gofail: var <Name> struct{}`
// comment in a non-test Go file of cmd/ or pkg/: a comment to every other
// build, code only in this one. The checkout is never touched: gofail's
// rewrite of each file that holds failpoints, and the runtime bindings it
// adds, reach the compiler through go build -overlay.
//
// Package testenv runs the binary for the fault tests (test/fault's walk);
// the e2e suite, its own module, runs it in the node pods of its cluster
// (test/e2e/failpointbuild.go). It lives apart from testenv so that the
// e2e module takes on gofail and nothing else of the tests' harness.
package failpoints

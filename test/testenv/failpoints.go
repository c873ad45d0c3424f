package testenv

import (
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/converge-csi/converge/test/testenv/failpoints"
)

// Failpoint is a named failpoint of the source: a `// gofail: var <Name>
// struct{}` comment, which is code only in the binary FailpointBinary
// builds.
type Failpoint = failpoints.Failpoint

var (
	failpointOnce   sync.Once
	failpointBinary string
	failpointList   []Failpoint
	failpointErr    error
)

// Root returns the repository's root directory.
func Root() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..")
}

// Failpoints lists the failpoints of the source that csi-node is built
// from (its non-test Go files under cmd/ and pkg/), sorted by name.
func Failpoints(t testing.TB) []Failpoint {
	t.Helper()
	fps, err := failpoints.List(Root(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return fps
}

// FailpointBinary returns a csi-node built from this tree, with
// BuildTags, with its failpoints enabled, and the failpoints: package
// failpoints builds it, once per test process, through go build -overlay
// (the checkout is not touched), and caches it under a hash of its source.
func FailpointBinary(t testing.TB) (string, []Failpoint) {
	t.Helper()
	failpointOnce.Do(func() {
		failpointBinary, failpointList, failpointErr = failpoints.Build(Root(), BuildTags)
	})
	if failpointErr != nil {
		t.Fatal(failpointErr)
	}
	return failpointBinary, failpointList
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/dist"
)

// The release of the run's source tree, made as make release makes it
// (package dist) for this machine's platform, in the background from the
// moment the cluster is up: TestHelmChart installs the chart from its
// files, with its image, as a user does.
type releaseBuild struct {
	done chan struct{}
	rel  *dist.Release
	err  error
}

// startRelease starts the release's build into the run's directory.
func (c *cluster) startRelease(context.Context) error {
	c.release = &releaseBuild{done: make(chan struct{})}
	cache, err := os.UserCacheDir()
	if err != nil {
		return err
	}
	go func() {
		defer close(c.release.done)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		start := time.Now()
		c.release.rel, c.release.err = dist.Build(ctx, dist.Options{Repo: c.repo, Out: filepath.Join(c.dir, "release"),
			CacheDir: filepath.Join(cache, "converge-e2e"), Platforms: []dockerfile.Platform{dockerfile.Host()}})
		fmt.Printf("e2e: made the release's files in %.1fs (%v)\n", time.Since(start).Seconds(), c.release.err)
	}()
	return nil
}

// awaitRelease waits for the release's files, checks them against their
// SHA256SUMS as a user would (sha256sum -c), and imports its image into
// every node's containerd, as a user without a registry loads it
// (ctr images import).
func awaitRelease(t *testing.T) *dist.Release {
	t.Helper()
	select {
	case <-c.release.done:
	case <-time.After(15 * time.Minute):
		t.Fatal("the release's files: not made in 15 minutes")
	}
	if c.release.err != nil {
		t.Fatalf("make release: %v", c.release.err)
	}
	r := c.release.rel
	if err := dist.Verify(filepath.Dir(r.Chart)); err != nil {
		t.Fatalf("the release's checksums: %v", err)
	}
	archive := r.Images[dockerfile.Host().String()]
	for _, n := range c.nodes {
		if out, err := n.ctr("images", "import", archive); err != nil {
			t.Fatalf("importing the release's image into %s's containerd: %v: %s", n.node, err, out)
		}
	}
	t.Logf("release %s: image %s, files %v", r.Version, r.ImageRef, r.Files)
	return r
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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

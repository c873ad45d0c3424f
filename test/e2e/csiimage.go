package e2e

import (
	"context"
	"os"
	"path/filepath"

	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/dist"
	"github.com/converge-csi/converge/test/e2e/ociimage"
)

// The csi-node image, built as the Dockerfile builds it (see test/dockerfile)
// and imported into every node's containerd under a name of its own.
const (
	csiNodeImageName = "converge.local/csi-node"
	csiNodeImageTag  = "e2e"
	// csiNodeUpdateTag names the same image again, for a rolling update
	// of the DaemonSet (TestDriverRollingUpdate).
	csiNodeUpdateTag = "e2e-update"
)

// buildCSINodeImage writes the csi-node image of the Dockerfile, for this
// machine's platform, to an OCI archive in the run's directory: the final
// stage's Debian root (cached, see ociimage.DebianRoot) as one layer, the binaries
// (csi-node, converge-controller) built as the build stage builds them as
// the other, the Dockerfile's entry point and labels, version
// csiNodeImageTag.
func (c *cluster) buildCSINodeImage(ctx context.Context) error {
	c.csiImage = filepath.Join(c.dir, "csi-node-image.tar")
	return c.writeCSINodeImage(ctx, c.repo, csiNodeImageTag, c.dir, c.csiImage)
}

// writeCSINodeImage writes the csi-node image of the Dockerfile of the
// source tree repo, version tag, for this machine's platform, as an OCI
// archive at out, named csiNodeImageName:tag (dist.Image); its binaries
// are built into work.
func (c *cluster) writeCSINodeImage(ctx context.Context, repo, tag, work, out string) error {
	cache, err := os.UserCacheDir()
	if err != nil {
		return err
	}
	im, _, built, err := dist.Image(ctx, repo, filepath.Join(cache, "converge-e2e"), work, csiNodeImageName+":"+tag, tag, dockerfile.Host())
	if built {
		c.builtMu.Lock()
		c.built = append(c.built, "image root")
		c.builtMu.Unlock()
	}
	if err != nil {
		return err
	}
	return ociimage.WriteArchive(out, false, im)
}

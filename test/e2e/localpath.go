package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/ociimage"
	"github.com/converge-csi/converge/test/e2e/peers"
)

// rancher's local-path-provisioner, which issue 72's comparison runs
// beside converge: built from its release's module (test/e2e/localpath)
// as the sidecars are, packed into an image under the very name its
// manifest gives, and installed from that manifest
// (test/e2e/localpath/local-path-storage.yaml) with kubectl apply, as its
// docs install it, changed only in its node path (peers.LocalPath). It is
// installed only while a test uses it (installLocalPath), so that the
// runs and tests that do not pay nothing for it and meet the cluster as
// before; its pods and events are not converge's, which the run's
// invariants alone concern.

const (
	// localPathClass is the StorageClass the manifest makes.
	localPathClass = "local-path"
	// localPathNamespace is the namespace it runs in.
	localPathNamespace = "local-path-storage"
	// localPathBinary is the binary's name: the last element of its
	// module's path, whose root is its main package, as go build tool
	// names it; the manifest runs it by that name, through PATH.
	localPathBinary = "local-path-provisioner"
	// localPathImagePATH is the PATH of the release's image (alpine's),
	// in which the manifest's command finds the binary.
	localPathImagePATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// localPathInstall counts the tests that use local-path, so that the first
// installs it and the last takes it away again.
type localPathInstall struct {
	mu sync.Mutex
	// users and manifest are guarded by mu.
	users    int
	manifest string // the path of the manifest applied
}

// buildLocalPath builds local-path-provisioner's release into the user's
// cache directory, or finds it built there, and returns the binary's
// path.
func (c *cluster) buildLocalPath(ctx context.Context) (string, error) {
	// As the release's scripts/build builds it: static, stripped, its
	// version in main.VERSION, which --version prints.
	dir, err := c.buildTools(ctx, localPathBinary+"-"+peers.LocalPathVersion, "localpath", localPathBinary,
		"-s -w -X main.VERSION="+peers.LocalPathVersion, "CGO_ENABLED=0")
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", localPathBinary, peers.LocalPathVersion, err)
	}
	return filepath.Join(dir, localPathBinary), nil
}

// localPathDir is the directory under which local-path makes its volumes'
// directories on every node: the run's own (runs share the machine), in
// place of the release's /opt/local-path-provisioner. The nodes share the
// host's filesystem, so it is at the same path on each.
func (c *cluster) localPathDir() string { return filepath.Join(c.dir, "local-path") }

// installLocalPath installs local-path-provisioner and waits for it to
// run, unless a test has it installed already; each call that succeeds
// must be matched by one of uninstallLocalPath, and one that fails leaves
// nothing applied. Its image, and the helper pod's name for
// the busybox image, go to the nodes the cluster has now.
func (c *cluster) installLocalPath(ctx context.Context) error {
	c.localPath.mu.Lock()
	defer c.localPath.mu.Unlock()
	if c.localPath.users > 0 {
		c.localPath.users++
		return nil
	}
	upstream, err := os.ReadFile(filepath.Join(c.repo, "test", "e2e", "localpath", "local-path-storage.yaml"))
	if err != nil {
		return err
	}
	install, err := peers.LocalPath(upstream, c.localPathDir())
	if err != nil {
		return fmt.Errorf("local-path's manifest: %w", err)
	}
	bin, err := c.buildLocalPath(ctx)
	if err != nil {
		return err
	}
	if err := c.importLocalPathImages(bin, install); err != nil {
		return err
	}
	manifest := filepath.Join(c.dir, "local-path-storage.yaml")
	if err := os.WriteFile(manifest, install.Manifest, 0o644); err != nil {
		return err
	}
	_, err = c.kubectl(ctx, "apply", "-f", manifest)
	if err == nil {
		_, err = c.kubectl(ctx, "-n", localPathNamespace, "rollout", "status", "deployment/local-path-provisioner", "--timeout=2m")
	}
	if err != nil {
		// What the provisioner's pod went through, before it goes.
		pods, _ := c.kubectl(ctx, "-n", localPathNamespace, "describe", "pods")
		c.kubectl(ctx, "delete", "-f", manifest, "--ignore-not-found", "--wait", "--timeout=2m")
		return fmt.Errorf("%w\n%s", err, tail(pods, 30))
	}
	c.localPath.users, c.localPath.manifest = 1, manifest
	return nil
}

// uninstallLocalPath deletes what installLocalPath applied, once no test
// uses it, and waits for it to be gone. Volumes of its class must be gone
// before: nothing would delete them.
func (c *cluster) uninstallLocalPath(ctx context.Context) error {
	c.localPath.mu.Lock()
	defer c.localPath.mu.Unlock()
	if c.localPath.users == 0 {
		return nil
	}
	if c.localPath.users--; c.localPath.users > 0 {
		return nil
	}
	_, err := c.kubectl(ctx, "delete", "-f", c.localPath.manifest, "--wait", "--timeout=2m")
	return err
}

// importLocalPathImages imports into every node's containerd the
// provisioner's image, bin on busybox (the release's is alpine's, a shell
// and the binary on PATH), under the name its manifest gives, and names
// the run's busybox image (busyboxImage, Debian's busybox-static) as the
// helper pod asks for it. Both images are made from what is built and
// cached already: this takes seconds.
func (c *cluster) importLocalPathImages(bin string, install peers.LocalPathInstall) error {
	files, err := busyboxFiles(map[string]string{"/usr/bin/" + localPathBinary: bin})
	if err != nil {
		return err
	}
	layer, err := ociimage.Layer(files)
	if err != nil {
		return err
	}
	archive := filepath.Join(c.dir, "local-path-provisioner-image.tar")
	defer os.Remove(archive)
	if err := ociimage.WriteArchive(archive, false, ociimage.Image{Ref: install.Image, Platform: dockerfile.Host(), Layers: [][]byte{layer},
		Config: map[string]any{"Cmd": []string{localPathBinary}, "Env": []string{localPathImagePATH}}}); err != nil {
		return err
	}
	for _, n := range c.nodes {
		if out, err := n.ctr("images", "import", archive); err != nil {
			return fmt.Errorf("importing %s into %s's containerd: %v: %s", install.Image, n.node, err, out)
		}
		if out, err := n.ctr("images", "tag", "--force", busyboxImage, install.HelperImage); err != nil {
			return fmt.Errorf("naming %s %s on %s: %v: %s", busyboxImage, install.HelperImage, n.node, err, out)
		}
	}
	return nil
}

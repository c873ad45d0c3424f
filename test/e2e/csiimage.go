package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/converge-csi/converge/test/dockerfile"
)

// The csi-node image, built as the Dockerfile builds it (see test/dockerfile)
// and imported into every node's containerd under a name of its own.
const (
	csiNodeImageName = "converge.local/csi-node"
	csiNodeImageTag  = "e2e"
	// csiNodeUpdateTag names the same image again, for a rolling update
	// of the DaemonSet (TestDriverRollingUpdate).
	csiNodeUpdateTag = "e2e-update"
	// debianMirror is where debootstrap and apt take Debian's packages,
	// as the debian images' sources do.
	debianMirror = "http://deb.debian.org/debian"
	// imagePath is the PATH of the debian base images, which the image
	// inherits.
	imagePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// buildCSINodeImage writes the csi-node image of the Dockerfile, for this
// machine's platform, to an OCI archive in the run's directory: the final
// stage's Debian root (cached, see imageRoot) as one layer, the binaries
// (csi-node, converge-controller) built as the build stage builds them as
// the other, the Dockerfile's entry point and labels, version
// csiNodeImageTag.
func (c *cluster) buildCSINodeImage(ctx context.Context) error {
	c.csiImage = filepath.Join(c.dir, "csi-node-image.tar")
	return c.writeCSINodeImage(ctx, c.repo, csiNodeImageTag, c.dir, c.csiImage)
}

// writeCSINodeImage writes the csi-node image of the Dockerfile of the
// source tree repo, version tag, as an OCI archive at out, named
// csiNodeImageName:tag; its binaries are built into work.
func (c *cluster) writeCSINodeImage(ctx context.Context, repo, tag, work, out string) error {
	d, err := dockerfile.Read(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		return err
	}
	root, err := c.imageRoot(ctx, d)
	if err != nil {
		return err
	}
	var files []layerFile
	dirs := map[string]bool{}
	for _, b := range d.Binaries {
		bin := filepath.Join(work, "image-"+filepath.Base(b.Pkg))
		cmd, err := d.GoBuild(ctx, repo, dockerfile.Host(), tag, b, bin)
		if err != nil {
			return err
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, out)
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return err
		}
		var parents []layerFile
		for p := strings.TrimPrefix(filepath.Dir(b.Path), "/"); p != "." && !dirs[p]; p = filepath.Dir(p) {
			dirs[p] = true
			parents = append([]layerFile{{name: p, dir: true}}, parents...)
		}
		files = append(append(files, parents...), layerFile{name: strings.TrimPrefix(b.Path, "/"), mode: 0o755, data: data})
	}
	binLayer, err := layerTar(files)
	if err != nil {
		return err
	}
	rootLayer, err := os.ReadFile(root)
	if err != nil {
		return err
	}
	labels, err := d.ImageLabels(dockerfile.Host(), tag)
	if err != nil {
		return err
	}
	return writeOCIArchive(out, csiNodeImageName+":"+tag, [][]byte{rootLayer, binLayer},
		map[string]any{"Entrypoint": d.Entrypoint, "Env": []string{imagePath}, "Labels": labels})
}

// imageRoot returns a tar of the final stage's root, made from Debian's
// packages as "FROM debian:<suite>-slim" and its apt-get line make it:
// debootstrap --variant=minbase (of this machine's architecture, the
// image's), then exactly the Dockerfile's packages without recommends, the
// package lists removed. It is cached in the
// user's cache directory under a name made of the suite and the packages;
// a cold build takes a minute or two, a warm one nothing.
func (c *cluster) imageRoot(ctx context.Context, d *dockerfile.Dockerfile) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	recipe := fmt.Sprintf("debootstrap --variant=minbase %s %s; apt-get install -y --no-install-recommends %s",
		d.Suite, debianMirror, strings.Join(d.Packages, " "))
	sum := sha256.Sum256([]byte(recipe))
	path := filepath.Join(cache, "converge-e2e", "csi-node-root-"+d.Suite+"-"+hex.EncodeToString(sum[:6])+".tar")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	c.built = append(c.built, "image root")
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", fmt.Errorf("debootstrap is not installed (hack/install-deps.sh e2e installs it): %w", err)
	}
	tmp, err := os.MkdirTemp(c.dir, "image-root-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "root")
	// debootstrap and apt mount /proc and more inside the root: in a mount
	// namespace of their own, nothing is left mounted on the host
	// whatever happens.
	private := func(script string, args ...string) error {
		cmd := exec.CommandContext(ctx, "unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-ec", script, "sh"}, args...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", script, err, tail(string(out), 30))
		}
		return nil
	}
	if err := private(`debootstrap --variant=minbase "$1" "$2" "$3"`, d.Suite, root, debianMirror); err != nil {
		return "", err
	}
	// The sources of the debian images: the suite, its updates and its
	// security fixes.
	sources := fmt.Sprintf("deb %[1]s %[2]s main\ndeb %[1]s %[2]s-updates main\ndeb http://deb.debian.org/debian-security %[2]s-security main\n", debianMirror, d.Suite)
	if err := os.WriteFile(filepath.Join(root, "etc/apt/sources.list"), []byte(sources), 0o644); err != nil {
		return "", err
	}
	install := `mount -t proc proc "$1/proc"; chroot "$1" sh -ec 'apt-get update; shift; apt-get install -y --no-install-recommends "$@"; apt-get clean; rm -rf /var/lib/apt/lists/*' sh "$@"`
	if err := private(install, append([]string{root}, d.Packages...)...); err != nil {
		return "", err
	}
	partial := path + ".partial"
	tar := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", partial,
		"--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./run/*", "--exclude=./tmp/*", ".")
	if out, err := tar.CombinedOutput(); err != nil {
		os.Remove(partial)
		return "", fmt.Errorf("tar of the image root: %v\n%s", err, out)
	}
	return path, os.Rename(partial, path)
}

// layerTar writes files as an image layer.
func layerTar(files []layerFile) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		switch {
		case f.dir:
			h.Typeflag, h.Mode, h.Size, h.Name = tar.TypeDir, 0o755, 0, f.name+"/"
		case f.symlink != "":
			h.Typeflag, h.Linkname, h.Mode, h.Size = tar.TypeSymlink, f.symlink, 0o777, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return layer.Bytes(), nil
}

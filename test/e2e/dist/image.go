package dist

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/ociimage"
)

// imagePath is the PATH of the debian base images, which the image
// inherits.
const imagePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Image builds the csi-node image of the Dockerfile of the source tree
// repo for platform p, version version, named ref: the final stage's
// Debian root (ociimage.DebianRoot, cached in cacheDir) as one layer, the
// binaries (csi-node, converge-controller) built as the build stage builds
// them as the other, the Dockerfile's entry point and labels. The binaries
// are left in work as <name>-<os>-<arch>. built reports a cold build of the
// root.
func Image(ctx context.Context, repo, cacheDir, work, ref, version string, p dockerfile.Platform) (im ociimage.Image, bins []string, built bool, err error) {
	d, err := dockerfile.Read(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		return im, nil, false, err
	}
	root, built, err := ociimage.DebianRoot(ctx, cacheDir, work, d, p)
	if err != nil {
		return im, nil, built, err
	}
	var files []ociimage.File
	dirs := map[string]bool{}
	for _, b := range d.Binaries {
		bin := filepath.Join(work, filepath.Base(b.Pkg)+"-"+p.OS+"-"+p.Arch)
		cmd, err := d.GoBuild(ctx, repo, p, version, b, bin)
		if err != nil {
			return im, nil, built, err
		}
		// The Dockerfile's build has no .git (its context copies cmd and
		// pkg): no VCS stamp here either, and no git asked whether a
		// checkout owned by another user is safe.
		cmd.Env = append(cmd.Env, strings.TrimSpace("GOFLAGS="+os.Getenv("GOFLAGS")+" -buildvcs=false"))
		if out, err := cmd.CombinedOutput(); err != nil {
			return im, nil, built, fmt.Errorf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, out)
		}
		bins = append(bins, bin)
		data, err := os.ReadFile(bin)
		if err != nil {
			return im, nil, built, err
		}
		var parents []ociimage.File
		for dir := strings.TrimPrefix(filepath.Dir(b.Path), "/"); dir != "." && !dirs[dir]; dir = filepath.Dir(dir) {
			dirs[dir] = true
			parents = append([]ociimage.File{{Name: dir, Dir: true}}, parents...)
		}
		files = append(append(files, parents...), ociimage.File{Name: strings.TrimPrefix(b.Path, "/"), Mode: 0o755, Data: data})
	}
	binLayer, err := ociimage.Layer(files)
	if err != nil {
		return im, nil, built, err
	}
	rootLayer, err := os.ReadFile(root)
	if err != nil {
		return im, nil, built, err
	}
	labels, err := d.ImageLabels(p, version)
	if err != nil {
		return im, nil, built, err
	}
	return ociimage.Image{Ref: ref, Platform: p, Layers: [][]byte{rootLayer, binLayer},
		Config: map[string]any{"Entrypoint": d.Entrypoint, "Env": []string{imagePath}, "Labels": labels}}, bins, built, nil
}

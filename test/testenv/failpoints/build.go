package failpoints

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// Build returns a csi-node built, with tags, from the source tree at root
// with its failpoints enabled, and the failpoints. The binary is cached
// in the user's cache directory under a hash of the source it was built
// from (every file of the module's cmd/ and pkg/, and go.mod and go.sum)
// and of tags, so only a change of either builds it again; a build of an
// earlier source state is removed then.
//
// The binary is static (CGO_ENABLED=0, as the Dockerfile builds the
// image's): besides this machine, it runs in the csi-node image, whose
// Debian C library may be older than the one a cgo build would link
// against.
func Build(root, tags string) (string, []Failpoint, error) {
	key, err := sourceHash(root)
	if err != nil {
		return "", nil, err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", nil, err
	}
	// "static" keeps a cgo build of the same source, which earlier
	// versions of this cache held, from being taken for this one.
	dir := filepath.Join(cache, "converge", "failpoints", key+"-"+tags+"-static")
	bin := filepath.Join(dir, "csi-node")
	overlay, fps, err := rewrite(root, filepath.Join(dir, "overlay"))
	if err != nil {
		return "", nil, err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, fps, nil
	}
	// Earlier source states' binaries are of no more use.
	old, _ := filepath.Glob(filepath.Join(cache, "converge", "failpoints", "*"))
	for _, o := range old {
		if o != dir {
			os.RemoveAll(o)
		}
	}
	tmp := bin + fmt.Sprintf(".%d", os.Getpid())
	cmd := exec.Command("go", "build", "-tags", tags, "-overlay", overlay, "-o", tmp, "./cmd/csi-node")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("building csi-node with failpoints: %v\n%s", err, out)
	}
	return bin, fps, os.Rename(tmp, bin)
}

// sourceHash hashes what the csi-node binary is built from.
func sourceHash(root string) (string, error) {
	h := sha256.New()
	files := []string{"go.mod", "go.sum"}
	for _, d := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

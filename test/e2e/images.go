package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The images the cluster runs. No registry is reachable, so both are built
// here and imported into containerd; pods use imagePullPolicy Never.
const (
	pauseImage   = "converge.local/pause:e2e"
	busyboxImage = "converge.local/busybox:e2e"
)

// layerFile is one entry of an image layer.
type layerFile struct {
	name    string // path inside the image, without a leading slash
	mode    int64
	data    []byte
	symlink string // target, for a symbolic link
	dir     bool
}

// buildImages writes OCI archives of the pause and busybox images into dir
// and imports them into containerd's k8s.io namespace.
func buildImages(dir, containerdSock string) error {
	pause := filepath.Join(dir, "pause")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", pause, "./images/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build pause: %v: %s", err, out)
	}
	bin, err := os.ReadFile(pause)
	if err != nil {
		return err
	}
	pauseArchive := filepath.Join(dir, "pause.tar")
	if err := writeOCIArchive(pauseArchive, pauseImage, []layerFile{{name: "pause", mode: 0o755, data: bin}},
		map[string]any{"Entrypoint": []string{"/pause"}}); err != nil {
		return err
	}

	// busybox-static with a link per applet, as the busybox image has.
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox-static is not installed: %w", err)
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	files := []layerFile{{name: "bin", dir: true}, {name: "tmp", dir: true}, {name: "data", dir: true},
		{name: "bin/busybox", mode: 0o755, data: data}}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" && !strings.Contains(applet, "/") {
			files = append(files, layerFile{name: "bin/" + applet, symlink: "busybox"})
		}
	}
	bbArchive := filepath.Join(dir, "busybox.tar")
	if err := writeOCIArchive(bbArchive, busyboxImage, files,
		map[string]any{"Cmd": []string{"sh"}, "Env": []string{"PATH=/bin"}}); err != nil {
		return err
	}
	for _, a := range []string{pauseArchive, bbArchive} {
		out, err := exec.Command("ctr", "--address", containerdSock, "-n", "k8s.io", "images", "import", a).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v: %s", a, err, out)
		}
	}
	return nil
}

// writeOCIArchive writes a one-layer image as an OCI image-layout tar that
// "ctr images import" accepts, named by the io.containerd.image.name
// annotation.
func writeOCIArchive(path, ref string, files []layerFile, config map[string]any) error {
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
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerDesc := descriptor("application/vnd.oci.image.layer.v1.tar", layer.Bytes())
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       config,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc["digest"].(string)}},
	})
	cfgDesc := descriptor("application/vnd.oci.image.config.v1+json", cfg)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        cfgDesc,
		"layers":        []any{layerDesc},
	})
	manDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	manDesc["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
	manDesc["annotations"] = map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": ref[strings.LastIndex(ref, ":")+1:],
	}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{manDesc}})

	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	aw := tar.NewWriter(out)
	add := func(name string, data []byte) error {
		if err := aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := aw.Write(data)
		return err
	}
	blobs := map[string][]byte{
		layerDesc["digest"].(string): layer.Bytes(),
		cfgDesc["digest"].(string):   cfg,
		manDesc["digest"].(string):   manifest,
	}
	for digest, data := range blobs {
		if err := add("blobs/sha256/"+strings.TrimPrefix(digest, "sha256:"), data); err != nil {
			return err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	return aw.Close()
}

func descriptor(mediaType string, data []byte) map[string]any {
	sum := sha256.Sum256(data)
	return map[string]any{"mediaType": mediaType, "digest": "sha256:" + hex.EncodeToString(sum[:]), "size": len(data)}
}

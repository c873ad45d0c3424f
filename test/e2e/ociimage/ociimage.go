// Package ociimage writes container images as OCI image-layout archives,
// which containerd imports (ctr images import) and registry clients push
// (crane push of the unpacked layout), and makes the Debian root of
// csi-node's image as the Dockerfile's final stage makes it (root.go).
// The e2e run builds its images with it, and the release (package dist)
// builds the image it ships.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/converge-csi/converge/test/dockerfile"
)

// File is one entry of an image layer.
type File struct {
	Name    string // path inside the image, without a leading slash
	Mode    int64
	Data    []byte
	Symlink string // target, for a symbolic link
	Dir     bool
}

// epoch is every entry's time: the same files make the same layer.
var epoch = time.Unix(0, 0)

// Layer writes files, in their order, as an uncompressed layer tar.
func Layer(files []File) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(f.Data))}
		switch {
		case f.Dir:
			h.Typeflag, h.Mode, h.Size, h.Name = tar.TypeDir, 0o755, 0, f.Name+"/"
		case f.Symlink != "":
			h.Typeflag, h.Linkname, h.Mode, h.Size = tar.TypeSymlink, f.Symlink, 0o777, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return layer.Bytes(), nil
}

// Image is one platform's image of an archive.
type Image struct {
	Ref      string // name:tag, what containerd names it on import
	Platform dockerfile.Platform
	Layers   [][]byte       // uncompressed tars, the lowest first
	Config   map[string]any // the image config's "config" (Entrypoint, Env, Labels)
}

// WriteArchive writes images as one OCI image-layout tar at path, the
// index holding one manifest per image, in their order. With compress,
// each layer is stored gzipped (what a registry serves; a release's
// archive is a third the size), otherwise as it is (what containerd
// imports fastest). The same images make the same bytes.
func WriteArchive(path string, compress bool, images ...Image) error {
	blobs := map[string][]byte{}
	var manifests []any
	for _, im := range images {
		var layerDescs []any
		var diffIDs []string
		for _, layer := range im.Layers {
			diffIDs = append(diffIDs, digest(layer))
			mediaType, blob := "application/vnd.oci.image.layer.v1.tar", layer
			if compress {
				var z bytes.Buffer
				zw := gzip.NewWriter(&z)
				if _, err := zw.Write(layer); err != nil {
					return err
				}
				if err := zw.Close(); err != nil {
					return err
				}
				mediaType, blob = mediaType+"+gzip", z.Bytes()
			}
			layerDescs = append(layerDescs, descriptor(mediaType, blob))
			blobs[digest(blob)] = blob
		}
		cfg, err := json.Marshal(map[string]any{
			"architecture": im.Platform.Arch,
			"os":           im.Platform.OS,
			"config":       im.Config,
			"rootfs":       map[string]any{"type": "layers", "diff_ids": diffIDs},
		})
		if err != nil {
			return err
		}
		manifest, err := json.Marshal(map[string]any{
			"schemaVersion": 2,
			"mediaType":     "application/vnd.oci.image.manifest.v1+json",
			"config":        descriptor("application/vnd.oci.image.config.v1+json", cfg),
			"layers":        layerDescs,
		})
		if err != nil {
			return err
		}
		blobs[digest(cfg)], blobs[digest(manifest)] = cfg, manifest
		tag := im.Ref[strings.LastIndex(im.Ref, ":")+1:]
		if tag == im.Ref || strings.Contains(tag, "/") {
			return fmt.Errorf("image %q has no tag", im.Ref)
		}
		desc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
		desc["platform"] = map[string]string{"architecture": im.Platform.Arch, "os": im.Platform.OS}
		desc["annotations"] = map[string]string{
			"io.containerd.image.name":          im.Ref,
			"org.opencontainers.image.ref.name": tag,
		}
		manifests = append(manifests, desc)
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests})
	if err != nil {
		return err
	}

	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	aw := tar.NewWriter(out)
	add := func(name string, data []byte, dir bool) error {
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}
		if dir {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := aw.WriteHeader(h); err != nil {
			return err
		}
		_, err := aw.Write(data)
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := add(d, nil, true); err != nil {
			return err
		}
	}
	for _, d := range slices.Sorted(maps.Keys(blobs)) {
		if err := add("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d], false); err != nil {
			return err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`), false); err != nil {
		return err
	}
	if err := add("index.json", index, false); err != nil {
		return err
	}
	if err := aw.Close(); err != nil {
		return err
	}
	return out.Close()
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func descriptor(mediaType string, data []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(data), "size": len(data)}
}

package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/converge-csi/converge/test/dockerfile"
)

// readArchive returns an archive's files by name.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

// An archive is an OCI layout whose index names each image with its
// platform and reference, whose compressed layers unpack to the layers
// given, whose config's diff_ids are the uncompressed layers' digests;
// the same images write the same bytes.
func TestWriteArchive(t *testing.T) {
	layer, err := Layer([]File{{Name: "bin", Dir: true}, {Name: "bin/x", Mode: 0o755, Data: []byte("x")}, {Name: "bin/y", Symlink: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	arm := dockerfile.Platform{OS: "linux", Arch: "arm64"}
	im := Image{Ref: "example.org/a/b:v1", Platform: arm, Layers: [][]byte{layer}, Config: map[string]any{"Entrypoint": []string{"/bin/x"}}}
	dir := t.TempDir()
	one, two := filepath.Join(dir, "1.tar"), filepath.Join(dir, "2.tar")
	for _, p := range []string{one, two} {
		if err := WriteArchive(p, true, im); err != nil {
			t.Fatal(err)
		}
	}
	a, b := readArchive(t, one), readArchive(t, two)
	if len(a) != len(b) {
		t.Fatalf("two writes differ: %d and %d files", len(a), len(b))
	}
	for name, data := range a {
		if !bytes.Equal(data, b[name]) {
			t.Errorf("two writes differ in %s", name)
		}
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Platform    map[string]string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(a["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("%d manifests, want 1", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.Platform["architecture"] != "arm64" || m.Platform["os"] != "linux" ||
		m.Annotations["io.containerd.image.name"] != im.Ref || m.Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Errorf("index entry %+v", m)
	}
	blob := func(d string) []byte {
		b, ok := a["blobs/sha256/"+d[len("sha256:"):]]
		if !ok {
			t.Fatalf("no blob %s", d)
		}
		if digest(b) != d {
			t.Fatalf("blob %s holds %s", d, digest(b))
		}
		return b
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ MediaType, Digest string }
	}
	if err := json.Unmarshal(blob(m.Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	var config struct {
		Architecture string
		Rootfs       struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if config.Architecture != "arm64" || len(config.Rootfs.DiffIDs) != 1 || config.Rootfs.DiffIDs[0] != digest(layer) {
		t.Errorf("config %+v, want arm64 and the layer's digest %s", config, digest(layer))
	}
	if len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Fatalf("layers %+v, want one gzipped", manifest.Layers)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(manifest.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(zr); err != nil || !bytes.Equal(got, layer) {
		t.Errorf("the gzipped layer unpacks to %d bytes (%v), not the layer's %d", len(got), err, len(layer))
	}
	if err := WriteArchive(filepath.Join(dir, "3.tar"), false, Image{Ref: "example.org/untagged", Platform: arm}); err == nil {
		t.Error("an image without a tag was written")
	}
}

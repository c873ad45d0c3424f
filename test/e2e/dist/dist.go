// Package dist makes the files of a converge release: for each platform,
// csi-node's image (which holds converge-controller too) as an OCI
// archive and an SBOM of each of its binaries; the packaged chart; and
// SHA256SUMS over them all. make release runs it (cmd/converge-release),
// the release workflow (.github/workflows/release.yml) publishes what it
// makes, and the e2e run installs a release from its files
// (TestHelmChart). It lives in the e2e module, the only one that may
// import the Helm SDK, which packages the chart.
package dist

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"

	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/ociimage"
)

// SBOMTool is the generator of the binaries' SBOMs (CycloneDX JSON from
// the module information Go writes into each binary), run by version
// through the Go module proxy.
const SBOMTool = "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0"

// Sums is the name of the checksum file, in sha256sum's format.
const Sums = "SHA256SUMS"

// versionRE is a release's version, which names its files.
var versionRE = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// Options says what to make.
type Options struct {
	Repo      string // the repository's root
	Out       string // the release's directory: made, and must not exist or be empty
	CacheDir  string // where the images' Debian roots are cached (ociimage.DebianRoot)
	Platforms []dockerfile.Platform
}

// Release is what Build made.
type Release struct {
	Version  string            // the tag: the chart's appVersion, the image's tag
	ImageRef string            // the image's name and tag, as the chart and deploy/ name it
	Images   map[string]string // platform (linux/amd64) to its archive's path
	Chart    string            // the packaged chart's path
	Files    []string          // every file's name, SHA256SUMS last
	Built    bool              // an image root was built cold
}

// Build makes the release of the source tree o.Repo into o.Out. Its
// version is the one the chart, deploy/ and the Dockerfile say
// (TestVersionsAgree holds them equal; docs/releasing.md sets it before
// the tag), and its image is named as the chart's values name it, so
// that the packaged chart and deploy/ install it unchanged.
func Build(ctx context.Context, o Options) (*Release, error) {
	if len(o.Platforms) == 0 {
		return nil, fmt.Errorf("no platform to build")
	}
	for _, p := range o.Platforms {
		if err := ociimage.CanBuild(p); err != nil {
			return nil, err
		}
	}
	ch, err := loader.LoadDir(filepath.Join(o.Repo, "charts", "converge"))
	if err != nil {
		return nil, fmt.Errorf("the chart: %w", err)
	}
	version := ch.Metadata.AppVersion
	image, _ := ch.Values["csiNode"].(map[string]any)["image"].(map[string]any)
	repository, _ := image["repository"].(string)
	if !versionRE.MatchString(version) || repository == "" {
		return nil, fmt.Errorf("the chart's appVersion %q is not vMAJOR.MINOR.PATCH[-pre-release], or it names no csiNode.image.repository (%q)", version, repository)
	}
	if entries, err := os.ReadDir(o.Out); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s is not empty: a release is made into a directory of its own", o.Out)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "converge-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	r := &Release{Version: version, ImageRef: repository + ":" + version, Images: map[string]string{}}
	for _, p := range o.Platforms {
		im, bins, built, err := Image(ctx, o.Repo, o.CacheDir, work, r.ImageRef, version, p)
		r.Built = r.Built || built
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		suffix := "_" + version + "_" + p.OS + "_" + p.Arch
		archive := "csi-node" + suffix + ".oci.tar"
		if err := ociimage.WriteArchive(filepath.Join(o.Out, archive), true, im); err != nil {
			return nil, err
		}
		r.Images[p.String()] = filepath.Join(o.Out, archive)
		r.Files = append(r.Files, archive)
		for _, bin := range bins {
			name := strings.TrimSuffix(filepath.Base(bin), "-"+p.OS+"-"+p.Arch) + suffix + ".cdx.json"
			if err := sbom(ctx, bin, version, filepath.Join(o.Out, name)); err != nil {
				return nil, err
			}
			r.Files = append(r.Files, name)
		}
	}
	if r.Chart, err = chartutil.Save(ch, o.Out); err != nil {
		return nil, fmt.Errorf("packaging the chart: %w", err)
	}
	r.Files = append(r.Files, filepath.Base(r.Chart))
	slices.Sort(r.Files)
	if err := writeSums(o.Out, r.Files); err != nil {
		return nil, err
	}
	r.Files = append(r.Files, Sums)
	return r, nil
}

// sbom writes the CycloneDX SBOM of the Go binary bin: its modules and
// the standard library, with their versions, as the binary records them.
// No serial number nor timestamp: the same binary gives the same SBOM.
func sbom(ctx context.Context, bin, version, out string) error {
	cmd := exec.CommandContext(ctx, "go", "run", SBOMTool, "bin", "-json", "-std", "-noserial", "-notimestamp",
		"-version", version, "-output", out, bin)
	cmd.Dir = filepath.Dir(bin) // outside any module: go run pkg@version
	env, err := CacheFirst(ctx)
	if err != nil {
		return err
	}
	cmd.Env = append(os.Environ(), env)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the SBOM of %s (go run %s): %v\n%s", filepath.Base(bin), SBOMTool, err, b)
	}
	return nil
}

// writeSums writes dir's Sums over files, as sha256sum writes it, so that
// sha256sum -c checks it.
func writeSums(dir string, files []string) error {
	var b strings.Builder
	for _, name := range files {
		sum, err := fileSum(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, name)
	}
	return os.WriteFile(filepath.Join(dir, Sums), []byte(b.String()), 0o644)
}

// Verify checks every file dir's Sums names, as sha256sum -c does, and
// that it names at least one file.
func Verify(dir string) error {
	f, err := os.Open(filepath.Join(dir, Sums))
	if err != nil {
		return err
	}
	defer f.Close()
	n := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		want, name, ok := strings.Cut(s.Text(), "  ")
		if !ok || len(want) != 64 || name == "" || strings.ContainsAny(name, "/\\") || name == ".." {
			return fmt.Errorf("%s: %q is not a sha256sum line", Sums, s.Text())
		}
		got, err := fileSum(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s: sha256 %s, %s says %s", name, got, Sums, want)
		}
		n++
	}
	if err := s.Err(); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s names no file", Sums)
	}
	return nil
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// CacheFirst returns the GOPROXY setting under which go run pkg@version
// runs without the network once the module cache holds pkg: go run asks
// the proxy for the module's latest version (its deprecation) even when
// the pinned one is cached, so the cache goes first as a proxy, then
// GOPROXY's own ("|": after any error). make chart-docs and make vet do
// the same.
func CacheFirst(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE", "GOPROXY").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE GOPROXY: %w", err)
	}
	cache, proxy, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return "GOPROXY=file://" + cache + "/cache/download|" + proxy, nil
}

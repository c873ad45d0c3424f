package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
)

// sidecar is a kubernetes-csi sidecar release that deploy/ and the chart
// run and the suite builds from its own Go module (test/e2e/<module>,
// which pins the release and repeats its replace lines), then packs into
// an image under the very name deploy/ gives it, so that the run installs
// deploy/ without changing that sidecar's image. node-driver-registrar is
// not one: its module is refused by this machine's module proxy, so the
// run gives it a stand-in (package standin).
type sidecar struct {
	name    string // the image's last element, the container's and the binary's name
	version string // the release; the module's go.mod pins the same one
	module  string // test/e2e/<module>
	tools   string // the module's tools, for its build's stamp
	value   string // its key under the chart's sidecars value
}

// sidecarRepo is where deploy/ and the chart take the sidecars from.
const sidecarRepo = "registry.k8s.io/sig-storage/"

// sidecars are the releases the run builds. external-snapshotter's module
// also gives the cluster its snapshot-controller (snapshots.go).
var sidecars = []sidecar{
	{name: "csi-provisioner", version: "v6.4.0", module: "provisioner", tools: "csi-provisioner", value: "provisioner"},
	{name: "csi-resizer", version: "v2.3.0", module: "resizer", tools: "csi-resizer", value: "resizer"},
	{name: "csi-snapshotter", version: snapshotterVersion, module: "snapshotter", tools: "snapshot-controller, csi-snapshotter", value: "snapshotter"},
}

// image is the sidecar's image as deploy/ names it.
func (s sidecar) image() string { return sidecarRepo + s.name + ":" + s.version }

// sidecarNamed is the sidecar of sidecars whose image repository ref
// (with or without a tag) names, and whether there is one.
func sidecarNamed(ref string) (sidecar, bool) {
	repo, _, _ := strings.Cut(ref, ":")
	for _, s := range sidecars {
		if sidecarRepo+s.name == repo {
			return s, true
		}
	}
	return sidecar{}, false
}

// buildSidecars builds each release of sidecars into the user's cache
// directory, or finds it built there, and records where each binary is
// (sidecarBin).
func (c *cluster) buildSidecars(ctx context.Context) error {
	for _, s := range sidecars {
		// As the releases build them (release-tools' build.make): static,
		// their version in main.version, which --version prints.
		bin, err := c.buildTools(ctx, "external-"+s.module+"-"+s.version, s.module, s.tools, "-s -w -X main.version="+s.version, "CGO_ENABLED=0")
		if err != nil {
			return fmt.Errorf("%s %s: %w", s.name, s.version, err)
		}
		c.builtMu.Lock()
		if c.sidecarDirs == nil {
			c.sidecarDirs = map[string]string{}
		}
		c.sidecarDirs[s.name] = bin
		c.builtMu.Unlock()
	}
	return nil
}

// sidecarBin is the path of the named sidecar's binary, built by
// buildSidecars ("" before).
func (c *cluster) sidecarBin(name string) string {
	c.builtMu.Lock()
	defer c.builtMu.Unlock()
	if c.sidecarDirs[name] == "" {
		return ""
	}
	return filepath.Join(c.sidecarDirs[name], name)
}

// sidecarVersions names each sidecar's release, for the build's summary.
func sidecarVersions() string {
	var names []string
	for _, s := range sidecars {
		names = append(names, s.name+" "+s.version)
	}
	return strings.Join(names, ", ")
}

// resizerLeading is in the line external-resizer logs when it takes its
// Lease (client-go's leader election: "Successfully acquired lease").
const resizerLeading = "acquired lease"

package standin

import (
	"slices"
	"strings"
)

// Release is a kubernetes-csi sidecar release that deploy/ runs whose Go
// module this machine's module proxy refuses, so that the suite cannot
// build it, and the command-line flags that release defines: what deploy/
// passes it is checked against them instead (and its stand-in refuses any
// other flag). They were read from the release's source at its tag: the
// flags of its main package and of component-base v0.36.1's logging
// options (logsapi.AddGoFlags, JSON format registered). The sidecars
// whose modules are served are built from their releases and run
// (../sidecars.go).
type Release struct {
	Image   string // registry.k8s.io/sig-storage/<name>
	Version string
	Flags   []string
}

// loggingFlags are component-base v0.36.1's logsapi.AddGoFlags with the
// JSON format registered.
var loggingFlags = []string{"logging-format", "log-flush-frequency", "v", "vmodule", "log-text-split-stream",
	"log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"}

// Releases are those releases deploy/ names: node-driver-registrar alone.
var Releases = []Release{
	{Image: "registry.k8s.io/sig-storage/csi-node-driver-registrar", Version: "v2.17.0", Flags: concat(loggingFlags,
		[]string{"automaxprocs", "connection-timeout", "csi-address", "enable-pprof", "health-port", "http-endpoint",
			"kubelet-registration-path", "mode", "plugin-registration-path", "timeout", "version"})},
}

func concat(lists ...[]string) []string { return slices.Concat(lists...) }

// ReleaseOf returns the release of an image reference that names one of
// Releases' images, and whether it does.
func ReleaseOf(ref string) (Release, bool) {
	name, _, _ := strings.Cut(ref, ":")
	for _, s := range Releases {
		if s.Image == name {
			return s, true
		}
	}
	return Release{}, false
}

// UnknownArgs returns the arguments of args whose flag the release does
// not define, and those that are not flags at all.
func (s Release) UnknownArgs(args []string) []string {
	var out []string
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			name, ok = strings.CutPrefix(a, "-")
		}
		name, _, _ = strings.Cut(name, "=")
		if !ok || !slices.Contains(s.Flags, name) {
			out = append(out, a)
		}
	}
	return out
}

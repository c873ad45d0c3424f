package standin

import (
	"slices"
	"strings"
)

// Release is a kubernetes-csi sidecar release that deploy/ runs, and the
// command-line flags that release defines. Their modules are not served
// here, so the suite cannot build them; what deploy/ passes them is checked
// against these sets instead (and a stand-in refuses any other flag), which were read from each release's source
// at its tag: the flags of its main package, of csi-lib-utils v0.24.0's
// standardflags where it registers them (RegisterCommonFlags,
// AddAutomaxprocs), and of component-base v0.36.1's logging options
// (logsapi.AddGoFlags, JSON format registered). csi-snapshotter is not
// here: the suite builds its release and runs it (../snapshots.go).
type Release struct {
	Image   string // registry.k8s.io/sig-storage/<name>
	Version string
	Flags   []string
}

// standardFlags are csi-lib-utils v0.24.0's RegisterCommonFlags.
var standardFlags = []string{"csi-address", "http-endpoint", "kube-api-burst", "kube-api-qps", "kubeconfig",
	"leader-election", "leader-election-labels", "leader-election-lease-duration", "leader-election-namespace",
	"leader-election-renew-deadline", "leader-election-retry-period", "metrics-address", "metrics-path", "version"}

// loggingFlags are component-base v0.36.1's logsapi.AddGoFlags with the
// JSON format registered.
var loggingFlags = []string{"logging-format", "log-flush-frequency", "v", "vmodule", "log-text-split-stream",
	"log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"}

// Releases are the releases deploy/ names.
var Releases = []Release{
	{Image: "registry.k8s.io/sig-storage/csi-node-driver-registrar", Version: "v2.17.0", Flags: concat(loggingFlags,
		[]string{"automaxprocs", "connection-timeout", "csi-address", "enable-pprof", "health-port", "http-endpoint",
			"kubelet-registration-path", "mode", "plugin-registration-path", "timeout", "version"})},
	{Image: "registry.k8s.io/sig-storage/csi-provisioner", Version: "v6.3.0", Flags: concat(loggingFlags, standardFlags,
		[]string{"automaxprocs", "capacity-for-immediate-binding", "capacity-ownerref-level", "capacity-poll-interval",
			"capacity-threads", "cloning-protection-threads", "controller-publish-readonly", "default-fstype", "enable-capacity",
			"enable-pprof", "extra-create-metadata", "feature-gates", "immediate-topology", "kube-api-capacity-burst",
			"kube-api-capacity-qps", "master", "node-deployment", "node-deployment-base-delay", "node-deployment-immediate-binding",
			"node-deployment-max-delay", "prevent-volume-mode-conversion", "retry-interval-max", "retry-interval-start",
			"snapshot-orphan-sweep-interval", "strict-topology", "timeout", "volume-name-prefix", "volume-name-uuid-length",
			"worker-threads"})},
	{Image: "registry.k8s.io/sig-storage/csi-resizer", Version: "v2.2.1", Flags: concat(loggingFlags, standardFlags,
		[]string{"automaxprocs", "extra-modify-metadata", "feature-gates", "handle-volume-inuse-error", "master",
			"resync-period", "retry-interval-max", "retry-interval-start", "timeout", "workers"})},
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

package e2e

import (
	"slices"
	"strings"
)

// sidecar is a kubernetes-csi sidecar release that deploy/ runs, and the
// command-line flags that release defines. Their modules are not served
// here, so the suite cannot build them; what deploy/ passes them is checked
// against these sets instead, which were read from each release's source
// at its tag: the flags of its main package, of csi-lib-utils v0.24.0's
// standardflags where it registers them (RegisterCommonFlags,
// AddAutomaxprocs), and of component-base v0.36.1's logging options
// (logsapi.AddGoFlags, JSON format registered). csi-snapshotter is not
// here: the suite builds its release and runs it (snapshots.go).
type sidecar struct {
	image   string // registry.k8s.io/sig-storage/<name>
	version string
	flags   []string
}

// standardFlags are csi-lib-utils v0.24.0's RegisterCommonFlags.
var standardFlags = []string{"csi-address", "http-endpoint", "kube-api-burst", "kube-api-qps", "kubeconfig",
	"leader-election", "leader-election-labels", "leader-election-lease-duration", "leader-election-namespace",
	"leader-election-renew-deadline", "leader-election-retry-period", "metrics-address", "metrics-path", "version"}

// loggingFlags are component-base v0.36.1's logsapi.AddGoFlags with the
// JSON format registered.
var loggingFlags = []string{"logging-format", "log-flush-frequency", "v", "vmodule", "log-text-split-stream",
	"log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"}

// sidecars are the releases deploy/ names.
var sidecars = []sidecar{
	{image: "registry.k8s.io/sig-storage/csi-node-driver-registrar", version: "v2.17.0", flags: concat(loggingFlags,
		[]string{"automaxprocs", "connection-timeout", "csi-address", "enable-pprof", "health-port", "http-endpoint",
			"kubelet-registration-path", "mode", "plugin-registration-path", "timeout", "version"})},
	{image: "registry.k8s.io/sig-storage/livenessprobe", version: "v2.19.0", flags: concat(loggingFlags,
		[]string{"automaxprocs", "csi-address", "health-port", "http-endpoint", "metrics-address", "metrics-path", "probe-timeout"})},
	{image: "registry.k8s.io/sig-storage/csi-provisioner", version: "v6.3.0", flags: concat(loggingFlags, standardFlags,
		[]string{"automaxprocs", "capacity-for-immediate-binding", "capacity-ownerref-level", "capacity-poll-interval",
			"capacity-threads", "cloning-protection-threads", "controller-publish-readonly", "default-fstype", "enable-capacity",
			"enable-pprof", "extra-create-metadata", "feature-gates", "immediate-topology", "kube-api-capacity-burst",
			"kube-api-capacity-qps", "master", "node-deployment", "node-deployment-base-delay", "node-deployment-immediate-binding",
			"node-deployment-max-delay", "prevent-volume-mode-conversion", "retry-interval-max", "retry-interval-start",
			"snapshot-orphan-sweep-interval", "strict-topology", "timeout", "volume-name-prefix", "volume-name-uuid-length",
			"worker-threads"})},
	{image: "registry.k8s.io/sig-storage/csi-resizer", version: "v2.2.1", flags: concat(loggingFlags, standardFlags,
		[]string{"automaxprocs", "extra-modify-metadata", "feature-gates", "handle-volume-inuse-error", "master",
			"resync-period", "retry-interval-max", "retry-interval-start", "timeout", "workers"})},
}

func concat(lists ...[]string) []string { return slices.Concat(lists...) }

// sidecarOf returns the release of an image reference that names one of
// sidecars' images, and whether it does.
func sidecarOf(ref string) (sidecar, bool) {
	name, _, _ := strings.Cut(ref, ":")
	for _, s := range sidecars {
		if s.image == name {
			return s, true
		}
	}
	return sidecar{}, false
}

// unknownArgs returns the arguments of args whose flag the release does
// not define, and those that are not flags at all.
func (s sidecar) unknownArgs(args []string) []string {
	var out []string
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			name, ok = strings.CutPrefix(a, "-")
		}
		name, _, _ = strings.Cut(name, "=")
		if !ok || !slices.Contains(s.flags, name) {
			out = append(out, a)
		}
	}
	return out
}

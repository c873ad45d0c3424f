package driver

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Feature names a part of CSI that is alpha in the spec version that
// defines it. csi-node implements each one but advertises and serves it
// only when --feature-gates turns it on: a peer built on an older spec
// cannot render an enum value it does not know (csi-lib-utils'
// protosanitizer, which every sidecar logs replies with, dereferences nil
// on one), and an alpha part may change or go in the next spec release.
type Feature string

// The features of --feature-gates. Each is off by default but ModifyVolume
// (onByDefault).
const (
	// VolumeHealth advertises the node capability GET_VOLUME_HEALTH (7) of
	// CSI v1.13 and serves NodeGetVolumeHealth. Off, that RPC answers
	// UNIMPLEMENTED. What the Kubernetes v1.37 kubelet (built on a CSI
	// v1.12.1 pre-release that has it) calls, with its CSIVolumeHealth gate
	// on, to write a volume's health into the pod's status. Peers: every
	// client of NodeGetCapabilities built on that pre-release or later.
	VolumeHealth Feature = "VolumeHealth"
	// VolumeCondition advertises the node capability VOLUME_CONDITION (4)
	// of CSI v1.3 to v1.12, removed in v1.13, and answers NodeGetVolumeStats
	// with the volume's condition (its field 2 of those versions): what
	// kubelets up to v1.36 read, with their CSIVolumeHealth gate on, to
	// raise a VolumeConditionAbnormal event on the pod (v1.37 reads
	// VolumeHealth instead and ignores it). Peers: every client that
	// calls NodeGetCapabilities must be built on CSI v1.12 or older (the
	// kubelet is; csi-sanity v5.6 is not).
	VolumeCondition Feature = "VolumeCondition"
	// SnapshotAccessibility advertises the plugin capability
	// SNAPSHOT_ACCESSIBILITY_CONSTRAINTS (5) of CSI v1.13 and names this
	// node in every Snapshot's accessible_topology (KEP-5943), which the
	// spec forbids without the capability. Peers: every client of
	// GetPluginCapabilities (the provisioner, the snapshotter, the
	// resizer) built on CSI v1.13 or later.
	SnapshotAccessibility Feature = "SnapshotAccessibility"
	// ModifyVolume advertises the controller capability MODIFY_VOLUME
	// and serves ControllerModifyVolume: the IO limits of a claim's
	// VolumeAttributesClass (docs/volumes.md, IO limits). It is no alpha
	// part of CSI, and is on by default: csi-provisioner refuses to
	// provision a claim that names a VolumeAttributesClass for a driver
	// without the capability. The cluster's one csi-resizer asks its own
	// node's csi-node, which answers OK for a volume of another node once
	// the class passes; the node agent beside every csi-node
	// (pkg/classagent) hands that volume its class on its own node. Off,
	// ControllerModifyVolume answers UNIMPLEMENTED, and the node agent
	// hands nothing.
	ModifyVolume Feature = "ModifyVolume"
)

// features lists every Feature, in the order help and errors name them.
var features = []Feature{ModifyVolume, SnapshotAccessibility, VolumeCondition, VolumeHealth}

// onByDefault are the features on unless --feature-gates turns them off.
var onByDefault = map[Feature]bool{ModifyVolume: true}

// FeatureGates is the features --feature-gates sets; the zero value
// leaves each at its default.
// As a flag.Value it parses the sidecars' syntax, "Name=true,Other=false",
// and a repeated flag adds to what came before.
type FeatureGates map[Feature]bool

// Enabled reports whether f is on: as set, or by default.
func (g FeatureGates) Enabled(f Feature) bool {
	if on, ok := g[f]; ok {
		return on
	}
	return onByDefault[f]
}

// String lists the gates set, sorted: "VolumeHealth=true".
func (g FeatureGates) String() string {
	var s []string
	for _, f := range features {
		if v, ok := g[f]; ok {
			s = append(s, fmt.Sprintf("%s=%t", f, v))
		}
	}
	return strings.Join(s, ",")
}

// Set parses "Name=bool" pairs separated by commas. An unknown name or a
// value that is not a boolean is an error naming it; nothing of a value
// with an error is applied.
func (g *FeatureGates) Set(value string) error {
	parsed := map[Feature]bool{}
	for _, pair := range strings.Split(value, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, val, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("%q is not Name=true or Name=false", pair)
		}
		f := Feature(strings.TrimSpace(name))
		if !slices.Contains(features, f) {
			return fmt.Errorf("unknown feature %q (known: %s)", f, FeatureNames())
		}
		on, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("feature %s: %q is not a boolean", f, val)
		}
		parsed[f] = on
	}
	if *g == nil {
		*g = FeatureGates{}
	}
	for f, on := range parsed {
		(*g)[f] = on
	}
	return nil
}

// FeatureNames lists every feature's name, for help.
func FeatureNames() string {
	names := make([]string, len(features))
	for i, f := range features {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

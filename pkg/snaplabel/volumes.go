package snaplabel

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/nodeloss"
)

// This file decides which PersistentVolume answers for a volume handle,
// and when none may. A group snapshot is routed by its volumes' nodes, read
// from their PVs; PVs are objects anyone who may create them can make, with
// any handle and any node affinity. Someone holding one node could make a
// PV pinned to that node that carries another node's volume handle and so
// draw a tenant's group snapshot to it. The labeller therefore trusts a
// handle only when exactly one PV carries it and that PV's affinity does
// not contradict the node the handle names.

// ambiguityAdvice ends the event of a group left unlabelled for an
// ambiguous member: what happened and what the operator does.
const ambiguityAdvice = "A PersistentVolume that carries another node's volume handle could draw this group snapshot to its own node, " +
	"so the content is not labelled and no node's csi-snapshotter takes it. Delete or correct the PersistentVolume that is not the volume's own " +
	"(the one its claim's provisioning did not make); the next pass then labels the content"

// IndexVolumes indexes the driver's PersistentVolumes by their CSI volume
// handle, keeping every PV that carries a handle (by name, so that a
// pass's messages do not change with the cache's order). PVs of other
// drivers and PVs that are not CSI volumes are left out; no PVs give an
// empty index.
func IndexVolumes(driver string, pvs []*corev1.PersistentVolume) map[string][]*corev1.PersistentVolume {
	out := map[string][]*corev1.PersistentVolume{}
	for _, pv := range pvs {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver {
			h := pv.Spec.CSI.VolumeHandle
			out[h] = append(out[h], pv)
		}
	}
	for _, list := range out {
		sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	}
	return out
}

// volume is what a pass makes of one volume handle.
type volume struct {
	// pv is the one PV that carries the handle; nil for none or several.
	pv *corev1.PersistentVolume
	// node is the volume's node: its PV's by the strict affinity rule,
	// else the handle's suffix; "" for none, and while ambiguous.
	node string
	// ambiguous says why the handle names no node the labeller may
	// trust; "" when it does.
	ambiguous string
}

// volume decides the driver's volume with handle. Several PVs carrying it
// make it ambiguous: the cache holds no sign of which is the volume's own,
// and taking either would let the other's maker choose. So does one PV
// pinned to a node other than the existing node its handle names, as a
// converge volume lives on the node its ID ends with. A suffix that names
// no existing node is not taken as a node: a volume made before IDs named
// their node has its name as its ID, and that name may hold the separator
// (contract.NodeOfID), so its PV's affinity decides.
func (w World) volume(handle string) volume {
	pvs := w.Volumes[handle]
	if len(pvs) > 1 {
		var each []string
		for _, pv := range pvs {
			each = append(each, fmt.Sprintf("%s (%s)", pv.Name, w.pinning(pv)))
		}
		return volume{ambiguous: fmt.Sprintf("Volume handle %q is carried by %d PersistentVolumes: %s.", handle, len(pvs), strings.Join(each, ", "))}
	}
	v := volume{node: contract.NodeOfID(handle)}
	if len(pvs) == 0 {
		return v
	}
	v.pv = pvs[0]
	pinned := nodeloss.PinnedNode(v.pv, w.TopologyKey)
	if pinned == "" {
		return v
	}
	if named := v.node; named != "" && named != pinned && w.Nodes[named] != nil {
		return volume{pv: v.pv, ambiguous: fmt.Sprintf(
			"PersistentVolume %s carries volume handle %q, which names node %s, but its node affinity (%s) pins it to node %s.",
			v.pv.Name, handle, named, w.TopologyKey, pinned)}
	}
	v.node = pinned
	return v
}

// pinning says for an operator where pv is pinned.
func (w World) pinning(pv *corev1.PersistentVolume) string {
	if n := nodeloss.PinnedNode(pv, w.TopologyKey); n != "" {
		return "pinned to node " + n
	}
	return "not pinned to one node by " + w.TopologyKey
}

// volumeName names a volume for an operator: its claim, else its PV, else
// (no PV, or several) its handle.
func (w World) volumeName(handle string) string {
	pvs := w.Volumes[handle]
	switch {
	case len(pvs) != 1:
		return fmt.Sprintf("volume %q", handle)
	case pvs[0].Spec.ClaimRef != nil:
		return "claim " + pvs[0].Spec.ClaimRef.Namespace + "/" + pvs[0].Spec.ClaimRef.Name
	}
	return "PersistentVolume " + pvs[0].Name
}

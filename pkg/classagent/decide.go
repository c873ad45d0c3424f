package classagent

import (
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/nodeloss"
)

// Hand is one call the agent makes: the whole of the IO limits the
// volume's claim asks for, for the volume's handle.
type Hand struct {
	VolumeID string
	// Class is the class the claim names; "" for none.
	Class string
	// Params are the class's parameters with every IO limit key it
	// leaves out given as contract.NoLimit; every key NoLimit for no
	// class (wholeLimits).
	Params map[string]string
}

// Scope is whose volumes an agent hands classes to.
type Scope struct {
	Driver, Node, TopologyKey string
}

// Mine says whether pv is one of the scope's node's volumes of its driver:
// pinned to the node by the strict rule the node-loss watcher acts by,
// its handle naming the node or no node.
func (s Scope) Mine(pv *corev1.PersistentVolume) bool {
	if pv == nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != s.Driver {
		return false
	}
	if nodeloss.PinnedNode(pv, s.TopologyKey) != s.Node {
		return false
	}
	n := contract.NodeOfID(pv.Spec.CSI.VolumeHandle)
	return n == "" || n == s.Node
}

// Decide returns the call to make for pv, given its claim and the class
// the claim's spec names (nil when not found), or why there is none. The
// class is the one the claim's owner asks for, which only the owner
// writes: a PV's class and a claim's status, which the resizer writes
// with a node's credentials, are never read, so that no node can hold a
// volume to a class its owner left, or keep it from the one it asks for.
//
// The call holds the volume to that class alone: csi-node merges what it
// is given into the limits it recorded (a key absent changes nothing, as
// CSI says), so the keys the class leaves out are given as no limit, and
// a claim of no class gets every key as no limit. Else a switch from a
// class of one key to a class of another would keep both limits, a claim
// gone back to no class (which the API allows while its switch is
// pending) would keep its old class's for good, and a csi-node that lost
// its record would get back only the keys the class names.
//
// A claim of no class is handed that on every volume of the node, not
// only on those whose PV or claim status shows a class: those fields are
// written with a node's credentials, and a stolen node that cleared them
// would keep a volume to limits its owner lifted. The cost is one local
// call per volume per resync (1000 volumes: 1000 calls per ten minutes),
// which the volumes of a class make already: csi-node answers a call that
// changes nothing from memory, writing nothing, and records nothing for a
// volume that never had a limit.
func (s Scope) Decide(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim, class *storagev1.VolumeAttributesClass) (Hand, string) {
	if !s.Mine(pv) {
		return Hand{}, "not a volume of this node"
	}
	ref := pv.Spec.ClaimRef
	switch {
	case ref == nil:
		return Hand{}, "the volume is bound to no claim"
	case claim == nil:
		return Hand{}, fmt.Sprintf("its claim %s/%s is not found", ref.Namespace, ref.Name)
	case claim.UID != ref.UID || claim.Spec.VolumeName != pv.Name:
		return Hand{}, fmt.Sprintf("claim %s/%s is not the one bound to it", claim.Namespace, claim.Name)
	}
	name := ClassOf(claim)
	switch {
	case name == "":
		return Hand{VolumeID: pv.Spec.CSI.VolumeHandle, Params: wholeLimits(nil)}, ""
	case class == nil:
		return Hand{}, fmt.Sprintf("class %q, which its claim %s/%s names, is not found", name, claim.Namespace, claim.Name)
	case class.DriverName != s.Driver:
		return Hand{}, fmt.Sprintf("class %q, which its claim %s/%s names, is of driver %q", name, claim.Namespace, claim.Name, class.DriverName)
	}
	return Hand{VolumeID: pv.Spec.CSI.VolumeHandle, Class: name, Params: wholeLimits(class.Parameters)}, ""
}

// wholeLimits returns a copy of a class's parameters (params, which the
// informer's cache holds and no one may change) with every IO limit key
// they leave out given as contract.NoLimit.
func wholeLimits(params map[string]string) map[string]string {
	out := maps.Clone(params)
	if out == nil {
		out = map[string]string{}
	}
	for _, key := range contract.MutableParameters() {
		if _, ok := out[key]; !ok {
			out[key] = contract.NoLimit
		}
	}
	return out
}

// ClassOf is the VolumeAttributesClass claim's spec names, "" for none.
func ClassOf(claim *corev1.PersistentVolumeClaim) string {
	return deref(claim.Spec.VolumeAttributesClassName)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

package classagent

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/nodeloss"
)

// Hand is one call the agent makes: the class's parameters, for the
// volume's handle.
type Hand struct {
	VolumeID string
	Class    string
	Params   map[string]string
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

// Decide returns the call to make for pv, given its claim and its class
// (nil when not found), or why there is none.
func (s Scope) Decide(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim, class *storagev1.VolumeAttributesClass) (Hand, string) {
	if !s.Mine(pv) {
		return Hand{}, "not a volume of this node"
	}
	name := deref(pv.Spec.VolumeAttributesClassName)
	if name == "" {
		return Hand{}, "the volume names no class"
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
	if want := deref(claim.Spec.VolumeAttributesClassName); want != name {
		return Hand{}, fmt.Sprintf("its claim %s/%s asks for class %q, the volume names %q: a modify is under way or was refused", claim.Namespace, claim.Name, want, name)
	}
	switch {
	case class == nil:
		return Hand{}, fmt.Sprintf("class %q is not found", name)
	case class.DriverName != s.Driver:
		return Hand{}, fmt.Sprintf("class %q is of driver %q", name, class.DriverName)
	}
	return Hand{VolumeID: pv.Spec.CSI.VolumeHandle, Class: name, Params: class.Parameters}, ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

package nodeloss

import (
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
)

// OutOfServiceTaint is the taint with which an operator says a node is
// shut down and will not come back as it was (non-graceful node shutdown).
const OutOfServiceTaint = "node.kubernetes.io/out-of-service"

// World is what one pass decides on: the cluster's objects as the
// controller's caches hold them, and since when each node that a volume
// names has been absent.
type World struct {
	Now time.Time
	// Grace is how long a node's object must be absent before the node
	// is taken for gone.
	Grace time.Duration
	// Nodes are the nodes that exist, by name.
	Nodes map[string]*corev1.Node
	// AbsentSince holds, for each node a volume names and that does not
	// exist, when it was first seen absent.
	AbsentSince map[string]time.Time
	// Volumes are the driver's PersistentVolumes.
	Volumes []*corev1.PersistentVolume
	Claims  map[types.NamespacedName]*corev1.PersistentVolumeClaim
	Pods    []*corev1.Pod
	Sets    []*appsv1.StatefulSet
	Classes map[string]*storagev1.StorageClass
}

// nodeOf is the node a volume is pinned to by topologyKey, "" for none.
func nodeOf(pv *corev1.PersistentVolume, topologyKey string) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == topologyKey && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// gone says whether node is gone for good and why; when it is not gone
// yet but will be unless it comes back, wait says in how long.
func (w *World) gone(node string) (why string, wait time.Duration) {
	if n, ok := w.Nodes[node]; ok {
		for _, t := range n.Spec.Taints {
			if t.Key == OutOfServiceTaint {
				return "carries the " + OutOfServiceTaint + " taint", 0
			}
		}
		return "", 0
	}
	since, ok := w.AbsentSince[node]
	if !ok {
		since = w.Now
	}
	if left := since.Add(w.Grace).Sub(w.Now); left > 0 {
		return "", left
	}
	return "was deleted", 0
}

// claimOf is the claim bound to pv, nil when it has none, when the claim
// of its name is another (made again since, another UID), or when the
// claim is bound to another volume. A PV's claim reference is written by
// whoever creates the PV (every node's provisioner may), so the claim must
// name the PV back: a PV made to name someone else's claim, and a node
// that is gone, must not get that claim and its pods deleted.
func (w *World) claimOf(pv *corev1.PersistentVolume) *corev1.PersistentVolumeClaim {
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return nil
	}
	c := w.Claims[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}]
	if c == nil || (ref.UID != "" && c.UID != ref.UID) || c.Spec.VolumeName != pv.Name {
		return nil
	}
	return c
}

// podsUsing lists the pods that use claim.
func (w *World) podsUsing(claim *corev1.PersistentVolumeClaim) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range w.Pods {
		if p.Namespace != claim.Namespace {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim.Name {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// setOf is the StatefulSet that makes claim again when it is deleted: the
// claim's name is <template>-<set>-<ordinal> for one of the set's volume
// claim templates, as the StatefulSet controller names them. nil for a
// claim no set makes.
func (w *World) setOf(claim *corev1.PersistentVolumeClaim) *appsv1.StatefulSet {
	for _, s := range w.Sets {
		if s.Namespace != claim.Namespace {
			continue
		}
		for _, t := range s.Spec.VolumeClaimTemplates {
			prefix := t.Name + "-" + s.Name + "-"
			if len(claim.Name) > len(prefix) && claim.Name[:len(prefix)] == prefix && isOrdinal(claim.Name[len(prefix):]) {
				return s
			}
		}
	}
	return nil
}

// isOrdinal says whether s is a StatefulSet pod's ordinal: digits, with no
// leading zero.
func isOrdinal(s string) bool {
	if s == "" || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

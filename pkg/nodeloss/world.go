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
// Watcher's caches hold them, and since when each node that a volume
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
// A volume is pinned to a node only when every term of its required node
// affinity (the terms are ORed) names that one node, each by one or more
// expressions topologyKey In [node]: a volume whose terms or expressions
// disagree, or that a term leaves open to any node, is on no one node,
// and the Watcher acts on nothing of it (a forged second expression
// naming a node that is gone must not have its claim taken away).
func nodeOf(pv *corev1.PersistentVolume, topologyKey string) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	node := ""
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		named := false
		for _, e := range term.MatchExpressions {
			if e.Key != topologyKey {
				continue
			}
			if e.Operator != corev1.NodeSelectorOpIn || len(e.Values) != 1 {
				return ""
			}
			if node != "" && e.Values[0] != node {
				return ""
			}
			node, named = e.Values[0], true
		}
		if !named {
			return ""
		}
	}
	return node
}

// nodeState is what a pass makes of a volume's node.
type nodeState struct {
	// gone says why the node is taken for gone for good ("was deleted");
	// "" while it is not.
	gone string
	// pending, for a node not gone, says why it would be taken for gone
	// and when ("was deleted; unless it registers again by ..."); "" when
	// nothing is to happen while the node stays as it is.
	pending string
	// advice, for a pending node, is what the operator can do to keep it.
	advice string
	// wait is how long until a deleted node's grace ends (0: none is
	// counted).
	wait time.Duration
}

// stateOf is what a pass makes of node. A node whose object exists is gone
// only when it carries the out-of-service taint and is not Ready, as
// Kubernetes' pod GC has it before it force-deletes the node's pods: the
// non-graceful node shutdown procedure taints a node that is shut down, and
// a node whose kubelet still reports Ready is alive, whatever its taints.
// A node whose object is absent is gone once it has been absent for the
// grace: a running kubelet whose Node was deleted does not register it
// again (only a kubelet that starts does), so from the API a live node
// deleted by mistake looks like a dead one, and the grace is the time an
// operator has to restart its kubelet.
func (w *World) stateOf(node string) nodeState {
	if n, ok := w.Nodes[node]; ok {
		switch {
		case !outOfService(n):
			return nodeState{}
		case ready(n):
			return nodeState{pending: "carries the " + OutOfServiceTaint + " taint but reports Ready; once it is not Ready",
				advice: "The taint marks a node that is shut down: if node " + node + " is alive, take the taint off"}
		}
		return nodeState{gone: "carries the " + OutOfServiceTaint + " taint and is not Ready"}
	}
	since, ok := w.AbsentSince[node]
	if !ok {
		since = w.Now
	}
	end := since.Add(w.Grace)
	if left := end.Sub(w.Now); left > 0 {
		return nodeState{pending: "was deleted; unless it registers again by " + end.UTC().Format(time.RFC3339), wait: left,
			advice: "If the machine is alive, restart its kubelet: a kubelet registers its Node only when it starts. " +
				"Meanwhile the pod GC deletes the node's pods, and those made again wait, Pending, for their volumes' node"}
	}
	return nodeState{gone: "was deleted"}
}

// outOfService says whether n carries the out-of-service taint, whatever
// its value and effect.
func outOfService(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == OutOfServiceTaint {
			return true
		}
	}
	return false
}

// ready says whether n's Ready condition is True; a node that reports no
// Ready condition is not Ready.
func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
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

// PinnedNode is the node pv is pinned to by topologyKey, "" for none, by
// the strict rule the Watcher acts by (nodeOf): converge-controller's
// snapshot labeller finds a snapshot's node from its source volume by it
// too, so that both read a volume's node alike.
func PinnedNode(pv *corev1.PersistentVolume, topologyKey string) string {
	return nodeOf(pv, topologyKey)
}

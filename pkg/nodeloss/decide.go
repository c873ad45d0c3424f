package nodeloss

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/converge-csi/converge/pkg/contract"
)

// ProvisionerFinalizer is the finalizer external-provisioner puts on the
// volumes it provisions and takes off once DeleteVolume has run.
const ProvisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// Kind is what an action does.
type Kind int

const (
	// Pending warns, on the volume and its claim, that its node will be
	// taken for gone unless it comes back, what converge then does, and
	// what the operator can do meanwhile.
	Pending Kind = iota
	// Retained warns, on the volume and its claim, that the volume's
	// node is gone and its data kept there.
	Retained
	// Kept warns that a release was asked for a claim no StatefulSet
	// makes again, so it is kept.
	Kept
	// DeleteClaim deletes the volume's claim.
	DeleteClaim
	// DeletePod deletes a pod that uses a deleted claim (at once, when it
	// is on the gone node, whose kubelet cannot confirm it).
	DeletePod
	// Release deletes the volume's PersistentVolume and takes the
	// provisioner's finalizer off it.
	Release
)

// kinds are every Kind, in order.
var kinds = []Kind{Pending, Retained, Kept, DeleteClaim, DeletePod, Release}

func (k Kind) String() string {
	return [...]string{"pending", "retained", "kept", "delete_claim", "delete_pod", "release"}[k]
}

// warns says whether k only warns, and so is given once while it says the
// same.
func (k Kind) warns() bool {
	return k == Pending || k == Retained || k == Kept
}

// Action is one thing a pass does, with what it acts on and why.
type Action struct {
	Kind   Kind
	Volume *corev1.PersistentVolume
	Claim  *corev1.PersistentVolumeClaim // nil when the volume has none
	Pod    *corev1.Pod                   // DeletePod's
	Node   string
	// Why is what the action says in its event and log.
	Why string
}

// Decision is a pass's outcome: its actions, how many of the driver's
// volumes are on gone nodes by choice, and how soon a node not yet gone
// would be (0: none is waited for).
type Decision struct {
	Actions []Action
	OnLost  map[contract.OnNodeLoss]int
	Next    time.Duration
}

// Decide decides, for every volume of the driver pinned to a node by
// topologyKey, what to do (see the package doc): on a gone node, what the
// volume's choice says; on a node that would be gone unless it comes back,
// a warning that says what converge would do then.
func Decide(w *World, topologyKey string) Decision {
	d := Decision{OnLost: map[contract.OnNodeLoss]int{}}
	for _, pv := range w.Volumes {
		node := nodeOf(pv, topologyKey)
		if node == "" {
			continue
		}
		s := w.stateOf(node)
		if s.wait > 0 && (d.Next == 0 || s.wait < d.Next) {
			d.Next = s.wait
		}
		switch {
		case s.gone != "":
			choice, why := w.choiceOf(pv)
			d.OnLost[choice]++
			d.Actions = append(d.Actions, w.onGone(pv, node, s.gone, choice, why)...)
		case s.pending != "":
			if a, ok := w.pending(pv, node, s); ok {
				d.Actions = append(d.Actions, a)
			}
		}
	}
	return d
}

// onGone is what to do with pv, whose node is gone (why says how), as its
// choice says (choiceWhy says where the choice came from).
func (w *World) onGone(pv *corev1.PersistentVolume, node, gone string, choice contract.OnNodeLoss, choiceWhy string) []Action {
	var out []Action
	claim := w.claimOf(pv)
	act := func(k Kind, pod *corev1.Pod, format string, args ...any) {
		out = append(out, Action{Kind: k, Volume: pv, Claim: claim, Pod: pod, Node: node,
			Why: fmt.Sprintf("node %s %s; ", node, gone) + fmt.Sprintf(format, args...)})
	}
	if choice == contract.OnNodeLossRetain {
		act(Retained, nil, "%s, so converge keeps the claim and the data on the node: if the node comes back, so do its pods. To start over on another node with an empty volume, delete the claim (and its pod)", choiceWhy)
		return out
	}
	if claim != nil {
		if claim.DeletionTimestamp == nil {
			if w.setOf(claim) == nil {
				act(Kept, nil, "%s, but no StatefulSet makes claim %s/%s again, so converge keeps it: delete it yourself to start over on another node", choiceWhy, claim.Namespace, claim.Name)
				return out
			}
			act(DeleteClaim, nil, "%s: its StatefulSet makes claim %s/%s again, on another node, empty", choiceWhy, claim.Namespace, claim.Name)
		}
		for _, p := range w.podsUsing(claim) {
			if p.DeletionTimestamp != nil && p.Spec.NodeName != node {
				continue // on its way out
			}
			act(DeletePod, p, "%s: pod %s/%s uses the released claim %s", choiceWhy, p.Namespace, p.Name, claim.Name)
		}
		return out
	}
	if pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain {
		return out // kept as the class asks, Released
	}
	if pv.DeletionTimestamp == nil || slices.Contains(pv.Finalizers, ProvisionerFinalizer) {
		act(Release, nil, "%s: the volume's claim is gone and its node's provisioner cannot delete it", choiceWhy)
	}
	return out
}

// pending is the warning for pv, whose node would be gone unless it comes
// back (s says when), and whether there is one: it says what converge
// would then do, as onGone decides it, and what the operator can do. There
// is none when converge would do nothing.
func (w *World) pending(pv *corev1.PersistentVolume, node string, s nodeState) (Action, bool) {
	choice, choiceWhy := w.choiceOf(pv)
	would := w.onGone(pv, node, "", choice, choiceWhy)
	if len(would) == 0 {
		return Action{}, false
	}
	first := would[0]
	var what string
	switch {
	case first.Kind == Retained && first.Claim != nil:
		what = fmt.Sprintf("converge keeps claim %s/%s and the data on the node", first.Claim.Namespace, first.Claim.Name)
	case first.Kind == Retained:
		what = fmt.Sprintf("converge keeps volume %s and its data on the node", pv.Name)
	case first.Kind == Kept:
		what = fmt.Sprintf("converge keeps claim %s/%s, which no StatefulSet makes again", first.Claim.Namespace, first.Claim.Name)
	case first.Kind == DeleteClaim:
		what = fmt.Sprintf("converge deletes claim %s/%s and its pods, and its StatefulSet makes them again on another node, with an empty volume", first.Claim.Namespace, first.Claim.Name)
	case first.Kind == DeletePod:
		what = fmt.Sprintf("converge deletes the pods of claim %s/%s, which is being deleted", first.Claim.Namespace, first.Claim.Name)
	default:
		what = fmt.Sprintf("converge deletes volume %s, whose claim is gone", pv.Name)
	}
	return Action{Kind: Pending, Volume: pv, Claim: first.Claim, Node: node,
		Why: fmt.Sprintf("node %s %s, %s: %s. %s", node, s.pending, what, choiceWhy, s.advice)}, true
}

// choiceOf is pv's on-node-loss choice, and why: the one recorded in its
// attributes when it was provisioned (CreateVolume writes it there, and a
// PV's source cannot be changed once it exists), whatever its class says
// now. A volume that records none (provisioned before converge recorded
// the choice, or a static PV that names none) takes its StorageClass's, but
// only from a class at least as old as the volume: a class made since
// under the same name is not the one it was provisioned with. Anything
// else is retain: deleting a claim cannot be undone, keeping it can.
func (w *World) choiceOf(pv *corev1.PersistentVolume) (contract.OnNodeLoss, string) {
	if v, ok := recordedChoice(pv); ok {
		choice, err := contract.ParseOnNodeLoss(v)
		if err != nil {
			return contract.OnNodeLossRetain, fmt.Sprintf("volume %s: %v (retain)", pv.Name, err)
		}
		return choice, fmt.Sprintf("volume %s was provisioned with %s: %s", pv.Name, contract.OnNodeLossKey, choice)
	}
	none := fmt.Sprintf("volume %s records no %s", pv.Name, contract.OnNodeLossKey)
	class, ok := w.Classes[pv.Spec.StorageClassName]
	switch {
	case !ok:
		return contract.OnNodeLossRetain, fmt.Sprintf("%s and its StorageClass %q is gone (retain)", none, pv.Spec.StorageClassName)
	case class.CreationTimestamp.After(pv.CreationTimestamp.Time):
		return contract.OnNodeLossRetain, fmt.Sprintf("%s and StorageClass %s was made after it, so is not the class it was provisioned with (retain)", none, class.Name)
	}
	v := class.Parameters[contract.OnNodeLossKey]
	choice, err := contract.ParseOnNodeLoss(v)
	if err != nil {
		return contract.OnNodeLossRetain, fmt.Sprintf("%s; StorageClass %s: %v (retain)", none, class.Name, err)
	}
	if v == "" {
		return choice, fmt.Sprintf("%s and StorageClass %s names none (retain)", none, class.Name)
	}
	return choice, fmt.Sprintf("%s; StorageClass %s says %s: %s", none, class.Name, contract.OnNodeLossKey, choice)
}

// recordedChoice is the on-node-loss choice recorded in pv's attributes,
// and whether it records one.
func recordedChoice(pv *corev1.PersistentVolume) (string, bool) {
	if pv.Spec.CSI == nil {
		return "", false
	}
	v, ok := pv.Spec.CSI.VolumeAttributes[contract.OnNodeLossKey]
	return v, ok
}

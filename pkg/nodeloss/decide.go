package nodeloss

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/converge-csi/converge/pkg/state"
)

// ProvisionerFinalizer is the finalizer external-provisioner puts on the
// volumes it provisions and takes off once DeleteVolume has run.
const ProvisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// Kind is what an action does.
type Kind int

const (
	// Retained warns, on the volume and its claim, that the volume's
	// node is gone and its data kept there.
	Retained Kind = iota
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

func (k Kind) String() string {
	return [...]string{"retained", "kept", "delete_claim", "delete_pod", "release"}[k]
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
	OnLost  map[state.OnNodeLoss]int
	Next    time.Duration
}

// Decide decides, for every volume of the driver pinned to a node by
// topologyKey, what to do (see the package doc).
func Decide(w *World, topologyKey string) Decision {
	d := Decision{OnLost: map[state.OnNodeLoss]int{}}
	for _, pv := range w.Volumes {
		node := nodeOf(pv, topologyKey)
		if node == "" {
			continue
		}
		gone, wait := w.gone(node)
		if gone == "" {
			if wait > 0 && (d.Next == 0 || wait < d.Next) {
				d.Next = wait
			}
			continue
		}
		choice, why := w.choiceOf(pv)
		d.OnLost[choice]++
		claim := w.claimOf(pv)
		act := func(k Kind, pod *corev1.Pod, format string, args ...any) {
			d.Actions = append(d.Actions, Action{Kind: k, Volume: pv, Claim: claim, Pod: pod, Node: node,
				Why: fmt.Sprintf("node %s %s; ", node, gone) + fmt.Sprintf(format, args...)})
		}
		if choice == state.OnNodeLossRetain {
			act(Retained, nil, "%s, so converge keeps the claim and the data on the node: if the node comes back, so do its pods. To start over on another node with an empty volume, delete the claim (and its pod)", why)
			continue
		}
		if claim != nil {
			if claim.DeletionTimestamp == nil {
				if w.setOf(claim) == nil {
					act(Kept, nil, "%s, but no StatefulSet makes claim %s/%s again, so converge keeps it: delete it yourself to start over on another node", why, claim.Namespace, claim.Name)
					continue
				}
				act(DeleteClaim, nil, "%s: its StatefulSet makes claim %s/%s again, on another node, empty", why, claim.Namespace, claim.Name)
			}
			for _, p := range w.podsUsing(claim) {
				if p.DeletionTimestamp != nil && p.Spec.NodeName != node {
					continue // on its way out
				}
				act(DeletePod, p, "%s: pod %s/%s uses the released claim %s", why, p.Namespace, p.Name, claim.Name)
			}
			continue
		}
		if pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain {
			continue // kept as the class asks, Released
		}
		if pv.DeletionTimestamp == nil || slices.Contains(pv.Finalizers, ProvisionerFinalizer) {
			act(Release, nil, "%s: the volume's claim is gone and its node's provisioner cannot delete it", why)
		}
	}
	return d
}

// choiceOf is pv's on-node-loss choice, and why: the one recorded in its
// attributes when it was provisioned (CreateVolume writes it there, and a
// PV's source cannot be changed once it exists), whatever its class says
// now. A volume that records none (provisioned before converge recorded
// the choice, or a static PV that names none) takes its StorageClass's, but
// only from a class at least as old as the volume: a class made since
// under the same name is not the one it was provisioned with. Anything
// else is retain: deleting a claim cannot be undone, keeping it can.
func (w *World) choiceOf(pv *corev1.PersistentVolume) (state.OnNodeLoss, string) {
	if v, ok := recordedChoice(pv); ok {
		choice, err := state.ParseOnNodeLoss(v)
		if err != nil {
			return state.OnNodeLossRetain, fmt.Sprintf("volume %s: %v (retain)", pv.Name, err)
		}
		return choice, fmt.Sprintf("volume %s was provisioned with %s: %s", pv.Name, state.OnNodeLossKey, choice)
	}
	none := fmt.Sprintf("volume %s records no %s", pv.Name, state.OnNodeLossKey)
	class, ok := w.Classes[pv.Spec.StorageClassName]
	switch {
	case !ok:
		return state.OnNodeLossRetain, fmt.Sprintf("%s and its StorageClass %q is gone (retain)", none, pv.Spec.StorageClassName)
	case class.CreationTimestamp.After(pv.CreationTimestamp.Time):
		return state.OnNodeLossRetain, fmt.Sprintf("%s and StorageClass %s was made after it, so is not the class it was provisioned with (retain)", none, class.Name)
	}
	v := class.Parameters[state.OnNodeLossKey]
	choice, err := state.ParseOnNodeLoss(v)
	if err != nil {
		return state.OnNodeLossRetain, fmt.Sprintf("%s; StorageClass %s: %v (retain)", none, class.Name, err)
	}
	if v == "" {
		return choice, fmt.Sprintf("%s and StorageClass %s names none (retain)", none, class.Name)
	}
	return choice, fmt.Sprintf("%s; StorageClass %s says %s: %s", none, class.Name, state.OnNodeLossKey, choice)
}

// recordedChoice is the on-node-loss choice recorded in pv's attributes,
// and whether it records one.
func recordedChoice(pv *corev1.PersistentVolume) (string, bool) {
	if pv.Spec.CSI == nil {
		return "", false
	}
	v, ok := pv.Spec.CSI.VolumeAttributes[state.OnNodeLossKey]
	return v, ok
}

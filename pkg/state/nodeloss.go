package state

// OnNodeLossKey is the StorageClass parameter, and the volume attribute,
// that says what the cluster does with a volume whose node is gone for
// good (converge-controller, pkg/nodeloss). The node plugin checks the
// parameter at CreateVolume, so that a class with a wrong value provisions
// nothing, and records the choice in the volume's attributes (its PV's),
// where converge-controller reads it.
const OnNodeLossKey = "converge.csi.dev/on-node-loss"

// OnNodeLoss is what happens to a volume when its node is gone.
type OnNodeLoss string

const (
	// OnNodeLossRetain keeps the claim and the volume: the data is on the
	// node, which may come back. Warning events say so. The default.
	OnNodeLossRetain OnNodeLoss = "retain"
	// OnNodeLossRelease deletes a StatefulSet's claim so that it makes a
	// new, empty one on another node, and releases the volume.
	OnNodeLossRelease OnNodeLoss = "release"
)

// ParseOnNodeLoss reads an OnNodeLossKey parameter or attribute; an absent
// one ("") is OnNodeLossRetain.
func ParseOnNodeLoss(v string) (OnNodeLoss, error) {
	switch OnNodeLoss(v) {
	case "", OnNodeLossRetain:
		return OnNodeLossRetain, nil
	case OnNodeLossRelease:
		return OnNodeLossRelease, nil
	}
	return "", Errorf(KindInvalidArgument, "%s: unknown value %q: want %q or %q", OnNodeLossKey, v, OnNodeLossRetain, OnNodeLossRelease)
}

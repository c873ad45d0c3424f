package contract

import "github.com/converge-csi/converge/pkg/classified"

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
	return "", classified.Errorf(classified.KindInvalidArgument, "%s: unknown value %q: want %q or %q", OnNodeLossKey, v, OnNodeLossRetain, OnNodeLossRelease)
}

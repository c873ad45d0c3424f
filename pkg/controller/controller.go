// Package controller is converge's node-local CSI Controller service: each
// node's plugin creates, grows and deletes the image files of its own
// storage pools, and reports what they can still hold. The service is a
// thin adapter over the node's storage pools (pkg/pool), which keep the
// images, snapshots, restores and the capacity promise: it parses requests
// and answers them. It answers only for this node's volumes and mounts
// nothing.
//
// "Controller" in converge means this service. The cluster-side command is
// converge-controller (cmd/converge-controller), and the loop it runs is
// nodeloss.Watcher.
package controller

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

const (
	// listTokenPrefix marks a List token: the token is the prefix and the
	// last ID of the previous page.
	listTokenPrefix = "after:"
)

// Options are what the controller tells about itself.
type Options struct {
	// SnapshotTopology names this node in every Snapshot answered: the
	// alpha field accessible_topology, which CSI allows only beside the
	// SNAPSHOT_ACCESSIBILITY_CONSTRAINTS plugin capability.
	SnapshotTopology bool
	// ModifyVolume advertises MODIFY_VOLUME and serves
	// ControllerModifyVolume (driver.ModifyVolume says why it is a
	// choice); without it that RPC is UNIMPLEMENTED.
	ModifyVolume bool
	// Kick asks the node's reconciler for a pass, once ControllerModifyVolume
	// recorded new IO limits, so that they are held at once rather than at
	// the next resync; nil asks for nothing.
	Kick func()
}

// Store is what the controller needs of the store.
type Store interface {
	Get(id string) (*state.Volume, error)
	List() []*state.Volume
	Update(id string, fn func(v *state.Volume) error) (*state.Volume, error)
}

// Stages is what DeleteVolume needs of the node's stages.
type Stages interface {
	// WithdrawIdleStage withdraws a stage of volume id left without
	// publishes (the kubelet forgot it) and waits until any
	// withdrawal of its stage is done; it reports whether it withdrew one.
	WithdrawIdleStage(ctx context.Context, id string) (withdrawn bool, err error)
}

// Controller implements the node-local csi.ControllerServer: volumes are
// image files in the data directories of this node's storage pools, thick
// or thin, whose space each pool.Pool promises.
type Controller struct {
	csi.UnimplementedControllerServer
	pools    *pool.Pools
	store    Store
	topology map[string]string
	opts     Options
	// snapshots is nil unless ServeSnapshots was called.
	snapshots *snapshotService
	// stages is nil unless WithdrawStagesBy was called: DeleteVolume then
	// withdraws no stage.
	stages Stages
}

// WithdrawStagesBy makes DeleteVolume withdraw, through s, a raw block
// stage the kubelet left without publishes, and wait for its unstage.
func (c *Controller) WithdrawStagesBy(s Stages) { c.stages = s }

// New returns the Controller service over the images of the pools;
// topology is this node's segment (contract.TopologyKey: the node's name).
func New(pools *pool.Pools, store Store, topology map[string]string, opts Options) *Controller {
	return &Controller{pools: pools, store: store, topology: topology, opts: opts}
}

func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	}
	if c.opts.ModifyVolume {
		types = append(types, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME)
	}
	if c.snapshots != nil {
		types = append(types, csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
			csi.ControllerServiceCapability_RPC_CLONE_VOLUME)
	}
	for _, t := range types {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// volume describes volume id of size bytes.
func (c *Controller) volume(id string, size int64) *csi.Volume {
	return &csi.Volume{
		VolumeId:           id,
		CapacityBytes:      size,
		AccessibleTopology: c.accessible(),
	}
}

// accessible is where a volume or snapshot of this node can be used: on
// this node alone.
func (c *Controller) accessible() []*csi.Topology {
	return []*csi.Topology{{Segments: c.topology}}
}

// checkTopology fails when the requisite topology excludes this node.
func (c *Controller) checkTopology(req *csi.TopologyRequirement) error {
	if len(req.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range req.GetRequisite() {
		if v, ok := t.GetSegments()[contract.TopologyKey]; ok && v == c.topology[contract.TopologyKey] {
			return nil
		}
	}
	return classified.Errorf(classified.KindResourceExhausted, "requisite topology does not include this node (%s=%s)", contract.TopologyKey, c.topology[contract.TopologyKey])
}

package controller

import (
	"context"
	"errors"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// ControllerModifyVolume records the IO limits of the class a claim
// switches to (its mutable parameters, contract.ParseIOLimits) in the
// record of a volume of this node, merged into the limits asked before: a
// key given sets its limit, contract.NoLimit removes it, and a key not
// given changes nothing (CSI: a volume is never modified for the absence
// of a key). It answers OK once the limits are recorded durably; the
// reconciler holds the volume to them. The same parameters again are OK
// and write nothing.
//
// The parameters are checked before the volume is looked up, so that a
// class this plugin cannot apply is INVALID_ARGUMENT on every node (the
// resizer then marks the change infeasible), with no part of it recorded.
// A volume of this node that does not exist, or is being deleted, is
// NOT_FOUND. A cluster runs one resizer, beside one node's plugin: a
// volume whose ID names another node is that node's to modify, and is
// answered OK once its parameters pass, recording nothing here. The
// node agent of the volume's node (pkg/classagent) reads the class the
// volume's claim names in its spec (never the class the resizer then
// writes into the PersistentVolume) and hands it to its own plugin, the
// call below with the class's parameters. The ModifyVolume feature, on
// by default, is served where the chart and deploy/ run that agent on
// every node, so an OK is never for something no node will do.
func (c *Controller) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if !c.opts.ModifyVolume {
		return nil, classified.Errorf(classified.KindUnimplemented, "ControllerModifyVolume is off on this node: --feature-gates=ModifyVolume=true turns it on")
	}
	id := req.GetVolumeId()
	if err := contract.CheckID("volume", id, contract.Finds); err != nil {
		return nil, err
	}
	params, err := contract.ParseIOLimits(req.GetMutableParameters())
	if err != nil {
		return nil, err
	}
	p, missing := c.pools.ForVolume(id)
	if missing != nil {
		return nil, missing.Err()
	}
	// Within the pool's promise, so that the volume found here is not
	// removed before its record is written: a deletion finished in
	// between would leave a record of limits alone.
	if err := p.Within(func(pool.Promise) error { return c.modifyWithin(p, id, params) }); err != nil {
		return nil, err
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

// modifyWithin records params in the record of volume id, whose image is
// in pool p (or being restored into it), within p's promise.
func (c *Controller) modifyWithin(p *pool.Pool, id string, params contract.IOLimitParams) error {
	owner, err := c.checkModifiable(p, id)
	if err != nil {
		return err
	}
	if owner != "" {
		klog.V(2).InfoS("Modify of another node's volume left to that node's agent", "volumeID", id, "node", owner, "keys", params.Keys())
		return nil
	}
	var before int64
	v, err := c.store.Update(id, func(v *state.Volume) error {
		before = v.Generation
		return v.RequestIOLimits(params.Apply(v.WantsIOLimits()))
	})
	if err != nil {
		return err
	}
	if v.Generation != before {
		klog.V(2).InfoS("Recorded IO limits", "volumeID", id, "keys", params.Keys(), "limits", v.WantsIOLimits(), "generation", v.Generation)
		if c.opts.Kick != nil {
			c.opts.Kick()
		}
	}
	return nil
}

// checkModifiable finds whose volume id is: this node's, in pool p (its
// image is there or a restore makes it), with owner ""; another node's,
// which its ID names, with owner that node; else NOT_FOUND.
func (c *Controller) checkModifiable(p *pool.Pool, id string) (owner string, err error) {
	if p.RestoreOf(id) != nil {
		return "", nil
	}
	_, err = p.ImageSize(id)
	switch {
	case err == nil:
		return "", nil
	case !errors.Is(err, os.ErrNotExist):
		return "", classified.Errorf(classified.KindInternal, "checking volume %s: %w", id, err)
	}
	here := c.topology[contract.TopologyKey]
	if node := nodeOf(id); node != "" && node != here {
		return node, nil
	}
	return "", classified.Errorf(classified.KindNotFound, "volume %s not found on this node (%s)", id, here)
}

package nodeserver

import (
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/contract/capability"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// checkAttributes refuses volume attributes (a PV's, which the kubelet
// passes to NodeStageVolume and NodePublishVolume) that converge does not
// define, and an on-node-loss choice it does not know. The node does not
// act on that choice (converge-controller does, from the PV); it refuses a
// wrong one so that a PV written by hand with a typo fails at its first
// use, not silently on the day its node is lost.
func checkAttributes(vc map[string]string) error {
	if err := contract.CheckKeys("volume attributes", vc, contract.VolumeAttributes()...); err != nil {
		return err
	}
	if _, err := contract.ParseOnNodeLoss(vc[contract.OnNodeLossKey]); err != nil {
		return invalid("volume attribute %v", err)
	}
	return nil
}

// checkDevice validates the device path of a static volume: absolute, clean
// and inside an allowed device prefix. Symlinks below the prefix are what
// stable paths are made of; the device layer resolves them and checks that
// a block device is at the end.
func (s *Server) checkDevice(path string) error {
	if len(s.cfg.DevicePrefixes) == 0 {
		return invalid("volume attribute %s names a device, but static devices are not enabled (--allowed-device-prefix)", contract.DeviceKey)
	}
	if _, _, err := host.Beneath(path, s.cfg.DevicePrefixes); err != nil {
		return invalid("volume attribute %s: %v", contract.DeviceKey, err)
	}
	return nil
}

// accessOf is the access type a stage or publish of capability c records.
func accessOf(c capability.Capability) state.AccessType {
	if c.Block {
		return state.AccessBlock
	}
	return state.AccessMount
}

// checkPath validates a staging or target path for an RPC.
func (s *Server) checkPath(what, path string) error {
	if path == "" {
		return invalid("%s is required", what)
	}
	if _, _, err := host.Beneath(path, s.cfg.Roots); err != nil {
		return invalid("%s: %v", what, err)
	}
	return nil
}

// Package capability is the published contract's rule for a CSI volume
// capability (Parse): the one part of pkg/contract's request rules that
// reads a CSI type, kept apart so that the contract, which the store and
// the reconciler read for the names and the condition reasons, links no CSI
// nor gRPC (test/arch). The node server and the node-local controller
// parse every capability here.
package capability

import (
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
)

// supportedModes are the access modes of a node-local volume.
var supportedModes = []csi.VolumeCapability_AccessMode_Mode{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
}

// Capability is a validated CSI volume capability.
type Capability struct {
	// Block is true for the raw block access type, false for the mount
	// access type (a filesystem).
	Block      bool
	FsType     string
	MountFlags []string
	// Mode is the access mode's CSI name.
	Mode string
	// ReadOnly is true for reader-only modes.
	ReadOnly bool
}

// Parse validates a volume capability: a supported access mode
// (the single-node ones), and a raw block or a mount access type whose fs
// type (empty: the default) and mount flags (contract.CheckMountFlags) are allowed.
func Parse(c *csi.VolumeCapability) (Capability, error) {
	if c == nil {
		return Capability{}, fmt.Errorf("volume capability is required")
	}
	mode := c.GetAccessMode().GetMode()
	if mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return Capability{}, fmt.Errorf("access mode is required")
	}
	if !slices.Contains(supportedModes, mode) {
		return Capability{}, fmt.Errorf("access mode %s is not supported by a node-local volume", mode)
	}
	out := Capability{Mode: mode.String(), ReadOnly: mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY}
	switch {
	case c.GetBlock() != nil:
		out.Block = true
	case c.GetMount() != nil:
		m := c.GetMount()
		out.FsType = m.GetFsType()
		if out.FsType != "" && !slices.Contains(host.FsTypes(), out.FsType) {
			return Capability{}, fmt.Errorf("fs type %q is not supported; use one of %v", out.FsType, host.FsTypes())
		}
		if err := contract.CheckMountFlags(m.GetMountFlags()); err != nil {
			return Capability{}, err
		}
		out.MountFlags = slices.Clone(m.GetMountFlags())
		if len(out.MountFlags) == 0 {
			out.MountFlags = nil
		}
	default:
		return Capability{}, fmt.Errorf("access type (mount or block) is required")
	}
	return out, nil
}

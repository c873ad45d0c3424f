package controller

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// parseAllowModeChange reads contract.AllowModeChangeKey from a request's
// parameters: absent is false; anything but "true" or "false" is
// INVALID_ARGUMENT.
func parseAllowModeChange(params map[string]string) (bool, error) {
	switch v, ok := params[contract.AllowModeChangeKey]; {
	case !ok || v == "false":
		return false, nil
	case v == "true":
		return true, nil
	default:
		return false, classified.Errorf(classified.KindInvalidArgument, "%s: unknown value %q: want \"true\" or \"false\"", contract.AllowModeChangeKey, v)
	}
}

// accessOf is how a volume asked for with caps may be written: block when
// any capability asks for a raw block device, mount otherwise.
func accessOf(caps []*csi.VolumeCapability) state.AccessType {
	for _, vc := range caps {
		if capAccess(vc) == state.AccessBlock {
			return state.AccessBlock
		}
	}
	return state.AccessMount
}

// capAccess is the access type of a capability, checked already.
func capAccess(vc *csi.VolumeCapability) state.AccessType {
	if vc.GetBlock() != nil {
		return state.AccessBlock
	}
	return state.AccessMount
}

// snapshotAccess is how the volume of a snapshot was written, as the
// snapshot records it. A snapshot taken before snapshots recorded it (by
// an earlier release) tells by its filesystem: one recorded means the
// plugin formatted the volume or mounted the filesystem it found (mount);
// none means the plugin never did, and what was written is unknown
// (block). An access this plugin does not know is block.
func snapshotAccess(info devices.SnapshotInfo) state.AccessType {
	switch {
	case info.Access == string(state.AccessMount):
		return state.AccessMount
	case info.Access == "" && info.FsType != "":
		return state.AccessMount
	}
	return state.AccessBlock
}

// modeName is the Kubernetes volume mode of an access type, which the user
// wrote in the claim.
func modeName(a state.AccessType) string {
	if a == state.AccessBlock {
		return "Block"
	}
	return "Filesystem"
}

// checkModeChange refuses, with INVALID_ARGUMENT, to make the volume r asks
// for from source (a snapshot or a volume, named in the message), whose
// data was written as from, when any of r's capabilities asks for the
// other access type, unless the StorageClass allows it.
func (r createRequest) checkModeChange(source string, from state.AccessType) error {
	if r.allowModeChange {
		return nil
	}
	for _, vc := range r.caps {
		if to := capAccess(vc); to != from {
			return classified.Errorf(classified.KindInvalidArgument, "%s holds the data of a volume in volume mode %s; a volume in volume mode %s is made from it only where the StorageClass sets %s: \"true\"",
				source, modeName(from), modeName(to), contract.AllowModeChangeKey)
		}
	}
	return nil
}

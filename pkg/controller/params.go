package controller

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/contract/capability"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/state"
)

// parseProvisioning reads the provisioning a request's parameters ask for.
func parseProvisioning(params map[string]string) (state.Provisioning, error) {
	switch p, ok := params[contract.ProvisioningKey]; {
	case !ok || p == string(state.ProvisionThick):
		return state.ProvisionThick, nil
	case p == string(state.ProvisionThin):
		return state.ProvisionThin, nil
	default:
		return "", classified.Errorf(classified.KindInvalidArgument, "%s: unknown value %q: want %q or %q", contract.ProvisioningKey, p, state.ProvisionThick, state.ProvisionThin)
	}
}

// parsePool reads the pool a request's parameters name (the default pool
// unless they name one): INVALID_ARGUMENT for a name no pool can have,
// RESOURCE_EXHAUSTED for one this node does not have (pool.Missing.Err:
// the provisioner then tries another node, as for a full pool).
func (c *Controller) parsePool(params map[string]string) (*pool.Pool, error) {
	name, ok := params[contract.PoolKey]
	if !ok {
		name = state.DefaultPool
	}
	if err := state.ValidPoolName(name); err != nil {
		return nil, classified.Errorf(classified.KindInvalidArgument, "%s: %w", contract.PoolKey, err)
	}
	p := c.pools.Get(name)
	if p == nil {
		return nil, c.pools.Missing(name).Err()
	}
	return p, nil
}

// fsTypeOf is the filesystem a volume asked for with these parameters and
// capabilities will carry: the mount capability's, else the StorageClass's,
// else the default. "" for a raw block volume.
func fsTypeOf(params map[string]string, caps []*csi.VolumeCapability) string {
	fsType, mounted := "", false
	for _, vc := range caps {
		if m := vc.GetMount(); m != nil {
			mounted = true
			if m.GetFsType() != "" {
				fsType = m.GetFsType()
			}
		}
	}
	switch {
	case !mounted:
		return ""
	case fsType == "":
		fsType = params[contract.FsTypeKey]
	}
	if fsType == "" {
		fsType = host.DefaultFsType
	}
	return fsType
}

// checkCapabilities refuses a request without capabilities or with one
// this plugin does not serve.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return classified.Errorf(classified.KindInvalidArgument, "volume capabilities are required")
	}
	for _, vc := range caps {
		if _, err := capability.Parse(vc); err != nil {
			return classified.Errorf(classified.KindInvalidArgument, "%w", err)
		}
	}
	return nil
}

// rangeOf is a request's capacity range.
func rangeOf(r *csi.CapacityRange) state.Range {
	return state.Range{Required: r.GetRequiredBytes(), Limit: r.GetLimitBytes()}
}

// restoreSize is the size a snapshot of an image of size bytes reports,
// whose restores into its filesystem have images of at least floor bytes
// (host.MinSize of the filesystem it holds): what external-provisioner
// makes the least a claim restored from it may ask for (restoreSize),
// refusing a claim that asks for less. pool.SizeFor rounds every request up to
// whole 4 KiB blocks and to at least the floor, so the image can hold more
// than its claim asked for (a claim of 100M, 10^8 bytes, has an image of
// 100003840; an ext4 claim of 1Mi, one of 16 MiB), and a claim asking
// what its source asked for must still restore it: what is reported is
// the least request pool.SizeFor gives an image of size bytes, but for a
// whole number of MiB above the floor, which is what Mi and Gi claims ask
// for, reported as it is (a claim less than 4 KiB short of a whole MiB,
// such as 102399Ki, is then restored into a claim of that whole MiB).
func restoreSize(size, floor int64) int64 {
	const mib = 1 << 20
	switch {
	case size <= max(floor, pool.MinVolumeSize):
		return 1
	case size%mib == 0:
		return size
	default:
		return size - pool.SizeAlign + 1
	}
}

package controller

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/contract/capability"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

const (
	// DefaultVolumeSize is the size of a volume created without a
	// capacity range.
	DefaultVolumeSize = 1 << 30
	// MinVolumeSize is the smallest volume of any filesystem and the
	// smallest a volume grows to: room for an ext4 journal (host.MinSize,
	// which says what each filesystem needs).
	MinVolumeSize = host.MinImageSize
	// sizeAlign keeps images a whole number of 4 KiB blocks, so the loop
	// device and every filesystem block size divide them.
	sizeAlign = 4096
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

// sizeFor picks the image size for a capacity range: what it requires, at
// least floor (MinVolumeSize, or host.MinSize of the filesystem a new
// volume will carry: a claim smaller than its filesystem can be made on is
// given that much, within its limit), else DefaultVolumeSize within its
// limit, in whole 4 KiB blocks.
func sizeFor(r state.Range, floor int64) (int64, error) {
	if err := r.Check(); err != nil {
		return 0, err
	}
	floor = max(floor, MinVolumeSize)
	size := max(r.Required, floor)
	if r.Required == 0 {
		size = max(DefaultVolumeSize, floor)
		if r.Limit > 0 {
			size = min(size, r.Limit)
		}
	}
	if size > (1 << 62) {
		return 0, classified.Errorf(classified.KindOutOfRange, "%d bytes is more than this node can hold", size)
	}
	size = (size + sizeAlign - 1) / sizeAlign * sizeAlign
	if r.Limit > 0 && size > r.Limit {
		// The largest whole-block size within the limit.
		size = r.Limit / sizeAlign * sizeAlign
	}
	if need := max(r.Required, floor); size < need {
		return 0, classified.Errorf(classified.KindOutOfRange, "no size of whole 4 KiB blocks of at least %d bytes fits in the limit of %d bytes", need, r.Limit)
	}
	return size, nil
}

// rangeOf is a request's capacity range.
func rangeOf(r *csi.CapacityRange) state.Range {
	return state.Range{Required: r.GetRequiredBytes(), Limit: r.GetLimitBytes()}
}

// restoreSize is the size a snapshot of an image of size bytes reports,
// whose restores into its filesystem have images of at least floor bytes
// (host.MinSize of the filesystem it holds): what external-provisioner
// makes the least a claim restored from it may ask for (restoreSize),
// refusing a claim that asks for less. sizeFor rounds every request up to
// whole 4 KiB blocks and to at least the floor, so the image can hold more
// than its claim asked for (a claim of 100M, 10^8 bytes, has an image of
// 100003840; an ext4 claim of 1Mi, one of 16 MiB), and a claim asking
// what its source asked for must still restore it: what is reported is
// the least request sizeFor gives an image of size bytes, but for a
// whole number of MiB above the floor, which is what Mi and Gi claims ask
// for, reported as it is (a claim less than 4 KiB short of a whole MiB,
// such as 102399Ki, is then restored into a claim of that whole MiB).
func restoreSize(size, floor int64) int64 {
	const mib = 1 << 20
	switch {
	case size <= max(floor, MinVolumeSize):
		return 1
	case size%mib == 0:
		return size
	default:
		return size - sizeAlign + 1
	}
}

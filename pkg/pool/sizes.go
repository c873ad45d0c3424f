package pool

import (
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// The sizes of images: a pool makes, grows and restores them by these
// rules alone, whoever asks (CreateVolume, ControllerExpandVolume, the
// reconciler's growth for NodeExpandVolume).
const (
	// DefaultVolumeSize is the size of a volume created without a
	// capacity range.
	DefaultVolumeSize = 1 << 30
	// MinVolumeSize is the smallest volume of any filesystem and the
	// smallest a volume grows to: room for an ext4 journal (host.MinSize,
	// which says what each filesystem needs).
	MinVolumeSize = host.MinImageSize
	// SizeAlign keeps images a whole number of 4 KiB blocks, so the loop
	// device and every filesystem block size divide them.
	SizeAlign = 4096
)

// SizeFor picks the image size for a capacity range: what it requires, at
// least floor (MinVolumeSize, or host.MinSize of the filesystem a new
// volume will carry: a claim smaller than its filesystem can be made on is
// given that much, within its limit), else DefaultVolumeSize within its
// limit, in whole 4 KiB blocks. A range no such size fits is OUT_OF_RANGE
// (INVALID_ARGUMENT when a bound is negative).
func SizeFor(r state.Range, floor int64) (int64, error) {
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
	size = (size + SizeAlign - 1) / SizeAlign * SizeAlign
	if r.Limit > 0 && size > r.Limit {
		// The largest whole-block size within the limit.
		size = r.Limit / SizeAlign * SizeAlign
	}
	if need := max(r.Required, floor); size < need {
		return 0, classified.Errorf(classified.KindOutOfRange, "no size of whole 4 KiB blocks of at least %d bytes fits in the limit of %d bytes", need, r.Limit)
	}
	return size, nil
}

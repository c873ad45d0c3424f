package contract

import (
	"strconv"

	"github.com/converge-csi/converge/pkg/classified"
)

// MaxSnapshotsPerVolumeKey is the VolumeSnapshotClass (and
// VolumeGroupSnapshotClass) parameter that caps how many snapshots one
// volume may have on its node: a positive whole number. Absent, there is
// no cap. Snapshot space is outside any ResourceQuota, so without it one
// claim can fill its node's pool with snapshots up to the pool's guard.
// It is not under csi.storage.k8s.io/, which csi-snapshotter strips (and
// refuses where it does not know the key) before CreateSnapshot.
const MaxSnapshotsPerVolumeKey = "converge.csi.dev/max-snapshots-per-volume"

// maxSnapshotsBits bounds the cap to what an int holds on every platform:
// a larger value is refused, never wrapped into a small or negative cap.
const maxSnapshotsBits = 31

// SnapshotParameters are the VolumeSnapshotClass parameters CreateSnapshot
// knows: a copy, as CreateParameters.
func SnapshotParameters() []string { return []string{MaxSnapshotsPerVolumeKey} }

// GroupSnapshotParameters are the VolumeGroupSnapshotClass parameters
// CreateVolumeGroupSnapshot knows: a copy, as CreateParameters.
func GroupSnapshotParameters() []string {
	return []string{GroupDeletionPolicyKey, MaxSnapshotsPerVolumeKey}
}

// ParseMaxSnapshots reads MaxSnapshotsPerVolumeKey from a class's
// parameters: 0, no cap, when it is absent; INVALID_ARGUMENT naming the
// key for any value but a positive whole number in decimal digits (no
// sign, no fraction, no spaces), so that a typo never leaves a class
// without the cap its author meant.
func ParseMaxSnapshots(params map[string]string) (int, error) {
	v, ok := params[MaxSnapshotsPerVolumeKey]
	if !ok {
		return 0, nil
	}
	// ParseUint takes no sign, so "+3" and "-1" are refused here too.
	n, err := strconv.ParseUint(v, 10, maxSnapshotsBits)
	if err != nil || n == 0 {
		return 0, classified.Errorf(classified.KindInvalidArgument, "%s: %q is not a positive whole number (of at most %d)", MaxSnapshotsPerVolumeKey, v, uint64(1)<<maxSnapshotsBits-1)
	}
	return int(n), nil
}

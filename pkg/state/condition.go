package state

import (
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
)

// Health classifies an abnormal volume, after CSI's VolumeHealthErrorType.
type Health string

const (
	// Degraded: the volume works, but not as asked (e.g. read-only after
	// filesystem errors).
	Degraded Health = "DEGRADED"
	// Inaccessible: the volume cannot be used at one of its paths until the
	// reconciler repairs it.
	Inaccessible Health = "INACCESSIBLE"
	// DataLost: the data the volume held is known gone.
	DataLost Health = "DATA_LOSS"
)

// Condition is the health of a volume as the reconciler last saw it.
type Condition struct {
	// Abnormal is true when the volume is not what its intents ask for and
	// the reconciler has not (yet) repaired it.
	Abnormal bool
	// Health says how bad it is; empty when not abnormal.
	Health Health
	// Reason is a short CamelCase cause, e.g. StagingMountMissing; empty
	// when not abnormal. It is published (contract.Reason).
	Reason contract.Reason
	// Message says what is wrong and what the plugin does about it.
	Message string
	// Unusable lists the staging and target paths where the volume cannot
	// be used or measured: they hold no mount of its filesystem (usage read
	// there would be another filesystem's), or a broken one.
	Unusable []string
}

// LostFilesystem returns the condition of a volume whose stage failed with
// err, when that failure decides it: staging found the volume's
// filesystem gone (KindDataLoss), which is DATA_LOSS whatever else is
// wrong. ok is false for any other failure, or none. The reconciler
// decides a staged volume's condition with it, and NodeGetVolumeHealth
// that of a volume whose stage was refused and rolled back for it.
func LostFilesystem(err *classified.Error) (c Condition, ok bool) {
	if err == nil || err.Kind != classified.KindDataLoss {
		return Condition{}, false
	}
	return Condition{Abnormal: true, Health: DataLost, Reason: contract.FilesystemMissing, Message: err.Message}, true
}

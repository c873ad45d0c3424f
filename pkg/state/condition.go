package state

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

// Reason is the short CamelCase cause of an abnormal condition. It is
// published: the kubelet copies it into the pod's status.volumeHealth,
// csi_node_volumes_abnormal counts volumes by it, and the alert rules
// (deploy/components/monitoring, charts/converge/files/alerts.yaml) and
// docs/operations.md match it, so a value never changes.
type Reason string

// The reasons, in the order the reconciler looks for them (see
// reconciler/health.go, which decides them).
const (
	// ReasonDeviceAttachedTwice: the image is attached to more than one
	// loop device.
	ReasonDeviceAttachedTwice Reason = "DeviceAttachedTwice"
	// ReasonDeviceDetached: the loop device of a staged volume is gone.
	ReasonDeviceDetached Reason = "DeviceDetached"
	// ReasonStagingMountMissing: nothing is mounted at the staging path
	// of a volume that was staged.
	ReasonStagingMountMissing Reason = "StagingMountMissing"
	// ReasonStagingPathTaken: another mount sits at the staging path.
	ReasonStagingPathTaken Reason = "StagingPathTaken"
	// ReasonFilesystemUnusable: the staged filesystem is shut down or its
	// mount point fails.
	ReasonFilesystemUnusable Reason = "FilesystemUnusable"
	// ReasonFilesystemReadOnly: the kernel made the filesystem read-only
	// after errors.
	ReasonFilesystemReadOnly Reason = "FilesystemReadOnly"
	// ReasonDeviceDetachPending: the loop device was detached from outside
	// while in use.
	ReasonDeviceDetachPending Reason = "DeviceDetachPending"
	// ReasonPublishMountUnusable: a publish's mount point fails.
	ReasonPublishMountUnusable Reason = "PublishMountUnusable"
	// ReasonPublishMountMissing: a publish that was mounted is not.
	ReasonPublishMountMissing Reason = "PublishMountMissing"
	// ReasonPoolFull: the pool of a thin volume with unallocated blocks is
	// full.
	ReasonPoolFull Reason = "PoolFull"
	// ReasonSpaceRanOut: the pool ran out of space under the volume's
	// current staging mount.
	ReasonSpaceRanOut Reason = "SpaceRanOut"
	// ReasonPoolNearlyFull: the pool of a thin volume is below its guard.
	ReasonPoolNearlyFull Reason = "PoolNearlyFull"
	// ReasonSpaceNotReserved: a volume that is not thin has holes its pool
	// has no room for.
	ReasonSpaceNotReserved Reason = "SpaceNotReserved"
	// ReasonFilesystemMissing: staging found the volume's filesystem gone
	// (DATA_LOSS).
	ReasonFilesystemMissing Reason = "FilesystemMissing"
	// ReasonGrowFailed: growing the volume failed.
	ReasonGrowFailed Reason = "GrowFailed"
	// ReasonOperationFailing: an operation on the volume failed
	// repeatedly.
	ReasonOperationFailing Reason = "OperationFailing"
)

// Reasons lists every reason, for the tests that check that each one an
// alert or the runbook names exists.
var Reasons = []Reason{
	ReasonDeviceAttachedTwice, ReasonDeviceDetached, ReasonStagingMountMissing, ReasonStagingPathTaken,
	ReasonFilesystemUnusable, ReasonFilesystemReadOnly, ReasonDeviceDetachPending, ReasonPublishMountUnusable,
	ReasonPublishMountMissing, ReasonPoolFull, ReasonSpaceRanOut, ReasonPoolNearlyFull, ReasonSpaceNotReserved,
	ReasonFilesystemMissing, ReasonGrowFailed, ReasonOperationFailing,
}

// Condition is the health of a volume as the reconciler last saw it.
type Condition struct {
	// Abnormal is true when the volume is not what its intents ask for and
	// the reconciler has not (yet) repaired it.
	Abnormal bool
	// Health says how bad it is; empty when not abnormal.
	Health Health
	// Reason is a short CamelCase cause, e.g. StagingMountMissing; empty
	// when not abnormal.
	Reason Reason
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
func LostFilesystem(err *Error) (c Condition, ok bool) {
	if err == nil || err.Kind != KindDataLoss {
		return Condition{}, false
	}
	return Condition{Abnormal: true, Health: DataLost, Reason: ReasonFilesystemMissing, Message: err.Message}, true
}

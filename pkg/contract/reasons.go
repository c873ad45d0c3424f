package contract

import "slices"

// Reason is the short CamelCase cause of a volume's abnormal condition;
// empty when the volume is normal. The kubelet copies it into the pod's
// status.volumeHealth, the converge_volume_conditions metric counts
// volumes by it, csi-node status prints it, and the alert rules
// (deploy/components/monitoring, charts/converge/files/alerts.yaml) and
// docs/operations.md match it: a value never changes, and each is spelled
// as its constant's name. Which reason a volume has is decided in one
// place, pkg/reconciler's health.go (and, for a filesystem found gone,
// state.LostFilesystem).
type Reason string

// The reasons, in the order the reconciler looks for them (see
// reconciler/health.go, which decides them).
const (
	// DeviceAttachedTwice: the image is attached to more than one loop
	// device.
	DeviceAttachedTwice Reason = "DeviceAttachedTwice"
	// DeviceDetached: the loop device of a staged volume is gone.
	DeviceDetached Reason = "DeviceDetached"
	// StagingMountMissing: nothing is mounted at the staging path of a
	// volume that was staged.
	StagingMountMissing Reason = "StagingMountMissing"
	// StagingPathTaken: another mount sits at the staging path.
	StagingPathTaken Reason = "StagingPathTaken"
	// FilesystemUnusable: the staged filesystem is shut down or its mount
	// point fails.
	FilesystemUnusable Reason = "FilesystemUnusable"
	// FilesystemReadOnly: the kernel made the filesystem read-only after
	// errors.
	FilesystemReadOnly Reason = "FilesystemReadOnly"
	// DeviceDetachPending: the loop device was detached from outside while
	// in use.
	DeviceDetachPending Reason = "DeviceDetachPending"
	// PublishMountUnusable: a publish's mount point fails.
	PublishMountUnusable Reason = "PublishMountUnusable"
	// PublishMountMissing: a publish that was mounted is not.
	PublishMountMissing Reason = "PublishMountMissing"
	// PoolFull: the pool of a thin volume with unallocated blocks is full.
	PoolFull Reason = "PoolFull"
	// SpaceRanOut: the pool ran out of space under the volume's current
	// staging mount.
	SpaceRanOut Reason = "SpaceRanOut"
	// PoolNearlyFull: the pool of a thin volume is below its guard.
	PoolNearlyFull Reason = "PoolNearlyFull"
	// SpaceNotReserved: a volume that is not thin has holes its pool has
	// no room for.
	SpaceNotReserved Reason = "SpaceNotReserved"
	// IOLimitsNotApplied: the volume asks for IO limits that cannot be
	// held on this node (no io controller), or for a pod that cannot be
	// told (a target not laid out as the kubelet's), whose cgroups cannot
	// be read or lack the io controller, or whose cgroup has not been
	// found for a minute.
	IOLimitsNotApplied Reason = "IOLimitsNotApplied"
	// FilesystemMissing: staging found the volume's filesystem gone
	// (DATA_LOSS).
	FilesystemMissing Reason = "FilesystemMissing"
	// GrowFailed: growing the volume failed.
	GrowFailed Reason = "GrowFailed"
	// OperationFailing: an operation on the volume failed repeatedly.
	OperationFailing Reason = "OperationFailing"
)

// Reasons lists every reason, in the order above, for the tests that check
// that each one an alert or the runbook names exists, and that the
// runbook lists each one; a copy. TestReasonsListsEveryReason keeps it
// whole.
func Reasons() []Reason { return slices.Clone(reasons) }

var reasons = []Reason{
	DeviceAttachedTwice, DeviceDetached, StagingMountMissing, StagingPathTaken,
	FilesystemUnusable, FilesystemReadOnly, DeviceDetachPending, PublishMountUnusable,
	PublishMountMissing, PoolFull, SpaceRanOut, PoolNearlyFull, SpaceNotReserved,
	IOLimitsNotApplied, FilesystemMissing, GrowFailed, OperationFailing,
}

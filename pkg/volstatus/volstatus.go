// Package volstatus holds what the plugin reports of each volume: the
// reconciler fills it at every pass; the metrics, the HTTP status view and
// the status command read it. It decides nothing and imports nothing of the
// plugin. Its JSON names are published (csi-node status) and never change.
package volstatus

import "time"

// Phases of a volume in the status view and the metrics.
const (
	PhaseReady        = "Ready"
	PhaseSettingUp    = "SettingUp"
	PhaseTearingDown  = "TearingDown"
	PhaseFailing      = "Failing"
	PhaseDegraded     = "Degraded"
	PhaseInaccessible = "Inaccessible"
	PhaseDataLoss     = "DataLoss"
	// PhaseIdle is a record that holds only the volume's provenance.
	PhaseIdle = "Idle"
)

// Phases lists every phase, for metrics that report each.
var Phases = []string{PhaseReady, PhaseSettingUp, PhaseTearingDown, PhaseFailing, PhaseDegraded, PhaseInaccessible, PhaseDataLoss, PhaseIdle}

// VolumeStatus is what the reconciler wants and sees of one volume, as of
// its last pass.
type VolumeStatus struct {
	ID    string `json:"id"`
	Phase string `json:"phase"`
	// StagingPath is where the volume is (to be) staged; empty when not.
	StagingPath string `json:"stagingPath,omitempty"`
	// Access is mount or block.
	Access string `json:"access,omitempty"`
	// Provisioning is thick or thin; empty for a volume made before it
	// was recorded, and for a static volume.
	Provisioning string `json:"provisioning,omitempty"`
	// Pool is the storage pool of the volume's image; empty for a static
	// volume.
	Pool string `json:"pool,omitempty"`
	// StageReady is true when the stage is fulfilled: in place, formatted
	// and usable (the reconciler's stageReady). Published as "staged".
	StageReady       bool `json:"staged"`
	PublishesDesired int  `json:"publishesDesired"`
	PublishesActual  int  `json:"publishesActual"`
	// SizeBytes is the device's size; 0 when it is not attached.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// IOLimitsDesired are the IO limits the volume's class asks for
	// (CreateVolume, ControllerModifyVolume); nil when it asks for none.
	IOLimitsDesired *IOLimits `json:"ioLimitsDesired,omitempty"`
	// IOLimitsApplied are the IO limits in force for the volume's device
	// in every cgroup of the pods that publish it: a limit is there when
	// all of those cgroups hold it, and left out otherwise. nil when the
	// volume asks for no limits or no such cgroup was seen.
	IOLimitsApplied *IOLimits `json:"ioLimitsApplied,omitempty"`
	// Reason and Message are the condition when abnormal.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// LastError is the latest failure, with its attempts and next retry.
	LastError string    `json:"lastError,omitempty"`
	Attempts  int       `json:"attempts,omitempty"`
	NextRetry time.Time `json:"nextRetry,omitzero"`
}

// IOLimits are per-second upper limits of a volume's IO; a limit left out
// (zero) is none.
type IOLimits struct {
	ReadIOPS  uint64 `json:"readIOPS,omitempty"`
	WriteIOPS uint64 `json:"writeIOPS,omitempty"`
	ReadBPS   uint64 `json:"readBPS,omitempty"`
	WriteBPS  uint64 `json:"writeBPS,omitempty"`
}

// PoolStatus is the space of a storage pool's data directory: its filesystem,
// what the volumes were promised of it, and what can still be promised.
type PoolStatus struct {
	// Name is the pool's name.
	Name string `json:"name"`
	// Error says why the pool's space could not be read at this look (its
	// filesystem failing, its directory gone): the fields other than its
	// name, directory and node are then zero, not measured.
	Error string `json:"error,omitempty"`
	// Dir is its data directory, FsType its filesystem's type, and
	// PunchesHoles whether that gives back what thin volumes free.
	Dir          string `json:"dir"`
	FsType       string `json:"fsType"`
	PunchesHoles bool   `json:"punchesHoles"`
	// Node is the node whose pool this is: the only node its volumes can
	// be staged on.
	Node      string `json:"node"`
	SizeBytes int64  `json:"sizeBytes"`
	FreeBytes int64  `json:"freeBytes"`
	// ThickPromisedBytes sums the sizes of the volumes that are not thin
	// (thick ones, and those made before provisioning was recorded), and
	// ThickOwedBytes is what of it is not yet allocated.
	ThickPromisedBytes int64 `json:"thickPromisedBytes"`
	ThickOwedBytes     int64 `json:"thickOwedBytes"`
	// ThinPromisedBytes sums the sizes of the thin volumes, of which
	// ThinAllocatedBytes is written and shared with no other file (a
	// snapshot, a volume restored from one): a write to a shared block
	// takes a new one (capacity.Image.Own).
	ThinPromisedBytes  int64 `json:"thinPromisedBytes"`
	ThinAllocatedBytes int64 `json:"thinAllocatedBytes"`
	// ThickAvailableBytes and ThinAvailableBytes are what GetCapacity
	// answers for each provisioning.
	ThickAvailableBytes int64 `json:"thickAvailableBytes"`
	ThinAvailableBytes  int64 `json:"thinAvailableBytes"`
	// OverprovisioningRatio is the pool's ratio for thin volumes.
	OverprovisioningRatio float64 `json:"overprovisioningRatio"`
	// GuardBytes is the free space that no volume is promised, below
	// which the pool is nearly full (NearlyFull).
	GuardBytes int64 `json:"guardBytes"`
	NearlyFull bool  `json:"nearlyFull"`
	// KubeletFilesystem is true when the pool's filesystem holds the
	// kubelet's directory; GuardBelowKubeletEviction when its guard keeps
	// less of it free than the kubelet's default eviction threshold, so
	// that the pool's volumes may make the kubelet evict pods.
	KubeletFilesystem         bool `json:"kubeletFilesystem"`
	GuardBelowKubeletEviction bool `json:"guardBelowKubeletEviction,omitempty"`
	// Snapshots counts the snapshots kept in the data directory, which
	// SnapshotBytes they allocate (blocks shared with their volumes
	// counted in full); CopyMode is how the data directory copies them
	// (reflink or sparse).
	Snapshots     int    `json:"snapshots"`
	SnapshotBytes int64  `json:"snapshotBytes"`
	CopyMode      string `json:"copyMode"`
	// CopyingBytes is what the snapshots asked for and not yet taken are
	// promised: their copies may still take it.
	CopyingBytes int64 `json:"copyingBytes"`
	// Restores are the volumes being copied from a snapshot, each
	// promised its size (in the promised bytes above) until it is made.
	Restores []Restore `json:"restores,omitempty"`
}

// Restore is a volume being copied from a snapshot.
type Restore struct {
	VolumeID   string `json:"volumeID"`
	SnapshotID string `json:"snapshotID"`
	SizeBytes  int64  `json:"sizeBytes"`
	// CopiedBytes of SourceBytes (the snapshot's data) are copied so far.
	CopiedBytes int64 `json:"copiedBytes"`
	SourceBytes int64 `json:"sourceBytes"`
}

// Package status holds what the plugin reports of each volume: the
// reconciler fills it at every pass; the metrics, the HTTP status view and
// the status command read it. It imports nothing of the plugin.
package status

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
	// Staged is true when the stage is fulfilled.
	Staged           bool `json:"staged"`
	PublishesDesired int  `json:"publishesDesired"`
	PublishesActual  int  `json:"publishesActual"`
	// SizeBytes is the device's size; 0 when it is not attached.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Reason and Message are the condition when abnormal.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// LastError is the latest failure, with its attempts and next retry.
	LastError string    `json:"lastError,omitempty"`
	Attempts  int       `json:"attempts,omitempty"`
	NextRetry time.Time `json:"nextRetry,omitzero"`
}

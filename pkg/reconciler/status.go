package reconciler

import (
	"slices"
	"time"

	"github.com/converge-csi/converge/pkg/state"
)

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

// Recorder receives what the reconciler does, for metrics. Its methods
// must be quick and safe for concurrent use.
type Recorder interface {
	// OperationDone reports one operation: its action, its result (ok,
	// error or terminal) and how long it took.
	OperationDone(action, result string, d time.Duration)
	// Repaired reports a repair made without a request asking for it.
	Repaired(action string)
	// PassDone reports one pass, its duration, the volumes as it saw them
	// and how many operations wait out a backoff.
	PassDone(d time.Duration, volumes []VolumeStatus, inBackoff int)
}

type noRecorder struct{}

func (noRecorder) OperationDone(string, string, time.Duration) {}
func (noRecorder) Repaired(string)                             {}
func (noRecorder) PassDone(time.Duration, []VolumeStatus, int) {}

// Status returns the volumes as of the last pass, sorted by ID. It never
// waits for an operation.
func (r *Reconciler) Status() []VolumeStatus {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	return slices.Clone(r.status)
}

// volumeStatus summarises v as observed, with its condition.
func (r *Reconciler) volumeStatus(v *state.Volume, a *actual, cond state.Condition) VolumeStatus {
	s := VolumeStatus{ID: v.ID, PublishesDesired: 0}
	if a.loop != nil {
		s.SizeBytes = a.loop.Size
	}
	deleting := false
	if st := v.Stage; st != nil {
		s.StagingPath, s.Access = st.Path, string(st.Access)
		s.Staged = stageReady(v, a)
		deleting = st.Deleting
	}
	allReady := s.Staged
	for t, p := range v.Publishes {
		if p.Deleting {
			deleting = true
			continue
		}
		s.PublishesDesired++
		if publishReady(v, a, t) {
			s.PublishesActual++
		} else {
			allReady = false
		}
	}
	if f := r.exec.latestFailure(v.ID); f != nil {
		s.LastError, s.Attempts, s.NextRetry = f.err.Message, f.attempts, f.next
	}
	s.Reason, s.Message = cond.Reason, cond.Message
	switch {
	case cond.Health == state.DataLost:
		s.Phase = PhaseDataLoss
	case cond.Health == state.Inaccessible:
		s.Phase = PhaseInaccessible
	case cond.Health == state.Degraded:
		s.Phase = PhaseDegraded
	case s.LastError != "":
		s.Phase = PhaseFailing
	case deleting:
		s.Phase = PhaseTearingDown
	case v.Stage == nil && len(v.Publishes) == 0:
		s.Phase = PhaseIdle
	case allReady:
		s.Phase = PhaseReady
	default:
		s.Phase = PhaseSettingUp
	}
	return s
}

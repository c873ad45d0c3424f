package reconciler

import (
	"slices"
	"time"

	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

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
	PassDone(d time.Duration, volumes []volstatus.VolumeStatus, inBackoff int)
	// Frozen reports how long a snapshot held a volume's filesystem
	// frozen.
	Frozen(d time.Duration)
	// EarlyStart reports what a request's early start did (early.go):
	// EarlyStarted, EarlyWaited, EarlyNothingToDo or EarlyLeftToPass.
	EarlyStart(outcome string)
}

// The outcomes of an early start (Recorder.EarlyStart).
const (
	// EarlyStarted: it started the volume's step.
	EarlyStarted = "started"
	// EarlyWaited: an operation of the volume ran; the volume is started
	// again when it ends.
	EarlyWaited = "waited"
	// EarlyNothingToDo: the volume needed nothing (the pass reports it).
	EarlyNothingToDo = "nothing_to_do"
	// EarlyLeftToPass: the step is the pass's (a stage, a group snapshot,
	// no device known, a backoff, start-up not finished); the reason is
	// logged at V(4).
	EarlyLeftToPass = "left_to_pass"
)

type noRecorder struct{}

func (noRecorder) OperationDone(string, string, time.Duration)           {}
func (noRecorder) Repaired(string)                                       {}
func (noRecorder) PassDone(time.Duration, []volstatus.VolumeStatus, int) {}
func (noRecorder) Frozen(time.Duration)                                  {}
func (noRecorder) EarlyStart(string)                                     {}

// Status returns the volumes as of the last pass, sorted by ID. It never
// waits for an operation.
func (r *Reconciler) Status() []volstatus.VolumeStatus {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	return slices.Clone(r.status)
}

// volumeStatus summarises v as observed, with its condition.
func (r *Reconciler) volumeStatus(v *state.Volume, a *actual, cond state.Condition) volstatus.VolumeStatus {
	s := volstatus.VolumeStatus{ID: v.ID, Provisioning: string(v.Provisioning)}
	if !a.static {
		s.Pool = state.PoolOf(v)
	}
	if a.loop != nil {
		s.SizeBytes = a.loop.Size
	}
	if l := v.WantsIOLimits(); !l.IsZero() {
		s.IOLimitsDesired = &volstatus.IOLimits{ReadIOPS: l.ReadIOPS, WriteIOPS: l.WriteIOPS, ReadBPS: l.ReadBPS, WriteBPS: l.WriteBPS}
	}
	if l := ioLimitsApplied(v, a); l != nil {
		s.IOLimitsApplied = &volstatus.IOLimits{ReadIOPS: l.ReadIOPS, WriteIOPS: l.WriteIOPS, ReadBPS: l.ReadBPS, WriteBPS: l.WriteBPS}
	}
	deleting := false
	if st := v.Stage; st != nil {
		s.StagingPath, s.Access = st.Path, string(st.Access)
		s.StageReady = stageReady(v, a)
		deleting = st.Deleting
	}
	allReady := s.StageReady
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
	s.Reason, s.Message = string(cond.Reason), cond.Message
	switch {
	case cond.Health == state.DataLost:
		s.Phase = volstatus.PhaseDataLoss
	case cond.Health == state.Inaccessible:
		s.Phase = volstatus.PhaseInaccessible
	case cond.Health == state.Degraded:
		s.Phase = volstatus.PhaseDegraded
	case s.LastError != "":
		s.Phase = volstatus.PhaseFailing
	case deleting:
		s.Phase = volstatus.PhaseTearingDown
	case v.Stage == nil && len(v.Publishes) == 0:
		s.Phase = volstatus.PhaseIdle
	case allReady:
		s.Phase = volstatus.PhaseReady
	default:
		s.Phase = volstatus.PhaseSettingUp
	}
	return s
}

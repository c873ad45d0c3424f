package reconciler

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/reconciler/claim"
	"github.com/converge-csi/converge/pkg/state"
)

// hold is why an action may not start now.
type hold int

const (
	// notHeld: the action may start.
	notHeld hold = iota
	// heldRunning: an operation of the volume runs.
	heldRunning
	// heldStale: an operation of the volume finished after the
	// observation the action was decided on; that operation's own kick
	// brings a fresher one.
	heldStale
	// heldBackoff: the action failed and its backoff has not ended, or
	// failed for good (final) and waits for its intent to change.
	heldBackoff
)

// holdOf is the hold of a volume that claim.Set reports as h.
func holdOf(h claim.Hold) hold {
	switch h {
	case claim.Running:
		return heldRunning
	case claim.Stale:
		return heldStale
	}
	return notHeld
}

// take claims every volume act of volume id holds (id, and a group
// snapshot's members) for its operation, unless one of them is held or
// changed since the observation made after epoch, or act waits out its
// backoff: the one way a pass and an early start alike take a volume.
// On success the caller must start the operation (startOp, beginOp), which
// releases the claim at its end; otherwise it returns why, and when a
// backoff ends.
func (r *Reconciler) take(id string, act action, epoch claim.Epoch) (*claim.Claim, hold, time.Time) {
	if h, retryAt := r.held(id, act, epoch); h != notHeld {
		return nil, h, retryAt
	}
	// The backoff, read before the claim, cannot be older than it: an
	// operation records its backoff before it releases its claim, and one
	// released after epoch fails the claim (heldStale).
	c, h := r.claims.Try(epoch, act.volumes(id)...)
	return c, holdOf(h), time.Time{}
}

// held is take's answer for volume id alone, without claiming it.
func (r *Reconciler) held(id string, act action, epoch claim.Epoch) (hold, time.Time) {
	if h := r.claims.State(id, epoch); h != claim.Free {
		return holdOf(h), time.Time{}
	}
	if backingOff, retryAt := r.exec.backingOff(id, act); backingOff {
		return heldBackoff, retryAt
	}
	return notHeld, time.Time{}
}

// startOp runs the operation for act, whose volumes c holds, in the
// executor, on a goroutine of its own; then, called once its end is
// carried out, is the caller's (the early start's afterOp).
func (r *Reconciler) startOp(ctx context.Context, c *claim.Claim, v *state.Volume, a *actual, act action, then func(id string, act action)) {
	r.exec.spawn(r.beginOp(ctx, c, v, a, act, then))
}

// beginOp readies the operation for act, whose volumes c holds, in the
// executor and returns the function that runs it; then is as startOp's.
func (r *Reconciler) beginOp(ctx context.Context, c *claim.Claim, v *state.Volume, a *actual, act action, then func(id string, act action)) func() {
	spec := act.kind.spec()
	logger := klog.FromContext(ctx).WithValues("volumeID", v.ID, "action", spec.name)
	if act.target != "" {
		logger = logger.WithValues("targetPath", act.target)
	}
	logger.V(2).Info("Starting operation", "reason", act.reason, "generation", act.generation)
	// A stage or publish of an intent already seen fulfilled makes again
	// what was lost; a kind that drifts, what the diff saw someone undo.
	r.fulfilledMu.Lock()
	repairing := spec.fulfils && act.generation != 0 && r.fulfilled[v.ID][act.key()] == act.generation || spec.drifts && act.drift
	r.fulfilledMu.Unlock()
	begin := r.cfg.Clock.Now()
	// Every action runs here, between two failpoints: a crash before it
	// leaves what the last pass saw, one after it leaves its work done and
	// neither recorded nor answered (see docs/testing.md).
	op := func() outcome {
		// gofail: var reconcilerBeforeAction struct{}
		err := spec.run(klog.NewContext(ctx, logger), r, v, a, act)
		// gofail: var reconcilerAfterAction struct{}
		out := outcomeOf(act, err, repairing)
		out.repair = repairing && spec.drifts
		return out
	}
	return r.exec.begin(ctx, c, v.ID, act, op, func(out outcome, f *failure) {
		if out.err == nil && (repairing || spec.counted) {
			r.cfg.Recorder.Repaired(spec.name)
		}
		r.cfg.Recorder.OperationDone(spec.name, out.result(), r.cfg.Clock.Since(begin))
		r.carryOut(logger, v, act, out, f)
		then(v.ID, act)
	})
}

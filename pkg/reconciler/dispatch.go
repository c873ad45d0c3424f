package reconciler

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/state"
)

// startOp runs the operation for act in the executor, on a goroutine of
// its own.
func (r *Reconciler) startOp(ctx context.Context, v *state.Volume, a *actual, act action) {
	r.exec.spawn(r.beginOp(ctx, v, a, act))
}

// beginOp readies the operation for act in the executor and returns the
// function that runs it.
func (r *Reconciler) beginOp(ctx context.Context, v *state.Volume, a *actual, act action) func() {
	spec := act.kind.spec()
	logger := klog.FromContext(ctx).WithValues("volumeID", v.ID, "action", spec.name)
	if act.target != "" {
		logger = logger.WithValues("targetPath", act.target)
	}
	logger.V(2).Info("Starting operation", "reason", act.reason, "generation", act.generation)
	// A stage or publish of an intent already seen fulfilled makes again
	// what was lost.
	r.fulfilledMu.Lock()
	repairing := spec.fulfils && act.generation != 0 && r.fulfilled[v.ID][act.key()] == act.generation
	r.fulfilledMu.Unlock()
	begin := r.cfg.Clock.Now()
	// Every action runs here, between two failpoints: a crash before it
	// leaves what the last pass saw, one after it leaves its work done and
	// neither recorded nor answered (see docs/testing.md).
	op := func() outcome {
		// gofail: var reconcilerBeforeAction struct{}
		err := spec.run(ctx, r, v, a, act)
		// gofail: var reconcilerAfterAction struct{}
		return outcomeOf(act, err, repairing)
	}
	return r.exec.begin(ctx, v.ID, act, op, func(out outcome, f *failure) {
		if out.err == nil && (repairing || spec.counted) {
			r.cfg.Recorder.Repaired(spec.name)
		}
		r.cfg.Recorder.OperationDone(spec.name, out.result(), r.cfg.Clock.Since(begin))
		r.carryOut(logger, v, act, out, f)
		r.afterOp(v.ID, act)
	})
}

package reconciler

import (
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// failure is the backoff state of the latest failed action of a volume.
type failure struct {
	act      action
	attempts int
	next     time.Time
	err      *classified.Error
	// final is true when retrying cannot help: the action is not tried
	// again until its intent changes (a new generation is a new action).
	final bool
}

// effect is what the end of an operation calls for.
type effect int

const (
	// succeeded: a fulfilling kind's intent answers now (as the kubelet
	// marks a volume mounted when its operation succeeds), and the pass
	// that verifies it comes a moment later.
	succeeded effect = iota + 1
	// retried: the failure may pass; the action is tried again after a
	// backoff.
	retried
	// keptLost: a stage that was fulfilled lost its data. It is kept,
	// retried with backoff and reported as DATA_LOSS, never formatted:
	// no request waits for it, and rolling it back would hide the loss
	// from the pods' owners.
	keptLost
	// held: the failure is final; the intent stays and the action is not
	// tried again until the intent's generation changes.
	held
	// heldAndAnswered: as held, and the final answers the intent's request.
	heldAndAnswered
	// withdrawn: a set-up failed for good. Its final answers its request
	// and the intent is withdrawn, so the following passes roll it back; a
	// failed stage takes the publishes on top of it along, since they can
	// no longer be fulfilled. Should the withdrawal not be recorded, the
	// action is tried again.
	withdrawn
	// keptStaged: an unstage was refused for good. Its final answers its
	// request and the withdrawal of the stage is cancelled: the volume
	// stays staged.
	keptStaged
)

// outcome is what an operation's end calls for, and the error behind it.
type outcome struct {
	effect effect
	err    *classified.Error // nil when the operation succeeded
	// repair: the operation undid a drift (kindSpec.drifts), and is backed
	// off as a repair is, even when it succeeds.
	repair bool
}

// final reports whether retrying the action cannot help: it is then not
// tried again until its intent changes (a new generation is a new action).
func (o outcome) final() bool {
	return o.effect == held || o.effect == heldAndAnswered || o.effect == keptStaged
}

// result is the operation's result as the metrics name it.
func (o outcome) result() string {
	switch {
	case o.err == nil:
		return "ok"
	case o.err.Terminal:
		return "terminal"
	}
	return "error"
}

// outcomeOf decides what the end of act with err calls for. repairing is
// true when act makes again what was fulfilled and then lost.
func outcomeOf(act action, err error, repairing bool) outcome {
	if err == nil {
		return outcome{effect: succeeded}
	}
	e := classified.AsError(err)
	switch {
	case !e.Terminal:
		return outcome{effect: retried, err: e}
	case repairing && act.key() == state.StageKey && e.Kind == classified.KindDataLoss:
		return outcome{effect: keptLost, err: e}
	}
	return outcome{effect: act.kind.spec().final, err: e}
}

// carryOut does what the outcome of an operation of v calls for: the one
// place an operation's end takes effect. f is the action's backoff state
// after a failure.
func (r *Reconciler) carryOut(logger klog.Logger, v *state.Volume, act action, out outcome, f *failure) {
	e := out.err
	switch out.effect {
	case succeeded:
		// The pass that verifies what the operation did, and takes the
		// volume's next step, comes a moment later (KickSoon).
		r.KickSoon()
		if act.kind.spec().fulfils {
			path := act.target
			if act.key() == state.StageKey {
				path = v.Stage.Path
			}
			r.cfg.Store.Fulfilled(v.ID, act.key(), act.generation, path)
		}
		logger.Info("Operation succeeded", "reason", act.reason, "generation", act.generation)
		return
	case retried:
		logger.Error(e, "Operation failed; will retry", "attempts", f.attempts, "nextRetry", f.next)
	case keptLost:
		logger.Error(e, "Volume lost its data; keeping the stage, never formatting it", "attempts", f.attempts, "nextRetry", f.next)
	case held:
		logger.Error(e, "Operation failed for good; not retrying it until its intent changes", "kind", e.Kind.String())
	case heldAndAnswered:
		// The expansion stays recorded (the device may have grown).
		logger.Error(e, "Operation failed for good; not retrying it until its intent changes", "kind", e.Kind.String())
		r.cfg.Store.SetTerminalFailure(v.ID, act.key(), state.TerminalFailure{Generation: act.generation, Err: e})
	case withdrawn, keptStaged:
		if out.effect == withdrawn {
			logger.Error(e, "Operation failed for good; withdrawing the intent", "kind", e.Kind.String())
		} else {
			logger.Error(e, "Unstage refused; the volume stays staged", "kind", e.Kind.String())
		}
		// The final is recorded first, so that a waiter never sees its
		// intent change without knowing why.
		r.cfg.Store.SetTerminalFailure(v.ID, act.key(), state.TerminalFailure{Generation: act.generation, Err: e})
		if _, err := r.cfg.Store.Update(v.ID, func(v *state.Volume) error {
			r.applyTerminal(v, act, out)
			return nil
		}); err != nil {
			logger.Error(err, "Cannot record the outcome; will retry the operation")
		}
	}
	// The outcome is recorded before the pass that acts on it is kicked.
	r.Kick()
}

// applyTerminal changes v's intents as a final failure of act calls for (withdrawn
// or keptStaged), if they are still those act served.
func (r *Reconciler) applyTerminal(v *state.Volume, act action, out outcome) {
	switch {
	case out.effect == keptStaged:
		v.KeepStaged(act.generation)
	case act.kind.spec().serves == forSnapshot:
		v.ForgetSnapshot(act.target, act.generation)
	case act.key() == state.StageKey:
		publishes, _ := v.WithdrawStage(act.generation)
		for t, gen := range publishes {
			// Recorded before the commit, so that no waiter sees its
			// intent withdrawn without knowing why.
			r.cfg.Store.SetTerminalFailure(v.ID, state.PublishKey(t), state.TerminalFailure{Generation: gen,
				Err: classified.Terminalf(out.err.Kind, "staging failed: %s", out.err.Message)})
		}
	default:
		v.WithdrawPublish(act.target, act.generation)
	}
}

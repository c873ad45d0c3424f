package nodeserver

import (
	"context"
	"errors"
	"fmt"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// check inspects a volume's record and results. It returns done with the
// answer of the RPC, or not done with a note on what is still pending.
type check func(v *state.Volume) (done bool, err error, pending string)

// wait blocks until c is done or the request's deadline (or MaxWait when it
// has none) ends; then it answers DeadlineExceeded with what is pending, and
// the reconciler keeps working so that the kubelet's retry finds the result.
func (s *Server) wait(ctx context.Context, id string, c check) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.MaxWait)
		defer cancel()
	}
	pending := "waiting for the reconciler"
	for {
		changed := s.cfg.Store.Watch(id)
		v, err := s.cfg.Store.Get(id)
		if errors.Is(err, state.ErrNotFound) {
			v, err = &state.Volume{ID: id}, nil
		}
		if err != nil {
			return err
		}
		done, err, p := c(v)
		if done {
			return err
		}
		if p != "" {
			pending = p
		}
		select {
		case <-changed:
		case <-ctx.Done():
			kind := classified.KindDeadlineExceeded
			if errors.Is(ctx.Err(), context.Canceled) {
				kind = classified.KindCanceled
			}
			return classified.Errorf(kind, "volume %s not converged yet, still in progress: %s", id, pending)
		}
	}
}

// progress describes the latest result of an intent generation.
func (s *Server) progress(id string, key state.IntentKey, gen int64) (ready bool, pending string) {
	r, ok := s.cfg.Store.Result(id, key)
	if !ok || r.Generation != gen {
		return false, ""
	}
	if r.Ready {
		return true, ""
	}
	if r.Err != nil {
		return false, fmt.Sprintf("attempt %d failed: %s; next retry at %s", r.Attempts, r.Err.Message, r.NextRetry.Format("15:04:05.000"))
	}
	return false, r.Waiting
}

// setupCheck waits for a set-up intent (stage or publish) of generation gen:
// done when the reconciler reports it fulfilled; when it failed terminally,
// done with its failure once the rollback has removed it; ABORTED when a
// later request changed or withdrew it.
func (s *Server) setupCheck(id string, key state.IntentKey, gen int64, live func(v *state.Volume) (gen int64, deleting, present bool)) check {
	return func(v *state.Volume) (bool, error, string) {
		g, deleting, present := live(v)
		if present && g == gen && !deleting {
			if r, ok := s.cfg.Store.Result(id, key); ok && r.Generation == gen && !r.Ready && r.Err != nil && r.Err.Kind == classified.KindResourceExhausted {
				// Out of loop devices or space: say so now rather than at
				// the deadline. The intent stays and is retried; the
				// kubelet retries too.
				return true, r.Err, ""
			}
			ready, pending := s.progress(id, key, gen)
			return ready, nil, pending
		}
		if final := s.cfg.Store.TerminalFailureFor(id, key, gen); final != nil {
			if present && deleting {
				return false, nil, "rolling back after: " + final.Message
			}
			return true, final, ""
		}
		return true, classified.Errorf(classified.KindAborted, "volume %s: request superseded by a later one", id), ""
	}
}

// teardownCheck waits for an intent withdrawn at generation gen to be
// verified gone. When the reconciler refused the teardown it answers with
// the refusal; when a later request revived the intent, ABORTED.
func (s *Server) teardownCheck(id string, key state.IntentKey, gen int64, live func(v *state.Volume) (gen int64, deleting, present bool)) check {
	return func(v *state.Volume) (bool, error, string) {
		g, deleting, present := live(v)
		switch {
		case !present:
			return true, nil, ""
		case deleting:
			_, pending := s.progress(id, key, g)
			return false, nil, pending
		}
		if final := s.cfg.Store.TerminalFailureFor(id, key, gen); final != nil {
			return true, final, ""
		}
		return true, classified.Errorf(classified.KindAborted, "volume %s: request superseded by a later one", id), ""
	}
}

func liveStage(v *state.Volume) (int64, bool, bool) {
	if v.Stage == nil {
		return 0, false, false
	}
	return v.Stage.Generation, v.Stage.Deleting, true
}

func livePublish(target string) func(v *state.Volume) (int64, bool, bool) {
	return func(v *state.Volume) (int64, bool, bool) {
		p := v.Publishes[target]
		if p == nil {
			return 0, false, false
		}
		return p.Generation, p.Deleting, true
	}
}

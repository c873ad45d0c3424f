package reconciler

import (
	"context"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/locks"
	"github.com/converge-csi/converge/pkg/reconciler/claim"
	"github.com/converge-csi/converge/pkg/state"
)

// executor runs operations in two bounded pools, with exponential backoff
// per volume and action. It does not decide which volume an operation may
// hold: the caller claims it (claim.Set, see take) and hands the claim
// over, and the executor releases it when the operation ends, once its
// backoff is recorded.
type executor struct {
	clock     clock.Clock
	initial   time.Duration
	max       time.Duration
	fastSlots chan struct{}
	slowSlots chan struct{}
	wg        sync.WaitGroup
	// spawn runs an operation; in production on its own goroutine. The
	// simulation test runs operations inline to make them deterministic.
	spawn func(func())

	// mu guards failures and repairs.
	mu       locks.Mutex
	failures map[string]*failure
	// repairs counts, per volume and repair step (action.String()), the
	// repairs since the volume was last healthy, and holds off the next
	// one (see actionKind.repair).
	repairs map[string]map[string]*failure
}

func newExecutor(c clock.Clock, fast, slow int, initial, max time.Duration, spawn func(func())) *executor {
	if spawn == nil {
		spawn = func(f func()) { go f() }
	}
	return &executor{
		clock:     c,
		initial:   initial,
		max:       max,
		fastSlots: make(chan struct{}, fast),
		slowSlots: make(chan struct{}, slow),
		spawn:     spawn,
		failures:  map[string]*failure{},
		repairs:   map[string]map[string]*failure{},
	}
}

// sameAction reports whether a and b are the same step of the same intent,
// so that backoff of one applies to the other.
func sameAction(a, b action) bool {
	return a.kind == b.kind && a.target == b.target && a.generation == b.generation
}

// backingOff reports whether act of volume id waits out its backoff, and
// when that ends: it failed and may be tried again then, or failed for
// good (final; retryAt is zero) and waits for its intent to change, or it
// is a repair made lately.
func (e *executor) backingOff(id string, act action) (bool, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.failures[id]; f != nil && sameAction(f.act, act) && f.final {
		return true, time.Time{}
	}
	if f := e.failures[id]; f != nil && sameAction(f.act, act) && e.clock.Now().Before(f.next) {
		return true, f.next
	}
	if f := e.repairs[id][act.String()]; f != nil && e.clock.Now().Before(f.next) {
		return true, f.next
	}
	return false, time.Time{}
}

// healthy resets the repair backoff of a volume seen fully converged.
func (e *executor) healthy(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.repairs, id)
}

// lastFailure returns the latest failure of the action serving key at
// generation gen, or nil.
func (e *executor) lastFailure(id string, key state.IntentKey, gen int64) *failure {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.failures[id]; f != nil && f.act.key() == key && f.act.generation == gen {
		c := *f
		return &c
	}
	return nil
}

// latestFailure returns the latest failed action of a volume, or nil.
func (e *executor) latestFailure(id string) *failure {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.failures[id]; f != nil {
		c := *f
		return &c
	}
	return nil
}

// inBackoff counts the volumes whose latest failed action waits out its
// backoff.
func (e *executor) inBackoff() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	now := e.clock.Now()
	for _, f := range e.failures {
		if now.Before(f.next) {
			n++
		}
	}
	return n
}

// begin readies op for volume id, whose claim c of the volumes act holds
// (take) it takes over: it counts the operation (wait waits for it) and
// returns the function that runs it, for the caller to call on a goroutine
// of its choice (spawn, or its own). The operation waits for a slot of its
// pool or for ctx; done is called with its outcome after the backoff state
// is updated and c released.
func (e *executor) begin(ctx context.Context, c *claim.Claim, id string, act action, op func() outcome, done func(outcome, *failure)) func() {
	e.wg.Add(1)
	return func() {
		defer e.wg.Done()
		slots := e.fastSlots
		if act.kind.spec().slow {
			slots = e.slowSlots
		}
		var out outcome
		select {
		case slots <- struct{}{}:
			out = contained(id, act, op)
			<-slots
		case <-ctx.Done():
			out = outcome{effect: retried, err: classified.AsError(ctx.Err())}
		}
		f := e.finish(id, act, out)
		// Released once the backoff is recorded: whoever claims the
		// volume next sees it, and whoever read its epoch before finds
		// the volume stale.
		c.Release()
		done(out, f)
	}
}

// contained runs op and turns its panic into a failure of act, retried
// with backoff as any failure that may pass: the volume reports it, the
// log holds its stack, and the loop and every other volume go on.
// Crashing the plugin instead would replay the same operation at the start
// and crash again, taking every volume's repairs and answers down with it.
func contained(id string, act action, op func() outcome) (out outcome) {
	defer func() {
		if p := recover(); p != nil {
			klog.Background().Error(nil, "Operation panicked; will retry", "volumeID", id, "action", act.String(), "panic", p, "stack", string(debug.Stack()))
			out = outcome{effect: retried, err: classified.Errorf(classified.KindInternal, "%s panicked: %v (the plugin's log holds the stack)", act, p)}
		}
	}()
	return op()
}

// finish records the outcome of act in the volume's backoff.
func (e *executor) finish(id string, act action, out outcome) *failure {
	e.mu.Lock()
	defer e.mu.Unlock()
	if out.err == nil {
		if f := e.failures[id]; f != nil && sameAction(f.act, act) {
			delete(e.failures, id)
		}
		if act.kind.spec().repair || out.repair {
			if e.repairs[id] == nil {
				e.repairs[id] = map[string]*failure{}
			}
			f := e.repairs[id][act.String()]
			if f == nil {
				f = &failure{act: act}
				e.repairs[id][act.String()] = f
			}
			f.attempts++
			f.next = e.clock.Now().Add(backoff(e.initial, e.max, f.attempts))
		}
		return nil
	}
	f := e.failures[id]
	if f == nil || !sameAction(f.act, act) {
		f = &failure{act: act}
		e.failures[id] = f
	}
	f.attempts++
	f.err = out.err
	f.next = e.clock.Now().Add(backoff(e.initial, e.max, f.attempts))
	f.final = out.final()
	c := *f
	return &c
}

// prune drops the failure of volume id unless its action is among acts,
// the actions the volume needs now: a failure of an action no longer
// planned (its intent changed or was withdrawn, or it was done otherwise)
// is history, and must neither be reported nor hold anything back.
func (e *executor) prune(id string, acts []action) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.failures[id]
	if f != nil && !slices.ContainsFunc(acts, func(a action) bool { return sameAction(a, f.act) }) {
		delete(e.failures, id)
	}
}

// forget drops the backoff state of the volumes that have no record any
// more (keep refuses them).
func (e *executor) forget(keep func(id string) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range e.failures {
		if !keep(id) {
			delete(e.failures, id)
		}
	}
	for id := range e.repairs {
		if !keep(id) {
			delete(e.repairs, id)
		}
	}
}

// wait blocks until every started operation has finished.
func (e *executor) wait() { e.wg.Wait() }

// backoff returns the delay before attempt n+1: initial doubled per failed
// attempt, capped at max.
func backoff(initial, max time.Duration, attempts int) time.Duration {
	d := initial
	for i := 1; i < attempts && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

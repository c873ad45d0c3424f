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

// executor runs operations: at most one per volume, in two bounded pools,
// with exponential backoff per volume and action.
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

	// mu guards running, failures, repairs, finished and seq.
	mu       locks.Mutex
	running  map[string]action
	failures map[string]*failure
	// seq counts finished operations; finished maps a volume to the seq of
	// its last finished operation. A pass whose observation is older than
	// that must not act on the volume: it would redo what the operation
	// just did (attach a second loop device, say).
	seq      uint64
	finished map[string]uint64
	// repairs counts, per volume and repair step (action.String()), the
	// repairs since the volume was last healthy, and holds off the next
	// one (see actionKind.repair).
	repairs map[string]map[string]*failure
}

func newExecutor(c clock.Clock, fast, slow int, initial, max time.Duration) *executor {
	return &executor{
		clock:     c,
		initial:   initial,
		max:       max,
		fastSlots: make(chan struct{}, fast),
		slowSlots: make(chan struct{}, slow),
		spawn:     func(f func()) { go f() },
		running:   map[string]action{},
		finished:  map[string]uint64{},
		failures:  map[string]*failure{},
		repairs:   map[string]map[string]*failure{},
	}
}

// sameAction reports whether a and b are the same step of the same intent,
// so that backoff of one applies to the other.
func sameAction(a, b action) bool {
	return a.kind == b.kind && a.target == b.target && a.generation == b.generation
}

// epoch returns the count of finished operations, to be taken before an
// observation and given to blocked.
func (e *executor) epoch() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}

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

// blocked reports whether act of volume id must not start now: because an
// operation of id is running, or finished after the observation taken at
// epoch (the operation's own kick brings a fresher pass), or because act
// failed and its backoff has not ended (then retryAt is when it may).
func (e *executor) blocked(id string, act action, epoch uint64) (busy bool, retryAt time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h, retryAt := e.heldLocked(id, act, epoch)
	return h != notHeld, retryAt
}

// heldLocked is blocked's answer with its reason; e.mu is held.
func (e *executor) heldLocked(id string, act action, epoch uint64) (hold, time.Time) {
	if _, ok := e.running[id]; ok {
		return heldRunning, time.Time{}
	}
	if e.finished[id] > epoch {
		return heldStale, time.Time{}
	}
	if f := e.failures[id]; f != nil && sameAction(f.act, act) && f.final {
		return heldBackoff, time.Time{}
	}
	if f := e.failures[id]; f != nil && sameAction(f.act, act) && e.clock.Now().Before(f.next) {
		return heldBackoff, f.next
	}
	if f := e.repairs[id][act.String()]; f != nil && e.clock.Now().Before(f.next) {
		return heldBackoff, f.next
	}
	return notHeld, time.Time{}
}

// claim marks every volume act of volume id holds (id, and a group
// snapshot's members) as running, if none of them is held: the check and
// the mark are one step, so that of the full pass and a request's early
// start, which decide at the same time, one only starts an operation on a
// volume. A member is held when an operation of it runs or finished after
// the observation taken at epoch. On success the caller must start the
// operation (start); otherwise it returns why, and when a backoff ends.
func (e *executor) claim(id string, act action, epoch uint64) (hold, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if h, retryAt := e.heldLocked(id, act, epoch); h != notHeld {
		return h, retryAt
	}
	for _, m := range act.members {
		if _, ok := e.running[m.v.ID]; ok {
			return heldRunning, time.Time{}
		}
		if e.finished[m.v.ID] > epoch {
			return heldStale, time.Time{}
		}
	}
	for _, held := range act.volumes(id) {
		e.running[held] = act
	}
	return notHeld, time.Time{}
}

// busy reports, in one step, whether an operation holds volume id now
// (heldRunning) or one finished after the observation taken at epoch
// (heldStale); notHeld when neither.
func (e *executor) busy(id string, epoch uint64) hold {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.running[id]; ok {
		return heldRunning
	}
	if e.finished[id] > epoch {
		return heldStale
	}
	return notHeld
}

// runs reports whether an operation holds volume id.
func (e *executor) runs(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.running[id]
	return ok
}

// free reports whether volume id runs no operation and none of its
// finished after the observation taken at epoch: a group snapshot may
// then hold it.
func (e *executor) free(id string, epoch uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, running := e.running[id]
	return !running && e.finished[id] <= epoch
}

// stale reports whether an operation of id finished after the observation
// taken at epoch.
func (e *executor) stale(id string, epoch uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.finished[id] > epoch
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

// idle reports whether no operation is running.
func (e *executor) idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.running) == 0
}

// start runs op for volume id in the background; done is called with its
// outcome after the backoff state is updated. The caller must have claimed
// the volumes (claim). The operation waits for a slot of its pool or for
// ctx.
func (e *executor) start(ctx context.Context, id string, act action, op func() outcome, done func(outcome, *failure)) {
	e.spawn(e.begin(ctx, id, act, op, done))
}

// begin is start without the goroutine: it counts the operation (wait
// waits for it) and returns the function that runs it, for the caller to
// call on a goroutine of its choice.
func (e *executor) begin(ctx context.Context, id string, act action, op func() outcome, done func(outcome, *failure)) func() {
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
			out = outcome{retried, classified.AsError(ctx.Err())}
		}
		f := e.finish(id, act, out)
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
			out = outcome{retried, classified.Errorf(classified.KindInternal, "%s panicked: %v (the plugin's log holds the stack)", act, p)}
		}
	}()
	return op()
}

// finish records the outcome of act and releases the volume.
func (e *executor) finish(id string, act action, out outcome) *failure {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	for _, held := range act.volumes(id) {
		delete(e.running, held)
		e.finished[held] = e.seq
	}
	if out.err == nil {
		if f := e.failures[id]; f != nil && sameAction(f.act, act) {
			delete(e.failures, id)
		}
		if act.kind.spec().repair {
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

// forget drops the backoff state of a volume that has no record any more,
// seen by the pass whose observation began at epoch.
func (e *executor) forget(keep func(id string) bool, epoch uint64) {
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
	for id, seq := range e.finished {
		// An operation that finished after the pass's observation began
		// is kept: an early start whose observation is older than it
		// must still see it (the pass's list of volumes may be older
		// than that early start's record).
		if !keep(id) && seq <= epoch {
			delete(e.finished, id)
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

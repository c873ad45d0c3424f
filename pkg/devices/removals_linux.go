package devices

import (
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/converge-csi/converge/pkg/locks"
)

const (
	// maxQueuedRemovals bounds the numbers waiting for their removal;
	// past it, Detach removes the number itself. A teardown of a thousand
	// volumes at once queues at most a thousand.
	maxQueuedRemovals = 4096
	// maxRemovalsAtOnce bounds the removals under way. One removal waits
	// for the kernel to retire the disk (most of it waiting, not
	// working), and removals under way at once share those waits.
	maxRemovalsAtOnce = 128
)

// removalQuiet and removalMaxWait set when waiting removals start: once
// no detach has come for removalQuiet, or once the oldest has waited
// removalMaxWait. A teardown of many volumes detaches one device after
// another, each a moment after the one before; its removals (each some
// CPU of the kernel's retiring a disk) then come after the burst rather
// than taking the CPUs from its unmounts, detaches and answers; a shorter
// pause began removals inside the burst (BenchmarkBurst;
// docs/performance.md, "Figures behind the code's choices").
const (
	removalQuiet   = 20 * time.Millisecond
	removalMaxWait = 250 * time.Millisecond
)

// Removals removes the numbers of the thick devices LoopDevices.Detach
// left unattached, each on a goroutine of its own (maxRemovalsAtOnce at
// most), so that the removal is on no request's path: the unstage that
// detached the device is answered while its number waits, and removals
// start once detaches pause (removalQuiet, removalMaxWait). Meanwhile the
// number can be offered to another loop user with its discards off, as in
// the moment between a detach and a removal made at once, but for longer
// (a removal takes tens of milliseconds, and waits for the pause), and a
// crash loses the removals not yet made, leaving those numbers with
// discards off until their next user's detach. A removal can also meet
// another user between its LOOP_CTL_GET_FREE and its attach of the number,
// which then fails once (converge's own attach takes another). converge's
// own thin attaches remove a number left with discards off and take
// another.
type Removals struct {
	slots chan struct{}
	wg    sync.WaitGroup
	clock clock.WithDelayedExecution
	// remove removes one number (removeNumber; the tests change it), and
	// quiet and maxWait are removalQuiet and removalMaxWait.
	remove         func(detached)
	quiet, maxWait time.Duration
	// mu guards everything below: nothing is added after Close.
	mu     locks.Mutex
	queued int
	closed bool
	// waiting holds the numbers whose removal has not started, the oldest
	// added at oldest; timer starts them.
	waiting []detached
	oldest  time.Time
	timer   clock.Timer
}

// NewRemovals returns Removals ready to take numbers, timed by clk.
func NewRemovals(clk clock.WithDelayedExecution) *Removals {
	return &Removals{
		clock:   clk,
		slots:   make(chan struct{}, maxRemovalsAtOnce),
		remove:  removeNumber,
		quiet:   removalQuiet,
		maxWait: removalMaxWait,
	}
}

// add queues the removal of d's number, to start once detaches pause;
// false when too many wait or Removals is closed, and the caller removes
// it.
func (r *Removals) add(d detached) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.queued >= maxQueuedRemovals {
		return false
	}
	r.queued++
	r.wg.Add(1)
	now := r.clock.Now()
	if len(r.waiting) == 0 {
		r.oldest = now
	}
	r.waiting = append(r.waiting, d)
	delay := min(r.quiet, max(0, r.maxWait-now.Sub(r.oldest)))
	if r.timer == nil {
		r.timer = r.clock.AfterFunc(delay, r.startWaiting)
	} else {
		r.timer.Reset(delay)
	}
	return true
}

// startNow starts the removals waiting without waiting for detaches to
// pause: a thin attach calls it, as the numbers waiting keep their
// discards off and the kernel offers the lowest free number first, which
// the attach would otherwise claim, find stuck and remove one by one.
func (r *Removals) startNow() {
	r.mu.Lock()
	if r.timer != nil {
		r.timer.Stop()
	}
	r.mu.Unlock()
	r.startWaiting()
}

// startWaiting starts the removals waiting, side by side.
func (r *Removals) startWaiting() {
	r.mu.Lock()
	batch := r.waiting
	r.waiting = nil
	r.mu.Unlock()
	for _, d := range batch {
		go func() {
			defer r.wg.Done()
			r.slots <- struct{}{}
			r.remove(d)
			<-r.slots
			r.mu.Lock()
			r.queued--
			r.mu.Unlock()
		}()
	}
}

// Close starts the removals still waiting and returns once the numbers
// taken are removed; later detaches remove their numbers themselves.
func (r *Removals) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.startNow()
	r.wg.Wait()
}

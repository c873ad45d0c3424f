package devices

import "sync"

const (
	// maxQueuedRemovals bounds the numbers waiting for their removal;
	// past it, Detach removes the number itself. A teardown of a thousand
	// volumes at once queues at most a thousand.
	maxQueuedRemovals = 4096
	// maxRemovalsAtOnce bounds the removals under way. One removal waits
	// for the kernel to retire the disk (tens of milliseconds, most of it
	// waiting, not working), and removals under way at once share those
	// waits: one after the other, a hundred took 4.7 s here; side by side,
	// as each unstage made its own before, they took about 50 ms.
	maxRemovalsAtOnce = 128
)

// Removals removes the numbers of the thick devices LoopDevices.Detach
// left unattached, each on a goroutine of its own (maxRemovalsAtOnce at
// most), so that the removal is on no request's path: the unstage that
// detached the device is answered while its number waits. Meanwhile the
// number can be offered to another loop user with its discards off, as in
// the moment between a detach and a removal made at once, but for longer
// (a removal takes tens of milliseconds), and a crash loses the removals
// not yet made, leaving those numbers with discards off until their next
// user's detach. A removal can also meet another user between its
// LOOP_CTL_GET_FREE and its attach of the number, which then fails once
// (converge's own attach takes another). converge's own thin attaches
// remove a number left with discards off and take another.
type Removals struct {
	slots chan struct{}
	wg    sync.WaitGroup
	// mu guards queued and closed: nothing is added after Close.
	mu     sync.Mutex
	queued int
	closed bool
}

// NewRemovals returns Removals ready to take numbers.
func NewRemovals() *Removals {
	return &Removals{slots: make(chan struct{}, maxRemovalsAtOnce)}
}

// add starts the removal of d's number; false when too many wait or
// Removals is closed, and the caller removes it.
func (r *Removals) add(d detached) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.queued >= maxQueuedRemovals {
		return false
	}
	r.queued++
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.slots <- struct{}{}
		removeNumber(d)
		<-r.slots
		r.mu.Lock()
		r.queued--
		r.mu.Unlock()
	}()
	return true
}

// Close returns once the numbers taken are removed; later detaches remove
// their numbers themselves.
func (r *Removals) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wg.Wait()
}

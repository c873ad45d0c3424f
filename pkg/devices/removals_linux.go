package devices

import "sync"

// maxQueuedRemovals bounds the numbers waiting for their removal; past it,
// Detach removes the number itself. A teardown of a thousand volumes at
// once queues at most a thousand.
const maxQueuedRemovals = 4096

// Removals removes, one after the other on a goroutine of its own, the
// numbers of the thick devices LoopDevices.Detach left unattached, so that
// the removal (about half a millisecond, which the kernel serializes across
// the machine) is on no request's path: the unstage that detached the
// device is answered while its number waits. Meanwhile the number can be
// offered to another loop user with its discards off, as in the moment
// between a detach and a removal made at once, but for longer: under a
// burst of unstages the removals run one after the other, about half a
// millisecond each (a thousand queued: half a second), and a crash loses
// the queue, leaving those numbers with discards off until their next
// user's detach. A removal can also meet another user between its
// LOOP_CTL_GET_FREE and its attach of the number, which then fails once
// (converge's own attach takes another). converge's own thin attaches
// remove a number left with discards off and take another.
type Removals struct {
	done chan struct{}
	// mu guards queue and closed: no send after the close.
	mu     sync.Mutex
	queue  chan detached
	closed bool
}

// NewRemovals starts the goroutine that removes the numbers queued.
func NewRemovals() *Removals {
	r := &Removals{queue: make(chan detached, maxQueuedRemovals), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for d := range r.queue {
			removeNumber(d)
		}
	}()
	return r
}

// add queues d's number for removal; false when the queue is full or
// closed, and the caller removes it.
func (r *Removals) add(d detached) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	select {
	case r.queue <- d:
		return true
	default:
		return false
	}
}

// Close removes the numbers still queued and returns once they are
// removed; later detaches remove their numbers themselves.
func (r *Removals) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	<-r.done
}

package state

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The log's fdatasyncs go through Linux AIO (IOCB_CMD_FDSYNC, Linux 4.18):
// io_submit returns at once and a kernel worker runs the fdatasync, whose
// end an eventfd in Go's network poller reports. A writer waiting for its
// record to be durable then parks on a channel rather than blocking its
// thread in the kernel. That matters for a request: it writes its intent,
// kicks the reconciler and waits for the disk, and with a plain fdatasync
// its thread kept its processor while blocked, so the pass it kicked waited
// for another thread to wake and take it (50-400 µs on a small VM); parked,
// it hands its processor to the pass at once, and the disk's flush and the
// pass's work overlap.
//
// One fdatasync is in flight at a time. A writer whose record it does not
// cover waits for the next one, submitted when it ends and covering every
// record written by then: the group commit of a plain fdatasync under a
// lock, without the lock.

const (
	iocbCmdFdsync = 3 // IOCB_CMD_FDSYNC
	iocbFlagResfd = 1 // IOCB_FLAG_RESFD
)

// iocb is struct iocb of linux/aio_abi.h on a little-endian machine
// (aio_key before aio_rw_flags).
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   int32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

// ioEvent is struct io_event.
type ioEvent struct {
	data uint64
	obj  uint64
	res  int64
	res2 int64
}

// flush is one fdatasync: it makes durable every record numbered up to
// upto. done is closed when it ended, with err.
type flush struct {
	upto uint64
	done chan struct{}
	err  error
}

// aioFlusher runs a file's fdatasyncs through AIO.
type aioFlusher struct {
	fd  int
	ctx uintptr // aio_context_t
	efd *os.File
	// written returns the number of the last record in the file.
	written func() uint64
	// ended is called with each flush that ended, before its waiters
	// wake.
	ended func(f *flush)

	// mu guards cur, next and closed.
	mu sync.Mutex
	// cur is the fdatasync in flight, nil for none; next, when not nil,
	// is submitted when cur ends.
	cur, next *flush
	closed    bool
	idle      *sync.Cond // signalled when cur becomes nil
	// flushes counts the fdatasyncs submitted.
	flushes uint64
	reaped  chan struct{}
}

// newAIOFlusher sets up AIO for fd and checks that the kernel runs an
// fdatasync of it that way; otherwise it fails and the caller calls
// fdatasync itself.
func newAIOFlusher(fd int, written func() uint64, ended func(*flush)) (*aioFlusher, error) {
	var ctx uintptr
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, 4, uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return nil, fmt.Errorf("io_setup: %w", e)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Syscall(unix.SYS_IO_DESTROY, ctx, 0, 0)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	a := &aioFlusher{fd: fd, ctx: ctx, efd: os.NewFile(uintptr(efd), "aio-eventfd"), written: written, reaped: make(chan struct{})}
	a.idle = sync.NewCond(&a.mu)
	// One flush, waited for here, tells whether the kernel takes them.
	f := &flush{done: make(chan struct{})}
	if err := a.submit(f); err != nil {
		a.destroy()
		return nil, err
	}
	a.cur = f
	go a.reap()
	<-f.done
	if f.err != nil {
		a.close()
		return nil, f.err
	}
	a.mu.Lock()
	a.ended = ended
	a.mu.Unlock()
	return a, nil
}

// start returns the flush that makes record seq durable: the one in
// flight when it covers seq, else the next one.
func (a *aioFlusher) start(seq uint64) *flush {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.closed:
		f := &flush{done: make(chan struct{}), err: os.ErrClosed}
		close(f.done)
		return f
	case a.cur == nil:
		a.cur = &flush{done: make(chan struct{})}
		a.submitLocked(a.cur)
		return a.cur
	case a.cur.upto >= seq:
		return a.cur
	case a.next == nil:
		a.next = &flush{done: make(chan struct{})}
	}
	return a.next
}

// submitLocked submits f, covering every record written by now; when the
// kernel refuses it, f is made by a plain fdatasync here.
func (a *aioFlusher) submitLocked(f *flush) {
	a.flushes++
	if err := a.submit(f); err != nil {
		if err = unix.Fdatasync(a.fd); err != nil {
			err = &os.SyscallError{Syscall: "fdatasync", Err: err}
		}
		a.endLocked(f, err)
	}
}

// submit reads the count of records written, then submits an fdatasync,
// which covers them.
func (a *aioFlusher) submit(f *flush) error {
	f.upto = a.written()
	cb := &iocb{opcode: iocbCmdFdsync, fildes: uint32(a.fd), flags: iocbFlagResfd, resfd: uint32(a.efd.Fd())}
	cbs := [1]*iocb{cb}
	for {
		_, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, a.ctx, 1, uintptr(unsafe.Pointer(&cbs[0])))
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return fmt.Errorf("io_submit of an fdatasync: %w", e)
	}
}

// submitted returns how many fdatasyncs were submitted.
func (a *aioFlusher) submitted() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.flushes
}

// reap collects each ended fdatasync, until the eventfd is closed.
func (a *aioFlusher) reap() {
	defer close(a.reaped)
	var count [8]byte
	var events [4]ioEvent
	zero := unix.Timespec{}
	for {
		if _, err := a.efd.Read(count[:]); err != nil {
			return
		}
		for {
			n, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, a.ctx, 0, uintptr(len(events)), uintptr(unsafe.Pointer(&events[0])), uintptr(unsafe.Pointer(&zero)), 0)
			if e == unix.EINTR {
				continue
			}
			if e != 0 || n == 0 {
				break
			}
			for _, ev := range events[:n] {
				var err error
				if ev.res < 0 {
					err = &os.SyscallError{Syscall: "fdatasync", Err: unix.Errno(-ev.res)}
				}
				a.mu.Lock()
				a.endLocked(a.cur, err)
				a.mu.Unlock()
			}
		}
	}
}

// endLocked ends f, the flush in flight, with err, and submits the next.
func (a *aioFlusher) endLocked(f *flush, err error) {
	if f == nil || f != a.cur {
		return
	}
	f.err = err
	if a.ended != nil {
		a.ended(f)
	}
	close(f.done)
	a.cur, a.next = a.next, nil
	if a.cur != nil {
		if err != nil {
			// After a failed fdatasync nothing tells which pages reached
			// the disk: the next fails alike.
			next := a.cur
			a.cur = nil
			next.err = err
			close(next.done)
		} else {
			a.submitLocked(a.cur)
		}
	}
	if a.cur == nil {
		a.idle.Broadcast()
	}
}

// close waits for the flushes under way, then frees the AIO context and
// the eventfd. Later flushes fail with os.ErrClosed.
func (a *aioFlusher) close() {
	a.mu.Lock()
	a.closed = true
	for a.cur != nil {
		a.idle.Wait()
	}
	a.mu.Unlock()
	a.destroy()
	<-a.reaped
}

func (a *aioFlusher) destroy() {
	unix.Syscall(unix.SYS_IO_DESTROY, a.ctx, 0, 0)
	a.efd.Close()
}

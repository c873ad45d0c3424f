package devices

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// WatchMounts calls notify whenever the mount table of this process's mount
// namespace changes (the kernel signals POLLPRI on an open mountinfo file),
// until ctx ends. notify must not block. It returns the error that kept it
// from watching, or nil when ctx ended.
//
// It waits in poll with no timeout, beside an eventfd that the end of ctx
// writes to. A poll that woke every second to look at ctx cost an idle
// plugin a wake-up of its thread, a processor taken back by the runtime
// and the runtime's monitor spinning for a while, every second: a large share of
// an idle plugin's CPU (docs/performance.md, Figures behind the code's
// choices).
func WatchMounts(ctx context.Context, mountInfo string, notify func()) error {
	fd, err := unix.Open(mountInfo, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", mountInfo, err)
	}
	defer unix.Close(fd)
	done, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	defer unix.Close(done)
	written := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(written)
		unix.Write(done, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	})
	// The eventfd is closed once its write is done, or will never come.
	defer func() {
		if !stop() {
			<-written
		}
	}()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}, {Fd: int32(done), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("polling %s: %w", mountInfo, err)
		}
		if fds[1].Revents != 0 {
			return nil
		}
		if n > 0 && fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0 {
			notify()
		}
	}
}

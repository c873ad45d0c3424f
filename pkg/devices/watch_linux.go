package devices

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// watchIntervalMs bounds how long WatchMounts waits in poll before it
// checks whether its context ended.
const watchIntervalMs = 1000

// WatchMounts calls notify whenever the mount table of this process's mount
// namespace changes (the kernel signals POLLPRI on an open mountinfo file),
// until ctx ends. notify must not block. It returns the error that kept it
// from watching, or nil when ctx ended.
func WatchMounts(ctx context.Context, mountInfo string, notify func()) error {
	fd, err := unix.Open(mountInfo, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", mountInfo, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
	for ctx.Err() == nil {
		n, err := unix.Poll(fds, watchIntervalMs)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("polling %s: %w", mountInfo, err)
		}
		if n > 0 && fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0 {
			notify()
		}
	}
	return nil
}

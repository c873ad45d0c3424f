package devices

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// Statfs returns the usage of the filesystem at path. It gives up when ctx
// ends, so a hung filesystem cannot hang the caller; the statfs call itself
// is left to finish in the background, and no other starts on path until
// it has (statfsFlights).
func Statfs(ctx context.Context, path string) (host.Usage, error) {
	st, err := statfsFlights.do(ctx, path)
	if err != nil {
		return host.Usage{}, err
	}
	bs := st.Bsize
	return host.Usage{
		TotalBytes:     int64(st.Blocks) * bs,
		AvailableBytes: int64(st.Bavail) * bs,
		UsedBytes:      int64(st.Blocks-st.Bfree) * bs,
		TotalInodes:    int64(st.Files),
		FreeInodes:     int64(st.Ffree),
		UsedInodes:     int64(st.Files - st.Ffree),
	}, nil
}

// statfsFlights are the statfs calls under way, at most one per path: a
// statfs of a hung filesystem never returns, and the kubelet asks again
// every minute, so each call starting its own would leave a goroutine per
// call, without bound. A call on a path whose statfs is still running
// waits for it to end, then starts its own (or takes one another call
// started since): an answer measured before the call began could predate
// what the caller checked first (that the volume is mounted there).
var statfsFlights = &flights{statfs: unix.Statfs, running: map[string]*flight{}}

type flights struct {
	statfs  func(string, *unix.Statfs_t) error
	mu      sync.Mutex
	running map[string]*flight // guarded by mu
	// waits, when set (by tests), is told of each call that waits for
	// another's statfs.
	waits func(path string)
}

type flight struct {
	began time.Time
	done  chan struct{} // closed when st and err are set
	st    unix.Statfs_t
	err   error
}

func (f *flights) do(ctx context.Context, path string) (unix.Statfs_t, error) {
	if err := ctx.Err(); err != nil {
		return unix.Statfs_t{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	// A flight under way when the call comes began before it; once that
	// one has ended, any other began after the call did, and is taken.
	older := true
	for {
		f.mu.Lock()
		fl, ok := f.running[path]
		if !ok {
			fl = &flight{began: time.Now(), done: make(chan struct{})}
			f.running[path] = fl
			go func() {
				fl.err = f.statfs(path, &fl.st)
				f.mu.Lock()
				if f.running[path] == fl {
					delete(f.running, path)
				}
				f.mu.Unlock()
				close(fl.done)
			}()
		}
		f.mu.Unlock()
		waiting := ok && older
		if waiting && f.waits != nil {
			f.waits(path)
		}
		select {
		case <-ctx.Done():
			if waiting {
				return unix.Statfs_t{}, fmt.Errorf("statfs %s: the one begun %s ago has not returned: %w", path, time.Since(fl.began).Round(time.Millisecond), ctx.Err())
			}
			return unix.Statfs_t{}, fmt.Errorf("statfs %s: %w", path, ctx.Err())
		case <-fl.done:
		}
		if waiting {
			older = false
			continue
		}
		if fl.err != nil {
			return unix.Statfs_t{}, fmt.Errorf("statfs %s: %w", path, fl.err)
		}
		return fl.st, nil
	}
}

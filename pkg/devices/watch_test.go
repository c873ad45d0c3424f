package devices

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/test/testenv/poll"
)

// TestWatchMounts checks that a mount and an unmount made elsewhere each
// reach notify, and that the watch ends, with no error, when its context
// does: it waits in poll with no timeout, so the end of the context must
// wake it.
func TestWatchMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed := make(chan struct{}, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- WatchMounts(ctx, "/proc/self/mountinfo", func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		})
	}()
	dir := t.TempDir()
	wait := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case err := <-ended:
			t.Fatalf("the watch ended before %s: %v", what, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no notification of %s", what)
		}
	}
	// Until the watch has its file open, a change goes unseen: make
	// changes until one is seen.
	poll.Until(t, 10*time.Second, 0, "a change of the mount table seen", func() error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		if err := unix.Unmount(dir, 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			return nil
		case err := <-ended:
			t.Fatalf("the watch ended: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		return errors.New("none within 100 ms of a mount and unmount")
	})
	time.Sleep(10 * time.Millisecond)
	select {
	case <-changed: // the unmount's, seen apart from the mount's
	default:
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	wait("the mount")
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	wait("the unmount")
	cancel()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the watch ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end with its context")
	}
}

package driver

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	testingclock "k8s.io/utils/clock/testing"
)

// TestProbeSelf checks that the liveness check fails when nothing answers
// on the socket, and is then satisfied, at once, by a Probe that answers
// not ready (a long start-up is alive).
func TestProbeSelf(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	live := probeSelf(sock)
	if err := live(context.Background()); err == nil {
		t.Errorf("nothing serves %s: got live, want an error", sock)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &identity{name: "test", ready: func() bool { return false }})
	go srv.Serve(lis)
	defer srv.Stop()
	if err := live(context.Background()); err != nil {
		t.Errorf("Probe answers not ready: got %v, want live", err)
	}
}

// TestShareCheckDialsOnceForMany: checks asked at once run the check once
// and all get its result; a caller that gives up ends no one else's wait;
// a result answers the checks within maxAge, and once older, the next check
// runs again; a check that panics answers an error and leaves no check
// running.
func TestShareCheckDialsOnceForMany(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Now())
	var runs atomic.Int32
	release := make(chan struct{})
	boom := errors.New("not answering")
	shared := shareCheck(func(context.Context) error {
		runs.Add(1)
		<-release
		return boom
	}, time.Second, clk)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := shared(gone); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller gone: got %v, want its context's error", err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if err := shared(context.Background()); !errors.Is(err, boom) {
				t.Errorf("got %v, want the check's result", err)
			}
		})
	}
	close(release)
	wg.Wait()
	clk.SetTime(clk.Now().Add(time.Second - time.Millisecond))
	if err := shared(context.Background()); !errors.Is(err, boom) {
		t.Errorf("a check within maxAge: got %v, want the last result", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("52 checks within maxAge ran the check %d times, want 1", n)
	}
	clk.SetTime(clk.Now().Add(time.Millisecond))
	release = make(chan struct{})
	close(release)
	shared(context.Background())
	if n := runs.Load(); n != 2 {
		t.Errorf("a check after maxAge: %d runs, want 2", n)
	}

	var panics atomic.Int32
	panicky := shareCheck(func(context.Context) error { panics.Add(1); panic("boom") }, time.Second, clk)
	for range 2 {
		if err := panicky(context.Background()); err == nil {
			t.Errorf("a check that panicked: got live, want an error")
		}
		clk.SetTime(clk.Now().Add(time.Second))
	}
	if n := panics.Load(); n != 2 {
		t.Errorf("after a panic: %d runs, want the next check to run again (2)", n)
	}
}

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
// once the result is older than maxAge, the next check runs it again.
func TestShareCheckDialsOnceForMany(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	boom := errors.New("not answering")
	shared := shareCheck(func(context.Context) error {
		runs.Add(1)
		<-release
		return boom
	}, 50*time.Millisecond)
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
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Errorf("51 checks at once ran the check %d times, want 1", n)
	}
	if err := shared(context.Background()); !errors.Is(err, boom) || runs.Load() != 1 {
		t.Errorf("a check within maxAge: got %v after %d runs, want the last result and no run", err, runs.Load())
	}
	time.Sleep(60 * time.Millisecond)
	shared(context.Background())
	if n := runs.Load(); n != 2 {
		t.Errorf("a check after maxAge: %d runs, want 2", n)
	}
}

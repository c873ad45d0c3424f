package nodeserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/test/testenv/poll"
)

func TestWaitingRequestsAreBounded(t *testing.T) {
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	s, err := New(Config{
		Store: store, Kicker: &fakeReconciler{store: store}, NodeID: "n1", Roots: []string{root},
		Stat: func(context.Context, string) (host.Usage, error) { return host.Usage{}, nil }, MaxRequests: 2,
		Capacity: func(string) (int64, error) { return 64 << 20, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for _, id := range []string{"a", "b"} {
		go func() {
			_, err := s.NodeStageVolume(ctx, stageReq(id))
			done <- err
		}()
	}
	// Both wait (nothing makes them ready); a third is refused at once.
	poll.Until(t, 10*time.Second, time.Millisecond, "both requests waiting", func() error {
		if n := len(s.slots); n < 2 {
			return fmt.Errorf("%d wait", n)
		}
		return nil
	})
	_, err = s.NodeStageVolume(context.Background(), stageReq("c"))
	if rpcerr.Code(err) != codes.ResourceExhausted {
		t.Errorf("third request: got %v, want ResourceExhausted", err)
	}
	if _, err := store.Get("c"); err == nil {
		t.Error("the refused request recorded an intent")
	}
	cancel()
	for range 2 {
		if err := <-done; rpcerr.Code(err) != codes.Canceled {
			t.Errorf("waiting request: got %v, want Canceled", err)
		}
	}
	if len(s.slots) != 0 {
		t.Errorf("slots held after the requests ended: %d", len(s.slots))
	}
}

func TestResourceExhaustedIsAnsweredAtOnce(t *testing.T) {
	s, store, rec := newServer(t)
	rec.onKick = func() {
		v, err := store.Get("v")
		if err != nil {
			return
		}
		store.SetResult("v", state.StageKey, state.Result{Generation: v.Stage.Generation, Attempts: 1,
			Err: classified.Errorf(classified.KindResourceExhausted, "attaching volume v: no free loop device")})
	}
	// At the deadline the answer would be DeadlineExceeded.
	_, err := s.NodeStageVolume(context.Background(), stageReq("v"))
	if rpcerr.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "no free loop device") {
		t.Errorf("got %v, want ResourceExhausted naming the loop device", err)
	}
	if v, err := store.Get("v"); err != nil || v.Stage == nil {
		t.Errorf("the intent was dropped: %+v, %v; want it kept for the retry", v, err)
	}
}

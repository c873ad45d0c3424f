package nodeserver

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

// TestWithdrawIdleStage checks a deletion's withdrawal of a stage: only a
// stage with nothing on it is withdrawn, and the call answers
// once the unstage is done, with its refusal, or at its deadline with the
// stage still withdrawn for the retry; any other volume takes no slot and
// starts no work.
func TestWithdrawIdleStage(t *testing.T) {
	type unstage int
	const (
		done unstage = iota
		refused
		never
	)
	for _, tc := range []struct {
		name       string
		access     state.AccessType
		published  bool
		unknown    bool
		unstage    unstage
		want       codes.Code
		withdrawn  bool
		wantKicks  bool
		wantStaged bool // the stage still recorded once answered
	}{
		{name: "idle raw block stage", access: state.AccessBlock, withdrawn: true, wantKicks: true},
		{name: "unstage refused", access: state.AccessBlock, unstage: refused, want: codes.FailedPrecondition, withdrawn: true, wantKicks: true, wantStaged: true},
		{name: "unstage not done by the deadline", access: state.AccessBlock, unstage: never, want: codes.DeadlineExceeded, withdrawn: true, wantKicks: true, wantStaged: true},
		{name: "raw block stage under a publish", access: state.AccessBlock, published: true, wantStaged: true},
		{name: "idle filesystem stage", access: state.AccessMount, withdrawn: true, wantKicks: true},
		{name: "unknown volume", unknown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, store, rec := newServer(t)
			if !tc.unknown {
				if _, err := store.Update("v", func(v *state.Volume) error {
					v.Provisioning, v.Access = state.ProvisionThick, tc.access
					v.Stage = &state.Stage{Path: root + "/staging/v", Access: tc.access}
					if tc.published {
						v.Publishes = map[string]*state.Publish{root + "/pods/p/v": {}}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			var kicks atomic.Int32
			rec.onKick = func() {
				kicks.Add(1)
				v, err := store.Get("v")
				if err != nil || v.Stage == nil || !v.Stage.Deleting {
					return
				}
				gen := v.Stage.Generation
				switch tc.unstage {
				case done:
					store.Update("v", func(v *state.Volume) error { v.ForgetStage(gen); return nil })
				case refused:
					store.SetTerminalFailure("v", state.StageKey, state.TerminalFailure{Generation: gen,
						Err: classified.Terminalf(classified.KindFailedPrecondition, "still open")})
					store.Update("v", func(v *state.Volume) error { v.KeepStaged(gen); return nil })
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			withdrawn, err := s.WithdrawIdleStage(ctx, "v")
			if got := rpcerr.Code(err); got != tc.want || withdrawn != tc.withdrawn {
				t.Fatalf("got withdrawn %v, %v; want withdrawn %v, code %v", withdrawn, err, tc.withdrawn, tc.want)
			}
			if !tc.wantKicks {
				// A request starts the volume's work on a goroutine of
				// its own: time for one that should not run.
				time.Sleep(100 * time.Millisecond)
			}
			if got := kicks.Load() > 0; got != tc.wantKicks {
				t.Errorf("%d starts of the volume's work, want some: %v", kicks.Load(), tc.wantKicks)
			}
			v, err := store.Get("v")
			switch {
			case tc.unknown:
				if !errors.Is(err, state.ErrNotFound) {
					t.Errorf("an unknown volume's record after the call: %v, %v; want none", v, err)
				}
			case (err == nil && v.Stage != nil) != tc.wantStaged:
				t.Errorf("record after the call: %+v, %v; want staged %v", v, err, tc.wantStaged)
			case tc.unstage == never && !v.Stage.Deleting:
				t.Error("the stage is no longer withdrawn after the deadline: the retry would not find it unstaged")
			case tc.published && v.Stage.Deleting:
				t.Error("withdrew a stage under a publish")
			}
			if s.Waiting() != 0 {
				t.Errorf("%d request slots still held", s.Waiting())
			}
		})
	}
}

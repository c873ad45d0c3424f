package reconciler

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// TestOutcomeOf checks what the end of each kind of operation calls for:
// the one decision every operation's end goes through.
func TestOutcomeOf(t *testing.T) {
	transient := errors.New("device busy")
	refused := classified.Terminalf(classified.KindFailedPrecondition, "refused")
	lost := classified.Terminalf(classified.KindDataLoss, "no filesystem where one was made")
	for _, tc := range []struct {
		name      string
		act       action
		err       error
		repairing bool
		want      effect
		final     bool
	}{
		{"success", action{kind: actStage}, nil, false, succeeded, false},
		{"transient failure of a set-up", action{kind: actStage}, transient, false, retried, false},
		{"transient failure of a teardown", action{kind: actUnstage}, transient, false, retried, false},
		{"refused stage", action{kind: actStage}, refused, false, withdrawn, false},
		{"refused publish", action{kind: actPublish, target: "/t"}, refused, false, withdrawn, false},
		{"refused unstage", action{kind: actUnstage}, refused, false, keptStaged, true},
		{"refused growth", action{kind: actGrowFs}, refused, false, heldAndAnswered, true},
		{"refused device growth", action{kind: actGrowDevice}, refused, false, heldAndAnswered, true},
		{"refused unpublish", action{kind: actUnpublish, target: "/t"}, refused, false, held, true},
		{"refused repair", action{kind: actUnmountStaging}, refused, false, held, true},
		{"first stage finds no filesystem", action{kind: actStage}, lost, false, withdrawn, false},
		{"fulfilled stage lost its data", action{kind: actStage}, lost, true, keptLost, false},
		{"re-publish refused", action{kind: actPublish, target: "/t"}, lost, true, withdrawn, false},
	} {
		out := outcomeOf(tc.act, tc.err, tc.repairing)
		if out.effect != tc.want {
			t.Errorf("%s: effect %d, want %d", tc.name, out.effect, tc.want)
		}
		if out.final() != tc.final {
			t.Errorf("%s: final %v, want %v", tc.name, out.final(), tc.final)
		}
		if (out.err == nil) != (tc.err == nil) {
			t.Errorf("%s: error %v from %v", tc.name, out.err, tc.err)
		}
	}
}

// TestDeviceErrorKinds checks how a failure of the device layer becomes a
// classified error: what retrying cannot fix is terminal with its kind,
// the rest is retried, and the cause stays reachable.
func TestDeviceErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		cause    error
		kind     classified.Kind
		terminal bool
	}{
		{devices.ErrRefused, classified.KindInvalidArgument, true},
		{devices.ErrNotPermitted, classified.KindFailedPrecondition, true},
		{devices.ErrNotFormattable, classified.KindFailedPrecondition, true},
		{devices.ErrFilesystemDamaged, classified.KindDataLoss, true},
		{errors.New("device busy"), classified.KindInternal, false},
	} {
		err := deviceError(fmt.Errorf("mount: %w", tc.cause), "mounting %s", "/dev/loop7")
		e := classified.AsError(err)
		if e.Kind != tc.kind || e.Terminal != tc.terminal || !errors.Is(err, tc.cause) {
			t.Errorf("%v: got %+v (wraps it: %v), want %v terminal %v", tc.cause, e, errors.Is(err, tc.cause), tc.kind, tc.terminal)
		}
	}
}

// TestOperationPanicIsContained checks that an operation that panics is
// that volume's failure, naming the panic, retried with backoff, while the
// loop goes on and serves another volume; once the cause is gone, the
// retry succeeds.
func TestOperationPanicIsContained(t *testing.T) {
	h := newHarness(t)
	sa, _ := h.volume("a")
	sb, _ := h.volume("b")
	h.world.before = func(name, image string) error {
		if name == "mount "+sa {
			panic("mount went wrong")
		}
		return nil
	}
	h.update("a", func(v *state.Volume) { v.Stage = stageSpec(sa) })
	h.update("b", func(v *state.Volume) { v.Stage = stageSpec(sb) })
	h.runUntilIdle()
	r, _ := h.store.Result("a", state.StageKey)
	if r.Ready || r.Err == nil || !strings.Contains(r.Err.Message, "mount went wrong") {
		t.Fatalf("a: got result %+v, want the panic as its failure", r)
	}
	if r, _ := h.store.Result("b", state.StageKey); !r.Ready {
		t.Errorf("b: got result %+v, want it staged beside a's panic", r)
	}
	h.world.before = nil
	h.clock.Step(time.Hour) // past the backoff
	h.runUntilIdle()
	if r, _ := h.store.Result("a", state.StageKey); !r.Ready {
		t.Errorf("a after the cause is gone: got %+v, want staged", r)
	}
}

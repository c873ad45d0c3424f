package reconciler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/state"
)

// startEarly readies h's reconciler for early starts, as Run does once
// start-up reconstruction has finished, until the test ends.
func (h *harness) startEarly() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(func() {
		cancel()
		h.r.early.close()
		h.r.wait()
	})
	h.r.early.open(ctx)
	h.r.ready.Store(true)
	return ctx
}

// request records what fn asks of volume id and starts its step, from
// several goroutines at once, as the kubelet's call and its retries do.
func (h *harness) request(id string, fn func(v *state.Volume) error) {
	h.t.Helper()
	if _, err := h.store.Update(id, fn); err != nil {
		h.t.Error(err)
		return
	}
	// Start runs the operation it starts on its caller's goroutine,
	// which a request does not wait for.
	for range 3 {
		go h.r.Start(id)
	}
}

// eventually polls cond until it holds, and reports whether it did; it
// fails the test (without stopping it) after 10 s.
func (h *harness) eventually(what string, cond func() bool) bool {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Errorf("%s: not within 10 s", what)
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true
}

// TestEarlyStartAndPassNeverOverlap stages, publishes and tears down four
// volumes, round after round (the stage and the publish asked one after
// the other, or in one record), each request starting its own volume's step
// (three times at once) while full passes run back to back beside them. No
// two calls about one volume's image may ever run at once (each call lasts
// long enough for two operations' calls to meet), and no publish's bind
// mount may come before its staging mount.
func TestEarlyStartAndPassNeverOverlap(t *testing.T) {
	h := newHarness(t)
	ctx := h.startEarly()
	ids := []string{"a", "b", "c", "d"}
	staging, target := map[string]string{}, map[string]string{}
	for _, id := range ids {
		staging[id], target[id] = h.volume(id)
	}
	h.world.mu.Lock()
	h.world.started = nil // nothing reads the calls started, which would fill it
	h.world.mu.Unlock()
	// mu guards inFlight and faults.
	var mu sync.Mutex
	inFlight := map[string]int{}
	var faults []string
	h.world.before = func(name, image string) error {
		if strings.HasPrefix(name, "bind ") && image == "" {
			mu.Lock()
			faults = append(faults, name+" before its staging mount")
			mu.Unlock()
		}
		if image == "" {
			return nil
		}
		mu.Lock()
		inFlight[image]++
		if inFlight[image] > 1 {
			faults = append(faults, fmt.Sprintf("%s while another call about %s runs", name, image))
		}
		mu.Unlock()
		time.Sleep(200 * time.Microsecond)
		return nil
	}
	h.world.after = func(name, image string, err error) error {
		if image != "" {
			mu.Lock()
			inFlight[image]--
			mu.Unlock()
		}
		return err
	}
	passCtx, stopPasses := context.WithCancel(ctx)
	passes := make(chan struct{})
	go func() {
		defer close(passes)
		for passCtx.Err() == nil {
			if _, err := h.r.Pass(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	mounted := func(path string) bool { _, ok := h.world.topMount(path); return ok }
	for round := range 10 {
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Go(func() {
				stage := func(v *state.Volume) error { return v.RequestStage(stageSpec(staging[id])) }
				publish := func(v *state.Volume) error { return v.RequestPublish(staging[id], target[id], publishSpec()) }
				if round%2 == 0 {
					h.request(id, stage)
					h.request(id, publish)
				} else {
					// Both at once, as a restart finds them: the
					// stage must still come first.
					h.request(id, func(v *state.Volume) error {
						if err := stage(v); err != nil {
							return err
						}
						return publish(v)
					})
				}
				if !h.eventually(fmt.Sprintf("round %d: %s published", round, id), func() bool { return mounted(target[id]) }) {
					return
				}
				h.request(id, func(v *state.Volume) error { return v.RequestUnpublish(target[id]) })
				if !h.eventually(fmt.Sprintf("round %d: %s unpublished", round, id), func() bool {
					v, err := h.store.Get(id)
					return err == nil && len(v.Publishes) == 0 && !mounted(target[id])
				}) {
					return
				}
				h.request(id, func(v *state.Volume) error { return v.RequestUnstage(staging[id]) })
				h.eventually(fmt.Sprintf("round %d: %s unstaged", round, id), func() bool {
					_, attached := h.world.loop(h.world.Path(id))
					v, err := h.store.Get(id)
					return err == nil && v.Stage == nil && !mounted(staging[id]) && !attached
				})
			})
		}
		wg.Wait()
		if t.Failed() {
			break
		}
	}
	stopPasses()
	<-passes
	h.r.wait()
	mu.Lock()
	defer mu.Unlock()
	for _, f := range faults {
		t.Error(f)
	}
	h.world.mu.Lock()
	partial := h.world.partial
	h.world.mu.Unlock()
	if partial == 0 {
		t.Error("no early start observed its volume: every step came from a pass")
	}
}

// TestEarlyStartWaitsForItsVolume asks for a publish while the volume's
// stage runs: the early start starts nothing, and the stage's end starts
// the publish, with no further pass.
func TestEarlyStartWaitsForItsVolume(t *testing.T) {
	h := newHarness(t)
	h.startEarly()
	staging, target := h.volume("v")
	release := make(chan struct{})
	h.world.holdOn("mount "+staging, release)
	h.request("v", func(v *state.Volume) error { return v.RequestStage(stageSpec(staging)) })
	// No device of the new volume is known: its first stage is the pass's.
	if _, err := h.r.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, h.world.started, "mount "+staging)
	h.request("v", func(v *state.Volume) error { return v.RequestPublish(staging, target, publishSpec()) })
	if _, ok := h.world.topMount(target); ok {
		t.Fatal("published while the stage runs")
	}
	if _, ok := h.world.topMount(staging); ok {
		t.Fatal("the stage is not running: its mount is made")
	}
	close(release)
	h.eventually("published after the stage, with no pass", func() bool {
		_, ok := h.world.topMount(target)
		return ok
	})
}

// TestEarlyStartLeavesTheStageToThePass loses a staged volume's staging
// mount and asks for a publish: the stage is to be made again, and it is
// the pass's (it must see every device of the image), so the early start
// mounts nothing and asks for a pass.
func TestEarlyStartLeavesTheStageToThePass(t *testing.T) {
	h := newHarness(t)
	h.startEarly()
	staging, target := h.volume("v")
	h.update("v", func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.runUntilIdle()
	h.update("v", func(v *state.Volume) { delete(v.Publishes, target) })
	h.runUntilIdle()
	h.world.mu.Lock() // the staging mount, gone from outside
	for i, m := range h.world.mounts {
		if m.Path == staging {
			h.world.unmountLocked(i)
			break
		}
	}
	h.world.mu.Unlock()
	if _, ok := h.world.topMount(staging); ok {
		t.Fatal("the staging mount is still there")
	}
	select {
	case <-h.r.kick:
	default:
	}
	h.world.mu.Lock()
	calls := len(h.world.calls)
	h.world.mu.Unlock()
	h.update("v", func(v *state.Volume) { _ = v.RequestPublish(staging, target, publishSpec()) })
	h.r.Start("v")
	h.r.wait()
	h.world.mu.Lock()
	after := h.world.calls[calls:]
	h.world.mu.Unlock()
	if len(after) > 0 {
		t.Errorf("the early start called %v; want nothing, the stage being the pass's", after)
	}
	select {
	case <-h.r.kick:
	default:
		t.Error("the early start asked for no pass")
	}
}

// TestPassKeepsADeviceAttachedAfterItsObservation: a stage attaches its
// device after a pass observed the machine; that pass, seeing no device
// of the volume, must not make the publish's early start forget the one
// the stage noted, or the publish waits for the next pass. A volume with
// no operation since the observation is taken at the pass's word.
func TestPassKeepsADeviceAttachedAfterItsObservation(t *testing.T) {
	h := newHarness(t)
	epoch := h.r.claims.Epoch()
	stage, hold := h.r.claims.Try(epoch, "a")
	if stage == nil {
		t.Fatalf("claim: %v", hold)
	}
	h.r.noteDevice("a", "/dev/loop7")
	h.r.noteDevice("b", "/dev/loop8")
	h.r.learnDevices(nil, nil, epoch)
	if got := h.r.early.devicesOf("a"); len(got) != 1 || got[0] != "/dev/loop7" {
		t.Errorf("while its stage runs, a's devices = %v, want [/dev/loop7]", got)
	}
	if got := h.r.early.devicesOf("b"); got != nil {
		t.Errorf("b, with no operation since the observation, keeps %v", got)
	}
	stage.Release()
	h.r.learnDevices(nil, nil, epoch)
	if got := h.r.early.devicesOf("a"); len(got) != 1 {
		t.Errorf("once its stage ended after the observation, a's devices = %v, want [/dev/loop7]", got)
	}
	h.r.learnDevices(nil, nil, h.r.claims.Epoch())
	if got := h.r.early.devicesOf("a"); got != nil {
		t.Errorf("a pass observing after the stage's end saw no device of a, yet a keeps %v", got)
	}
}

// TestRestartLeavesItsPassToTheOperationsEnd: an early start that found
// an operation of its volume running is started again at that operation's
// end, which asked for a pass soon already (KickSoon); a step the restart
// leaves to the pass waits for that pass rather than kicking one more at
// once, while a request's own early start kicks at once.
func TestRestartLeavesItsPassToTheOperationsEnd(t *testing.T) {
	h := newHarness(t)
	h.startEarly()
	h.r.soonDelay = time.Hour
	h.volume("a")
	// Nothing recorded for a (its last teardown done): nothing to do.
	h.restartWaitsForSoon("a", "a restart of a volume with nothing recorded")
	h.r.Start("a")
	select {
	case <-h.r.kick:
	default:
		t.Error("a request's early start that left its step to the pass kicked none")
	}
	// A record kept after its last teardown (its provenance, no stage nor
	// publish): the restart after that unstage leaves the check to the
	// unstage's own pass too.
	h.update("a", func(v *state.Volume) { v.Formatted = "ext4" })
	h.restartWaitsForSoon("a", "a restart after a volume's last unstage")
	h.r.Start("a")
	select {
	case <-h.r.kick:
	default:
		t.Error("a request's early start on a volume left idle by its last unstage kicked no pass")
	}
	// Such a volume whose filesystem a snapshot left frozen: the pass
	// thaws it, and the restart kicks it at once.
	h.update("a", func(v *state.Volume) { v.Frozen = "snap-1" })
	h.r.restart("a")
	select {
	case <-h.r.kick:
	default:
		t.Error("a restart that left a thaw to the pass kicked none")
	}
	// A step the pass takes (a first stage) is kicked at once, restart
	// or not.
	staging, _ := h.volume("b")
	h.update("b", func(v *state.Volume) { v.RequestStage(stageSpec(staging)) })
	h.r.restart("b")
	select {
	case <-h.r.kick:
	default:
		t.Error("a restart that left a stage to the pass kicked none")
	}
}

// restartWaitsForSoon restarts id's early start, as at the end of an
// operation of it, and fails unless the restart asked for a pass soon and
// kicked none at once (what is meant names the case).
func (h *harness) restartWaitsForSoon(id, what string) {
	h.t.Helper()
	h.r.soonMu.Lock()
	h.r.soon = false
	h.r.soonMu.Unlock()
	h.r.restart(id)
	select {
	case <-h.r.kick:
		h.t.Errorf("%s kicked a pass at once", what)
	default:
	}
	h.r.soonMu.Lock()
	soon := h.r.soon
	h.r.soonMu.Unlock()
	if !soon {
		h.t.Errorf("%s asked for no pass", what)
	}
}

// TestEarlyStartOutcomesAreRecorded: each early start reports what it did,
// for the metrics (converge_early_starts_total): a first stage left to
// the pass, a publish started, a volume with nothing to do, and one whose
// operation runs.
func TestEarlyStartOutcomesAreRecorded(t *testing.T) {
	h := newHarness(t)
	rec := &countingRecorder{ops: map[string]int{}}
	h.r.cfg.Recorder = rec
	h.startEarly()
	staging, target := h.volume("a")
	h.update("a", func(v *state.Volume) { v.RequestStage(stageSpec(staging)) })
	h.r.Start("a") // a first stage: no device known
	h.runUntilIdle()
	h.update("a", func(v *state.Volume) { v.RequestPublish(staging, target, publishSpec()) })
	h.r.Start("a") // the publish, started at once
	h.r.wait()
	h.r.Start("a") // published: nothing to do
	if c, hold := h.r.claims.Try(h.r.claims.Epoch(), "a"); c == nil {
		t.Fatalf("claim: %v", hold)
	}
	h.update("a", func(v *state.Volume) { v.RequestUnpublish(target) })
	h.r.Start("a") // the unpublish, while an operation of a runs
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := map[string]int{EarlyLeftToPass: 1, EarlyStarted: 1, EarlyNothingToDo: 1, EarlyWaited: 1}
	for outcome, n := range want {
		if rec.early[outcome] != n {
			t.Errorf("%s: got %d, want %d (all: %v)", outcome, rec.early[outcome], n, rec.early)
		}
	}
}

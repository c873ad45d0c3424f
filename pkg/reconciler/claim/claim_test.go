package claim_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/converge-csi/converge/pkg/reconciler/claim"
)

// TestOneClaimPerVolume: a volume claimed is not claimed again until its
// claim is released; another volume is claimed meanwhile.
func TestOneClaimPerVolume(t *testing.T) {
	s := claim.NewSet()
	e := s.Epoch()
	a, h := s.Try(e, "a")
	if a == nil || h != claim.Free {
		t.Fatalf("first claim of a: got %v, %v; want a claim", a, h)
	}
	if c, h := s.Try(e, "a"); c != nil || h != claim.Running {
		t.Errorf("second claim of a: got %v, %v; want none, running", c, h)
	}
	if got := s.State("a", e); got != claim.Running {
		t.Errorf("state of a: got %v, want running", got)
	}
	if c, h := s.Try(e, "b"); c == nil || h != claim.Free {
		t.Errorf("claim of b beside a: got %v, %v; want a claim", c, h)
	}
	if s.Idle() {
		t.Error("idle while a and b are held")
	}
}

// TestReleaseMakesOlderObservationsStale: once a claim is released, a
// caller whose epoch is older than the release finds the volume stale
// (what it observed is out of date), and one that read the epoch after it
// claims the volume.
func TestReleaseMakesOlderObservationsStale(t *testing.T) {
	s := claim.NewSet()
	before := s.Epoch()
	c, _ := s.Try(before, "a")
	c.Release()
	if got, h := s.Try(before, "a"); got != nil || h != claim.Stale {
		t.Errorf("claim with the epoch before the release: got %v, %v; want none, stale", got, h)
	}
	if !s.ReleasedSince("a", before) {
		t.Error("a not released since the epoch before its release")
	}
	after := s.Epoch()
	if s.ReleasedSince("a", after) {
		t.Error("a released since the epoch read after its release")
	}
	again, h := s.Try(after, "a")
	if again == nil || h != claim.Free {
		t.Fatalf("claim with the epoch after the release: got %v, %v; want a claim", again, h)
	}
	// Released since before, and held again: running comes first.
	if got := s.State("a", before); got != claim.Running {
		t.Errorf("state of a held again: got %v, want running", got)
	}
	if !s.ReleasedSince("a", before) {
		t.Error("a held again no longer counts as released since the epoch before")
	}
	again.Release()
	if !s.Idle() {
		t.Error("not idle once every claim is released")
	}
}

// TestReleaseTwiceIsANoOp: a second release neither frees a volume
// claimed again since nor counts as a release.
func TestReleaseTwiceIsANoOp(t *testing.T) {
	s := claim.NewSet()
	c, _ := s.Try(s.Epoch(), "a")
	c.Release()
	e := s.Epoch()
	d, _ := s.Try(e, "a")
	c.Release()
	if got := s.State("a", e); got != claim.Running {
		t.Errorf("state of a after its old claim's second release: got %v, want running", got)
	}
	if s.Epoch() != e {
		t.Errorf("epoch after a second release: got %v, want %v", s.Epoch(), e)
	}
	d.Release()
}

// TestClaimIsAllOrNothing: a claim of several volumes (a group snapshot's)
// one of which is held, or was released after the epoch, claims none.
func TestClaimIsAllOrNothing(t *testing.T) {
	s := claim.NewSet()
	e := s.Epoch()
	a, _ := s.Try(e, "a")
	if c, h := s.Try(e, "c", "b", "a"); c != nil || h != claim.Running {
		t.Fatalf("group with running member a: got %v, %v; want none, running", c, h)
	}
	for _, id := range []string{"b", "c"} {
		if got := s.State(id, e); got != claim.Free {
			t.Errorf("%s after a group claim that failed: got %v, want free", id, got)
		}
	}
	a.Release()
	if c, h := s.Try(e, "c", "b", "a"); c != nil || h != claim.Stale {
		t.Fatalf("group with member a released after the epoch: got %v, %v; want none, stale", c, h)
	}
	g, h := s.Try(s.Epoch(), "c", "b", "a")
	if g == nil || h != claim.Free {
		t.Fatalf("group of free members: got %v, %v; want a claim", g, h)
	}
	e = s.Epoch()
	for _, id := range []string{"a", "b", "c"} {
		if got := s.State(id, e); got != claim.Running {
			t.Errorf("%s in the group's claim: got %v, want running", id, got)
		}
	}
	g.Release()
	for _, id := range []string{"a", "b", "c"} {
		if got := s.State(id, e); got != claim.Stale {
			t.Errorf("%s after the group's release: got %v, want stale", id, got)
		}
	}
}

// TestForgetKeepsReleasesAfterTheEpoch: forgetting a volume drops its
// releases up to the epoch given, never one after it, which an older
// observation must still find stale; and a caller whose epoch is older
// than a release forgotten still finds the volume stale (its operation
// may have ended, and its record gone, while that caller observed it),
// while one with a newer epoch finds it free.
func TestForgetKeepsReleasesAfterTheEpoch(t *testing.T) {
	s := claim.NewSet()
	old := s.Epoch()
	c, _ := s.Try(old, "a")
	c.Release()
	none := func(string) bool { return false }
	s.Forget(none, old)
	if got := s.State("a", old); got != claim.Stale {
		t.Errorf("a released after the epoch forgotten at: got %v, want stale", got)
	}
	now := s.Epoch()
	s.Forget(none, now)
	if got := s.State("a", now); got != claim.Free {
		t.Errorf("a forgotten, asked with the epoch it was forgotten at: got %v, want free", got)
	}
	if got := s.State("a", old); got != claim.Stale {
		t.Errorf("a forgotten, asked with an epoch older than its release: got %v, want stale", got)
	}
	if got, ok := s.Try(old, "a"); ok != claim.Stale || got != nil {
		t.Errorf("a claimed with an epoch older than its forgotten release: got %v, want stale", ok)
	}
}

// TestConcurrentClaimsOfOneVolume: of many callers claiming one volume at
// once, over and over, never two hold it together.
func TestConcurrentClaimsOfOneVolume(t *testing.T) {
	s := claim.NewSet()
	var holders, most atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c, _ := s.Try(s.Epoch(), "a")
				if c == nil {
					continue
				}
				n := holders.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				runtime.Gosched() // hold it a moment, for another to try
				holders.Add(-1)
				c.Release()
			}
		})
	}
	wg.Wait()
	if got := most.Load(); got != 1 {
		t.Errorf("most holders of a at once: got %d, want 1", got)
	}
	if !s.Idle() {
		t.Error("not idle once every claim is released")
	}
}

package devices

import (
	"fmt"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// countingRemovals returns Removals on a fake clock that count the
// removals they make instead of removing anything, with the given pause
// and longest wait.
func countingRemovals(quiet, maxWait time.Duration) (*Removals, *clocktesting.FakeClock, func() int) {
	var mu sync.Mutex
	removed := 0
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	r := NewRemovals(clk)
	r.quiet, r.maxWait = quiet, maxWait
	r.remove = func(detached) {
		mu.Lock()
		removed++
		mu.Unlock()
	}
	return r, clk, func() int {
		mu.Lock()
		defer mu.Unlock()
		return removed
	}
}

// awaitRemoved waits (in real time: the removals run on goroutines of
// their own) until want removals are made, and fails the test after 10 s.
func awaitRemoved(t *testing.T, removed func() int, want int, when string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for removed() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d removals made", when, removed(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// noneRemoved checks that no removal starts: the timer's function runs on
// a goroutine of its own, so it is given a moment of real time.
func noneRemoved(t *testing.T, removed func() int, when string) {
	t.Helper()
	time.Sleep(20 * time.Millisecond)
	if n := removed(); n != 0 {
		t.Fatalf("%s: got %d removals, want none", when, n)
	}
}

func add(t *testing.T, r *Removals, i int) {
	t.Helper()
	if !r.add(detached{dev: fmt.Sprintf("/dev/loop%d", i), seq: "1"}) {
		t.Fatalf("add of /dev/loop%d refused", i)
	}
}

// TestRemovalsWaitForDetachesToPause: no removal starts while detaches
// keep coming less than the pause apart, and all start once they pause.
func TestRemovalsWaitForDetachesToPause(t *testing.T) {
	r, clk, removed := countingRemovals(5*time.Millisecond, time.Hour)
	defer r.Close()
	for i := range 5 {
		add(t, r, i)
		clk.Step(4 * time.Millisecond)
		noneRemoved(t, removed, fmt.Sprintf("%d ms after the first detach, detaches 4 ms apart", 4*(i+1)))
	}
	clk.Step(time.Millisecond)
	awaitRemoved(t, removed, 5, "once detaches paused for 5 ms")
}

// TestRemovalsStartWithinTheirLongestWait: detaches that never pause
// still have their numbers removed once the oldest has waited maxWait.
func TestRemovalsStartWithinTheirLongestWait(t *testing.T) {
	r, clk, removed := countingRemovals(5*time.Millisecond, 20*time.Millisecond)
	defer r.Close()
	for i := range 4 {
		add(t, r, i)
		clk.Step(4 * time.Millisecond)
	}
	noneRemoved(t, removed, "16 ms after the first detach")
	add(t, r, 4)
	clk.Step(4 * time.Millisecond)
	awaitRemoved(t, removed, 5, "20 ms after the first detach, with detaches never pausing")
}

// TestRemovalsStartNow: a thin attach starts the removals waiting for
// detaches to pause at once, rather than claiming their numbers, stuck
// with discards off, one by one; Close starts them too, and a closed
// Removals takes no more.
func TestRemovalsStartNow(t *testing.T) {
	r, _, removed := countingRemovals(time.Hour, time.Hour)
	for i := range 3 {
		add(t, r, i)
	}
	r.startNow()
	awaitRemoved(t, removed, 3, "after startNow")
	add(t, r, 3)
	r.Close()
	if n := removed(); n != 4 {
		t.Fatalf("Close returned with %d of 4 removals made", n)
	}
	if r.add(detached{dev: "/dev/loop99", seq: "1"}) {
		t.Error("a closed Removals took a number")
	}
}

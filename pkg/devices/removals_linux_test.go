package devices

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// countingRemovals returns Removals that count the removals they make
// instead of removing anything, with the given pause and longest wait.
func countingRemovals(quiet, maxWait time.Duration) (*Removals, func() int) {
	var mu sync.Mutex
	removed := 0
	r := NewRemovals()
	r.quiet, r.maxWait = quiet, maxWait
	r.remove = func(detached) {
		mu.Lock()
		removed++
		mu.Unlock()
	}
	return r, func() int {
		mu.Lock()
		defer mu.Unlock()
		return removed
	}
}

// TestRemovalsWaitForDetachesToPause: no removal starts while detaches
// keep coming, and all start once they pause; Close starts those still
// waiting at once.
func TestRemovalsWaitForDetachesToPause(t *testing.T) {
	r, removed := countingRemovals(time.Second, time.Hour)
	for i := range 20 {
		if !r.add(detached{dev: fmt.Sprintf("/dev/loop%d", i), seq: "1"}) {
			t.Fatal("add refused")
		}
		// Detaches a moment apart, far less than the pause.
		time.Sleep(5 * time.Millisecond)
		if n := removed(); n != 0 {
			t.Fatalf("%d removals started while detaches kept coming", n)
		}
	}
	r.Close()
	if n := removed(); n != 20 {
		t.Fatalf("Close returned with %d of 20 removals made", n)
	}
	if r.add(detached{dev: "/dev/loop99", seq: "1"}) {
		t.Error("a closed Removals took a number")
	}

	r, removed = countingRemovals(10*time.Millisecond, time.Hour)
	defer r.Close()
	for i := range 5 {
		r.add(detached{dev: fmt.Sprintf("/dev/loop%d", i), seq: "1"})
	}
	deadline := time.Now().Add(10 * time.Second)
	for removed() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 removals made 10 s after the detaches paused", removed())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRemovalsStartWithinTheirLongestWait: detaches that never pause
// still have their numbers removed once the oldest has waited maxWait.
func TestRemovalsStartWithinTheirLongestWait(t *testing.T) {
	r, removed := countingRemovals(time.Hour, 20*time.Millisecond)
	defer r.Close()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; removed() == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no removal made in 10 s of detaches without a pause")
		}
		r.add(detached{dev: fmt.Sprintf("/dev/loop%d", i), seq: "1"})
		time.Sleep(time.Millisecond)
	}
}

// TestRemovalsStartNow: a thin attach starts the removals waiting for
// detaches to pause at once, rather than claiming their numbers, stuck
// with discards off, one by one.
func TestRemovalsStartNow(t *testing.T) {
	r, removed := countingRemovals(time.Hour, time.Hour)
	defer r.Close()
	for i := range 3 {
		r.add(detached{dev: fmt.Sprintf("/dev/loop%d", i), seq: "1"})
	}
	r.startNow()
	deadline := time.Now().Add(10 * time.Second)
	for removed() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 removals made 10 s after startNow", removed())
		}
		time.Sleep(time.Millisecond)
	}
}

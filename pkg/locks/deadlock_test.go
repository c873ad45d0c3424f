//go:build lockorder

package locks

import (
	"testing"

	deadlock "github.com/sasha-s/go-deadlock"
)

// TestOrderBrokenIsCaught takes two locks in one order and then, in
// another goroutine and never at once, in the other: no deadlock
// happens, and the check must still say the order was broken, as a run
// of converge's tests relies on it to.
func TestOrderBrokenIsCaught(t *testing.T) {
	caught := 0
	exit := deadlock.Opts.OnPotentialDeadlock
	deadlock.Opts.OnPotentialDeadlock = func() { caught++ }
	defer func() { deadlock.Opts.OnPotentialDeadlock = exit }()

	var a, b Mutex
	a.Lock()
	b.Lock()
	b.Unlock()
	a.Unlock()
	if caught != 0 {
		t.Fatalf("one order taken: caught %d, want none", caught)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Lock()
		a.Lock()
		a.Unlock()
		b.Unlock()
	}()
	<-done
	if caught == 0 {
		t.Fatal("a then b, then b then a: the check did not catch it")
	}
}

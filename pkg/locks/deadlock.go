//go:build lockorder

package locks

import (
	"fmt"
	"os"

	deadlock "github.com/sasha-s/go-deadlock"
)

// Mutex is go-deadlock's: it records the order in which locks are taken.
type Mutex = deadlock.Mutex

// RWMutex is go-deadlock's.
type RWMutex = deadlock.RWMutex

func init() {
	// Only the order: a lock held long (mkfs under a pool's lock, a
	// fsync under the log's) is slow, not wrong.
	deadlock.Opts.DeadlockTimeout = 0
	deadlock.Opts.OnPotentialDeadlock = func() {
		fmt.Fprintln(os.Stderr, "converge: two locks were taken in both orders (above); docs/architecture.md, Locks, gives their ranks")
		os.Exit(2)
	}
}

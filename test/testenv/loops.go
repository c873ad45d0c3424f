package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The loop devices and their numbers are the machine's, shared by every
// process on it, and go test runs packages side by side. Tests are written
// to hold with other loop users about (a node has them too); the few that
// check a device number's history (what the kernel keeps for the number's
// next user) cannot, and take the machine's loop devices for themselves
// with OwnLoops. Every test that attaches loop devices, itself or through a
// plugin it starts, shares them first with ShareLoops, so that such a test
// is alone among test processes while it runs.
//
// The lock is flock(2) on a file in the temporary directory, taken shared
// or exclusive, behind a second file, the gate: a test waiting to own the
// devices holds the gate, so no new sharer slips in ahead of it, and it
// waits only for the tests already running to end. A process holds the
// lock once for all its tests (which run one after another): sharers count,
// and a sharer inside an owner's test is covered by the owner's lock.

// loopLock is this process's hold on the machine-wide lock.
var loopLock struct {
	// mu guards the fields below.
	mu sync.Mutex
	// file is the lock file, open and locked while shares > 0 or owned.
	file *os.File
	// shares counts the sharers that have not ended.
	shares int
	// owned is true while a test owns the devices.
	owned bool
}

// ShareLoops declares that tb attaches loop devices, itself or through a
// process it starts, until it ends. It waits while a test of any process
// owns them (OwnLoops). Calling it again, or inside an owner's test, only
// counts.
func ShareLoops(tb testing.TB) {
	tb.Helper()
	loopLock.mu.Lock()
	defer loopLock.mu.Unlock()
	if loopLock.shares == 0 && !loopLock.owned {
		f, err := takeLoopLock(syscall.LOCK_SH)
		if err != nil {
			tb.Fatalf("sharing the loop devices: %v", err)
		}
		loopLock.file = f
	}
	loopLock.shares++
	tb.Cleanup(func() {
		loopLock.mu.Lock()
		defer loopLock.mu.Unlock()
		loopLock.shares--
		if loopLock.shares == 0 && !loopLock.owned {
			loopLock.file.Close() // releases the lock
			loopLock.file = nil
		}
	})
}

// OwnLoops gives t the machine's loop devices for itself until it ends:
// it waits for every test that shares them, in any process, to end, and
// keeps new ones waiting. Only a test that checks a device number's history
// takes it, and says why; it must come before any ShareLoops of the same
// test.
func OwnLoops(t testing.TB) {
	t.Helper()
	loopLock.mu.Lock()
	defer loopLock.mu.Unlock()
	if loopLock.shares > 0 || loopLock.owned {
		t.Fatal("OwnLoops after ShareLoops or OwnLoops in the same process: call it first")
	}
	f, err := takeLoopLock(syscall.LOCK_EX)
	if err != nil {
		t.Fatalf("owning the loop devices: %v", err)
	}
	loopLock.file, loopLock.owned = f, true
	t.Cleanup(func() {
		loopLock.mu.Lock()
		defer loopLock.mu.Unlock()
		loopLock.owned = false
		loopLock.file.Close()
		loopLock.file = nil
		if loopLock.shares > 0 {
			// Sharers the owner's test started and left running.
			f, err := takeLoopLock(syscall.LOCK_SH)
			if err != nil {
				t.Errorf("sharing the loop devices again: %v", err)
				return
			}
			loopLock.file = f
		}
	})
}

// LoopLockPath is the file whose flock(2) the tests take; its gate is the
// same path with ".gate" added.
var LoopLockPath = filepath.Join(os.TempDir(), "converge-test-loops.lock")

// takeLoopLock takes the lock how (LOCK_SH or LOCK_EX) behind the gate and
// returns the open file that holds it.
func takeLoopLock(how int) (*os.File, error) {
	gate, err := flockFile(LoopLockPath+".gate", syscall.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer gate.Close()
	return flockFile(LoopLockPath, how)
}

// flockFile opens path, creating it, and locks it how, waiting as long as
// it takes.
func flockFile(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReleaseLoop detaches a test's loop device and gives its number back to
// the kernel (LOOP_CTL_REMOVE), only while a file in dir backs it: a number
// the test detached itself may serve another process by now, and must be
// left alone. The kernel keeps a detached device's node otherwise, and
// every loop listing on the machine visits every node: 300 left behind made
// each observation about 1 ms slower in every later test. A device held
// open goes at its last close, and its number stays.
func ReleaseLoop(dev, dir string) {
	sys := filepath.Join("/sys/block", filepath.Base(dev))
	b, err := os.ReadFile(filepath.Join(sys, "loop", "backing_file"))
	backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	if err != nil || filepath.Dir(backing) != filepath.Clean(dir) {
		return
	}
	if f, err := os.OpenFile(dev, os.O_RDONLY, 0); err == nil {
		unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
		f.Close()
	}
	removeLoopNumber(dev)
}

// removeLoopNumber removes an unattached loop device (LOOP_CTL_REMOVE); one
// that is attached or open stays (EBUSY).
func removeLoopNumber(dev string) {
	n, err := strconv.Atoi(strings.TrimPrefix(dev, "/dev/loop"))
	if err != nil {
		return
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer ctl.Close()
	unix.IoctlSetInt(int(ctl.Fd()), unix.LOOP_CTL_REMOVE, n)
}

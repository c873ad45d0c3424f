package testenv

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOwnLoopsWaitsForSharers takes the lock as three processes would (each
// lock file opened anew is another holder to flock): an owner waits for the
// sharer that holds it, and a sharer that comes while the owner waits goes
// after the owner, not ahead of it.
func TestOwnLoopsWaitsForSharers(t *testing.T) {
	saved := LoopLockPath
	LoopLockPath = filepath.Join(t.TempDir(), "loops.lock")
	t.Cleanup(func() { LoopLockPath = saved })

	first, err := takeLoopLock(syscall.LOCK_SH)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 2)
	owned := make(chan struct{})
	go func() {
		f, err := takeLoopLock(syscall.LOCK_EX)
		if err != nil {
			t.Error(err)
			close(owned)
			return
		}
		order <- "owner"
		close(owned)
		time.Sleep(50 * time.Millisecond)
		f.Close()
	}()
	// The owner is waiting once it holds the gate.
	waitHeld(t, LoopLockPath+".gate")
	shared := make(chan struct{})
	go func() {
		f, err := takeLoopLock(syscall.LOCK_SH)
		if err != nil {
			t.Error(err)
		} else {
			order <- "sharer"
			f.Close()
		}
		close(shared)
	}()
	select {
	case <-owned:
		t.Fatal("the owner got the lock while a sharer held it")
	case <-time.After(100 * time.Millisecond):
	}
	first.Close()
	<-owned
	<-shared
	if a, b := <-order, <-order; a != "owner" || b != "sharer" {
		t.Errorf("got %s then %s, want the waiting owner before the later sharer", a, b)
	}
}

// waitHeld waits until someone holds path exclusively.
func waitHeld(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := flockFile(path, syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil {
			return // EWOULDBLOCK: held
		}
		f.Close()
		if time.Now().After(deadline) {
			t.Fatalf("nobody took %s", path)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestShareLoopsCounts checks that the sharers of a process take the lock
// once and give it back with the last of them, and that an owner inside the
// process is refused once a sharer holds it.
func TestShareLoopsCounts(t *testing.T) {
	saved := LoopLockPath
	LoopLockPath = filepath.Join(t.TempDir(), "loops.lock")
	t.Cleanup(func() { LoopLockPath = saved })
	t.Run("two sharers", func(t *testing.T) {
		ShareLoops(t)
		t.Run("inner", func(t *testing.T) { ShareLoops(t) })
		if f, err := flockFile(LoopLockPath, syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			f.Close()
			t.Fatal("the lock is free while a sharer runs")
		}
	})
	f, err := flockFile(LoopLockPath, syscall.LOCK_EX|syscall.LOCK_NB)
	if err != nil {
		t.Fatalf("the lock is still held after the sharers ended: %v", err)
	}
	f.Close()
	t.Run("owner", func(t *testing.T) {
		OwnLoops(t)
		ShareLoops(t) // inside the owner: counted only
		if f, err := flockFile(LoopLockPath, syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
			f.Close()
			t.Fatal("the lock can be shared while an owner runs")
		}
	})
	if f, err := flockFile(LoopLockPath, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("the lock is still held after the owner ended: %v", err)
	} else {
		f.Close()
	}
}

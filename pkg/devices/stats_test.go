package devices

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStatfsOfAHungPathRunsOnce: calls on a path whose statfs does not
// return give up at their deadline without starting another, however many
// they are; once it returns, the next call measures afresh.
func TestStatfsOfAHungPathRunsOnce(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	f := &flights{running: map[string]*flight{}, statfs: func(path string, st *unix.Statfs_t) error {
		n := calls.Add(1)
		<-release // hung, until released
		st.Blocks = uint64(n)
		return nil
	}}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if _, err := f.do(ctx, "/hung"); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("a call on a hung path: %v, want its deadline", err)
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d statfs calls on a hung path, want 1", n)
	}
	close(release)
	st, err := f.do(context.Background(), "/hung")
	if err != nil || st.Blocks != 2 {
		t.Fatalf("after it returned: %+v, %v; want a statfs of its own (the second)", st.Blocks, err)
	}
}

// TestStatfsWaitsThenMeasuresAfresh: a call on a path whose statfs is
// merely under way waits for it, then takes its own measure, never the
// one begun before it.
func TestStatfsWaitsThenMeasuresAfresh(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	f := &flights{running: map[string]*flight{}, statfs: func(path string, st *unix.Statfs_t) error {
		n := calls.Add(1)
		if n == 1 {
			close(started)
			<-release
		}
		st.Blocks = uint64(n)
		return nil
	}}
	first := make(chan uint64)
	go func() {
		st, _ := f.do(context.Background(), "/p")
		first <- st.Blocks
	}()
	<-started
	waiting := make(chan struct{})
	f.waits = func(string) { close(waiting) }
	second := make(chan uint64)
	go func() {
		st, err := f.do(context.Background(), "/p")
		if err != nil {
			t.Error(err)
		}
		second <- st.Blocks
	}()
	select {
	case <-waiting:
	case <-time.After(time.Minute):
		t.Fatal("the second call started a statfs of its own beside one under way")
	}
	close(release)
	if a, b := <-first, <-second; a != 1 || b != 2 {
		t.Fatalf("measures %d and %d, want 1 and then a fresh 2", a, b)
	}
}

// TestStatfsOfARealPath measures this test's temporary directory.
func TestStatfsOfARealPath(t *testing.T) {
	u, err := Statfs(context.Background(), t.TempDir())
	if err != nil || u.TotalBytes <= 0 || u.AvailableBytes > u.TotalBytes {
		t.Fatalf("%+v, %v", u, err)
	}
	if _, err := Statfs(context.Background(), "/no/such/path/here"); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a missing path: %v, want ENOENT", err)
	}
}

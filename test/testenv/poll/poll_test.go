package poll

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWait(t *testing.T) {
	notYet, gone := errors.New("not yet"), errors.New("gone")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
		// results are check's answers, one a call; past the end, the last.
		results []error
		want    error // wrapped by Wait's error; nil: Wait returns nil
		calls   int
	}{
		{name: "holds at once", ctx: context.Background(), timeout: time.Hour, results: []error{nil}, calls: 1},
		{name: "holds on the third call", ctx: context.Background(), timeout: time.Hour, results: []error{notYet, notYet, nil}, calls: 3},
		{name: "never holds", ctx: context.Background(), timeout: 20 * time.Millisecond, results: []error{notYet}, want: notYet},
		{name: "stopped", ctx: context.Background(), timeout: 2 * time.Second, results: []error{notYet, Stop(gone)}, want: gone, calls: 2},
		{name: "context done", ctx: cancelled, timeout: 2 * time.Second, results: []error{notYet}, want: context.Canceled, calls: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := Wait(tc.ctx, tc.timeout, time.Millisecond, func() error {
				calls++
				return tc.results[min(calls, len(tc.results))-1]
			})
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.calls != 0 && calls != tc.calls {
				t.Errorf("check called %d times, want %d", calls, tc.calls)
			}
			if tc.want == notYet && calls < 2 {
				t.Errorf("check called %d times before the timeout, want it called again", calls)
			}
		})
	}
}

// TestWaitStoppedIsNotWrapped checks that a stopped wait answers the
// check's own error, not one that speaks of a timeout.
func TestWaitStoppedIsNotWrapped(t *testing.T) {
	gone := errors.New("gone")
	if err := Wait(context.Background(), 2*time.Second, time.Millisecond, func() error { return Stop(gone) }); err != gone {
		t.Errorf("got %v, want %v itself", err, gone)
	}
}

// Package poll is the one way the tests wait for a state they cannot be
// told of: the unit tests, the integration and fault tests, and the e2e
// suite (its own module, which reaches this one through its replace) all
// call check again and again until it holds or a bound passes. A wait
// that a test can be told of (a channel, a fake clock) does not belong
// here.
package poll

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Wait calls check at once and then every interval until it returns nil,
// and returns nil. Once timeout has passed since the call, it returns an
// error saying so that wraps check's last error; once ctx is done, ctx's
// error and check's last. A check that returns Stop(err) ends the wait at
// once with err: the thing waited for can no longer happen (a process
// exited, a failure is not the kind that passes).
func Wait(ctx context.Context, timeout, interval time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		last := check()
		if last == nil {
			return nil
		}
		if s, ok := errors.AsType[stopped](last); ok {
			return s.err
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("not within %s: %w", timeout, last)
		}
		timer := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w: %w", ctx.Err(), last)
		case <-timer.C:
		}
	}
}

// Until is Wait for a test: it fails t at once (t.Fatalf) with what, the
// timeout and check's last error, or with the error a check stopped with.
// It must run on the test's goroutine, as t.Fatalf must.
func Until(t testing.TB, timeout, interval time.Duration, what string, check func() error) {
	t.Helper()
	if err := Wait(context.Background(), timeout, interval, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Stop marks err as final for Wait: check returns Stop(err) to end the
// wait with err, without waiting out the timeout.
func Stop(err error) error { return stopped{err} }

type stopped struct{ err error }

func (s stopped) Error() string { return s.err.Error() }
func (s stopped) Unwrap() error { return s.err }

package e2e

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/converge-csi/converge/test/e2e/soak"
)

// The soak's alerts: a Prometheus beside the cluster (prometheus.go)
// scrapes csi-node and converge-controller and evaluates the chart's
// rules as shipped; the soak polls its alerts all along (soak.AlertLog).
// An alert a fault must raise is looked for while the fault holds, and
// once the soak has settled no alert may be pending or firing.

// alertPoll is how often the soak asks Prometheus for its alerts: as
// often as it evaluates its rules.
const alertPoll = 5 * time.Second

// watchAlerts polls Prometheus's alerts into s.alerts until the returned
// stop.
func (s *soakRun) watchAlerts() (stop func()) {
	s.alerts = soak.NewAlertLog()
	poll, stopPoll := context.WithCancel(s.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for poll.Err() == nil {
			if as, err := s.prometheus.alerts(poll); err == nil {
				s.alerts.Observe(time.Now(), as)
			}
			select {
			case <-poll.Done():
			case <-time.After(alertPoll):
			}
		}
	}()
	return func() {
		stopPoll()
		<-done
	}
}

// alertWhile waits, up to wait, for the alert name with labels match to
// be pending or firing at a poll since since, and reports whether it was.
func (s *soakRun) alertWhile(name string, match map[string]string, since time.Time, wait time.Duration) bool {
	return waitFor(s.ctx, wait, nil, func() error {
		if !s.alerts.SeenSince(name, match, since) {
			return errors.New("not yet")
		}
		return nil
	}) == nil
}

// windowed are the chart's alerts whose expression looks back over a
// window (increase() or avg_over_time() over 10 minutes to an hour): what
// a fault made them count keeps them firing that long after, however
// well the cluster has settled.
var windowed = map[string]bool{
	"ConvergeRepairsRecurring": true, "ConvergeControllerActionsFailing": true,
	"ConvergeNodeWriteRefused": true, "ConvergePoolUnreadable": true,
}

// quiet waits up to wait for no alert to be pending or firing, and counts
// an invariant broken if one still is: but for one of windowed that went
// active before the soak settled (at settled), which it lists. The latest
// poll must be recent: an alert log Prometheus stopped answering proves
// nothing.
func (s *soakRun) quiet(settled time.Time, wait time.Duration) {
	var active []string
	err := waitFor(s.ctx, wait, nil, func() error {
		active = nil
		var left []string
		for _, a := range s.alerts.Current() {
			active = append(active, a.String())
			if !windowed[a.Name] || !a.ActiveAt.Before(settled) {
				left = append(left, a.String())
			}
		}
		if len(left) > 0 {
			return errors.New(strings.Join(left, ", "))
		}
		return nil
	})
	if err != nil {
		s.fail(&s.broken, "settled, alerts still pending or firing %s later: %v", wait, err)
	}
	if last := s.alerts.LastPoll(); time.Since(last) > 4*alertPoll {
		s.fail(&s.broken, "Prometheus's alerts were last read at %s: the soak cannot say none fires", last.Format(time.TimeOnly))
	}
	if len(active) > 0 {
		s.logf("alerts active since before the soak settled, which look back over a window: %s", strings.Join(active, "; "))
	}
}

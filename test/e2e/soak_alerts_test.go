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

// windowGrace is how long after a counter moved an alert on it may go
// active: two scrapes of the API server (every 15 s; increase() needs two
// samples) and an evaluation.
const windowGrace = 40 * time.Second

// quiet waits up to wait for no alert to be pending or firing, and counts
// an invariant broken if one still is: but for one of windowed that went
// active by windowGrace after the soak settled (at settled), which it
// lists. The log must be fresh, and csi-node on each node scraped all
// along: an alert Prometheus could not see proves nothing.
func (s *soakRun) quiet(settled time.Time, wait time.Duration) {
	var active []string
	start := time.Now()
	err := waitFor(s.ctx, wait, nil, func() error {
		active = nil
		var left []string
		for _, a := range s.alerts.Current() {
			active = append(active, a.String())
			if !windowed[a.Name] || a.ActiveAt.After(settled.Add(windowGrace)) {
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
	if as, err := s.prometheus.alerts(s.ctx); err == nil {
		s.alerts.Observe(time.Now(), as)
	}
	if last := s.alerts.LastPoll(); time.Since(last) > 4*alertPoll {
		s.fail(&s.broken, "Prometheus's alerts were last read at %s: the soak cannot say none fires", last.Format(time.TimeOnly))
	}
	for _, n := range s.nodes {
		if up, err := s.prometheus.scraped(s.ctx, n.node, time.Since(start)); err != nil || !up {
			s.fail(&s.broken, "csi-node on %s was not scraped all along while the soak waited for no alert (%v)", n.node, err)
		}
	}
	if len(active) > 0 {
		s.logf("alerts active since before the soak settled, which look back over a window: %s", strings.Join(active, "; "))
	}
}

package soak

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Alert is an alert as Prometheus lists it in one poll of its alerts
// (/api/v1/alerts): pending (its expression holds, not yet for its for:)
// or firing. An alert that is neither is not listed.
type Alert struct {
	Name     string
	Labels   map[string]string // the alert's, alertname among them
	State    string            // "pending" or "firing"
	ActiveAt time.Time         // when it went pending
}

// AlertSeen is what an AlertLog holds of one alert (its name and labels)
// in one state: the alert that went pending and then fired has two.
type AlertSeen struct {
	Name      string
	Labels    map[string]string
	State     string
	ActiveAt  time.Time // Prometheus's, as the first poll that listed it in State said
	FirstSeen time.Time // the time of the first poll that listed it in State
	LastSeen  time.Time // and of the latest
}

// AlertLog is the soak's record of the alerts Prometheus listed at each
// of its polls: which were ever seen, pending or firing, and which are in
// the latest poll. The zero AlertLog is not usable; make one with
// NewAlertLog. Its methods may be called from several goroutines.
type AlertLog struct {
	mu sync.Mutex
	// The fields below are guarded by mu.
	seen   map[string]*AlertSeen // by alertKey
	latest []string              // the alertKeys of the latest poll
	// polled is the time of the latest poll, and activeAt each of its
	// alerts' ActiveAt as it said.
	polled   time.Time
	activeAt map[string]time.Time
}

// NewAlertLog is an AlertLog of no poll.
func NewAlertLog() *AlertLog {
	return &AlertLog{seen: map[string]*AlertSeen{}}
}

// alertKey names an alert in a state: its name, its labels in order and
// the state, each quoted, so that no two differ only in where one ends.
func alertKey(name string, labels map[string]string, state string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%q", name)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		fmt.Fprintf(&b, " %q=%q", k, labels[k])
	}
	fmt.Fprintf(&b, " %q", state)
	return b.String()
}

// Observe records a poll made at, which listed alerts: the alerts the
// log holds are seen at, and they alone are active. A poll that listed
// none leaves none active. alerts is copied: changing it later changes
// nothing in the log.
func (l *AlertLog) Observe(at time.Time, alerts []Alert) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latest = l.latest[:0]
	l.polled, l.activeAt = at, map[string]time.Time{}
	for _, a := range alerts {
		key := alertKey(a.Name, a.Labels, a.State)
		l.activeAt[key] = a.ActiveAt
		s, ok := l.seen[key]
		if !ok {
			s = &AlertSeen{Name: a.Name, Labels: maps.Clone(a.Labels), State: a.State, ActiveAt: a.ActiveAt, FirstSeen: at}
			l.seen[key] = s
		}
		s.LastSeen = at
		if !slices.Contains(l.latest, key) {
			l.latest = append(l.latest, key)
		}
	}
}

// Seen says whether the log holds an alert called name, pending or firing
// at any poll, whose labels match: each label of match has its value on
// the alert. As in PromQL, an empty value matches an alert without the
// label; a nil match matches every alert of the name.
func (l *AlertLog) Seen(name string, match map[string]string) bool {
	return l.SeenSince(name, match, time.Time{})
}

// SeenSince is Seen of the polls at or after since: whether the alert was
// pending or firing at one of them.
func (l *AlertLog) SeenSince(name string, match map[string]string, since time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.seen {
		if s.Name == name && matches(s.Labels, match) && !s.LastSeen.Before(since) {
			return true
		}
	}
	return false
}

// matches says whether labels have each value of match.
func matches(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Active lists the alerts of the latest poll, each as its name, its
// labels but alertname, and its state (`ConvergeNotReady{node="n1",
// severity="critical"} pending`), sorted. It is empty before the first
// poll, and after a poll that listed none.
func (l *AlertLog) Active() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.latest))
	for _, key := range l.latest {
		out = append(out, l.seen[key].String())
	}
	slices.Sort(out)
	return out
}

// Current lists the alerts of the latest poll, sorted as Entries, each
// with the ActiveAt that poll gave it (an alert that went inactive and
// active again since it was first seen has a later one).
func (l *AlertLog) Current() []AlertSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]AlertSeen, 0, len(l.latest))
	for _, key := range slices.Sorted(slices.Values(l.latest)) {
		a := *l.seen[key]
		a.Labels = maps.Clone(a.Labels)
		a.ActiveAt = l.activeAt[key]
		out = append(out, a)
	}
	return out
}

// LastPoll is the time of the latest poll; zero before the first.
func (l *AlertLog) LastPoll() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.polled
}

// Entries lists every alert the log holds, in each state it was seen in,
// by name, then labels, then state. The entries are copies: changing one
// changes nothing in the log.
func (l *AlertLog) Entries() []AlertSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]AlertSeen, 0, len(l.seen))
	for _, s := range l.seen {
		c := *s
		c.Labels = maps.Clone(s.Labels)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b AlertSeen) int {
		return strings.Compare(alertKey(a.Name, a.Labels, a.State), alertKey(b.Name, b.Labels, b.State))
	})
	return out
}

// String is the alert as Active lists it.
func (s AlertSeen) String() string {
	var labels []string
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		if k != "alertname" {
			labels = append(labels, fmt.Sprintf("%s=%q", k, s.Labels[k]))
		}
	}
	return fmt.Sprintf("%s{%s} %s", s.Name, strings.Join(labels, ","), s.State)
}

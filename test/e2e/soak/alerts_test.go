package soak

import (
	"slices"
	"testing"
	"time"
)

// poll is one poll of Prometheus's alerts, at t0 plus at seconds.
type poll struct {
	at     int
	alerts []Alert
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func notReady(node, state string) Alert {
	return Alert{Name: "ConvergeNotReady", State: state, ActiveAt: t0,
		Labels: map[string]string{"alertname": "ConvergeNotReady", "node": node, "severity": "critical"}}
}

func noLeader(state string) Alert {
	return Alert{Name: "ConvergeControllerNoLeader", State: state, ActiveAt: t0,
		Labels: map[string]string{"alertname": "ConvergeControllerNoLeader", "severity": "warning"}}
}

// seenCase is a question to AlertLog.Seen and its answer.
type seenCase struct {
	name  string
	match map[string]string
	want  bool
}

// alertLogCases are TestAlertLog's: polls, then what Seen and Active
// answer.
var alertLogCases = []struct {
	name   string
	polls  []poll
	seen   []seenCase
	active []string
}{
	{
		name: "no poll",
		seen: []seenCase{{"ConvergeNotReady", nil, false}},
	},
	{
		name:  "pending, firing, then resolved",
		polls: []poll{{0, []Alert{notReady("n1", "pending")}}, {5, []Alert{notReady("n1", "firing")}}, {10, nil}},
		seen: []seenCase{
			{"ConvergeNotReady", nil, true},
			{"ConvergeNotReady", map[string]string{"node": "n1"}, true},
			{"ConvergeNotReady", map[string]string{"node": "n2"}, false},
			{"ConvergeControllerNoLeader", nil, false},
		},
	},
	{
		name: "still active in the latest poll",
		polls: []poll{
			{0, []Alert{notReady("n1", "pending"), notReady("n2", "pending")}},
			{5, []Alert{noLeader("firing"), notReady("n2", "pending")}},
		},
		seen: []seenCase{{"ConvergeNotReady", map[string]string{"node": "n1"}, true}, {"ConvergeControllerNoLeader", nil, true}},
		active: []string{
			`ConvergeControllerNoLeader{severity="warning"} firing`,
			`ConvergeNotReady{node="n2",severity="critical"} pending`,
		},
	},
	{
		name:  "a match needs every label",
		polls: []poll{{0, []Alert{notReady("n1", "pending")}}},
		seen: []seenCase{
			{"ConvergeNotReady", map[string]string{"node": "n1", "severity": "critical"}, true},
			{"ConvergeNotReady", map[string]string{"node": "n1", "severity": "warning"}, false},
			{"ConvergeNotReady", map[string]string{"pod": "converge-node-x"}, false},
		},
		active: []string{`ConvergeNotReady{node="n1",severity="critical"} pending`},
	},
	{
		name:  "an empty value matches an absent label",
		polls: []poll{{0, []Alert{noLeader("pending")}}},
		seen: []seenCase{
			{"ConvergeControllerNoLeader", map[string]string{"node": ""}, true},
			{"ConvergeControllerNoLeader", map[string]string{"severity": ""}, false},
		},
		active: []string{`ConvergeControllerNoLeader{severity="warning"} pending`},
	},
	{
		name:   "an alert listed twice in a poll is active once",
		polls:  []poll{{0, []Alert{noLeader("pending"), noLeader("pending")}}},
		seen:   []seenCase{{"ConvergeControllerNoLeader", nil, true}},
		active: []string{`ConvergeControllerNoLeader{severity="warning"} pending`},
	},
}

func TestAlertLog(t *testing.T) {
	for _, tc := range alertLogCases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewAlertLog()
			for _, p := range tc.polls {
				l.Observe(t0.Add(time.Duration(p.at)*time.Second), p.alerts)
			}
			for _, s := range tc.seen {
				if got := l.Seen(s.name, s.match); got != s.want {
					t.Errorf("Seen(%s, %v): got %v, want %v", s.name, s.match, got, s.want)
				}
			}
			if got := l.Active(); !slices.Equal(got, tc.active) {
				t.Errorf("Active: got %q, want %q", got, tc.active)
			}
		})
	}
}

func TestAlertLogEntries(t *testing.T) {
	l := NewAlertLog()
	for _, p := range []poll{
		{0, []Alert{notReady("n1", "pending")}},
		{5, []Alert{notReady("n1", "pending"), noLeader("pending")}},
		{10, []Alert{notReady("n1", "firing")}},
		{15, nil},
		// Again, after a poll without it.
		{20, []Alert{notReady("n1", "pending")}},
	} {
		l.Observe(t0.Add(time.Duration(p.at)*time.Second), p.alerts)
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	want := []struct {
		name, state string
		first, last time.Time
	}{
		{"ConvergeControllerNoLeader", "pending", at(5), at(5)},
		{"ConvergeNotReady", "firing", at(10), at(10)},
		{"ConvergeNotReady", "pending", at(0), at(20)},
	}
	got := l.Entries()
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.name || g.State != w.state || !g.FirstSeen.Equal(w.first) || !g.LastSeen.Equal(w.last) || !g.ActiveAt.Equal(t0) {
			t.Errorf("entry %d: got %s first %s last %s active %s, want %s %s first %s last %s", i, g.Name, g.FirstSeen, g.LastSeen, g.ActiveAt,
				w.name, w.state, w.first, w.last)
		}
	}
	if got := l.Active(); !slices.Equal(got, []string{`ConvergeNotReady{node="n1",severity="critical"} pending`}) {
		t.Errorf("Active: got %q", got)
	}
}

// TestAlertLogCopies checks that neither the alerts given to Observe nor
// the entries Entries returns share anything with the log.
func TestAlertLogCopies(t *testing.T) {
	l := NewAlertLog()
	alerts := []Alert{notReady("n1", "pending")}
	l.Observe(t0, alerts)
	alerts[0].Labels["node"] = "n9"
	alerts[0].Name = "Other"
	entries := l.Entries()
	entries[0].Labels["node"] = "n8"
	entries[0].State = "firing"
	if !l.Seen("ConvergeNotReady", map[string]string{"node": "n1"}) {
		t.Errorf("Seen: got false after the caller changed its copies, want true")
	}
	if got := l.Entries(); got[0].Labels["node"] != "n1" || got[0].State != "pending" {
		t.Errorf("Entries: got %v, want node n1 pending", got[0])
	}
	if got, want := l.Active(), []string{`ConvergeNotReady{node="n1",severity="critical"} pending`}; !slices.Equal(got, want) {
		t.Errorf("Active: got %q, want %q", got, want)
	}
}

// TestAlertLogSeenSince checks that SeenSince counts only the polls from
// its time on: an alert seen before a fault began is no sign of the
// fault's.
func TestAlertLogSeenSince(t *testing.T) {
	l := NewAlertLog()
	l.Observe(t0, []Alert{notReady("n1", "pending")})
	l.Observe(t0.Add(10*time.Second), nil)
	match := map[string]string{"node": "n1"}
	for _, c := range []struct {
		since time.Time
		want  bool
	}{{time.Time{}, true}, {t0, true}, {t0.Add(time.Second), false}} {
		if got := l.SeenSince("ConvergeNotReady", match, c.since); got != c.want {
			t.Errorf("SeenSince(%s): got %v, want %v", c.since, got, c.want)
		}
	}
	l.Observe(t0.Add(20*time.Second), []Alert{notReady("n1", "firing")})
	if !l.SeenSince("ConvergeNotReady", match, t0.Add(time.Second)) {
		t.Errorf("SeenSince after it fired again: got false, want true")
	}
	if l.SeenSince("ConvergeNotReady", map[string]string{"node": "n2"}, time.Time{}) {
		t.Errorf("SeenSince of another node: got true, want false")
	}
}

// TestAlertLogCurrent checks that Current lists the latest poll's alerts
// with the ActiveAt that poll gave: an alert that resolved and went active
// again is active since the second time.
func TestAlertLogCurrent(t *testing.T) {
	l := NewAlertLog()
	if !l.LastPoll().IsZero() || len(l.Current()) != 0 {
		t.Fatalf("a new log: last poll %s, current %v", l.LastPoll(), l.Current())
	}
	first := notReady("n1", "pending")
	l.Observe(t0, []Alert{first})
	l.Observe(t0.Add(10*time.Second), nil)
	if got := l.Current(); len(got) != 0 {
		t.Errorf("after a poll of none: current %v", got)
	}
	again := notReady("n1", "pending")
	again.ActiveAt = t0.Add(20 * time.Second)
	l.Observe(t0.Add(25*time.Second), []Alert{again})
	got := l.Current()
	if len(got) != 1 || !got[0].ActiveAt.Equal(again.ActiveAt) || !got[0].FirstSeen.Equal(t0) {
		t.Errorf("current: got %+v, want one active at %s, first seen %s", got, again.ActiveAt, t0)
	}
	if !l.LastPoll().Equal(t0.Add(25 * time.Second)) {
		t.Errorf("last poll: got %s", l.LastPoll())
	}
}

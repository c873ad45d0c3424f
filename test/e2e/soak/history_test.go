package soak

import (
	"slices"
	"testing"
	"time"
)

func TestHistory(t *testing.T) {
	h := NewHistory()
	if err := h.New("v"); err != nil {
		t.Fatal(err)
	}
	if err := h.New("v"); err == nil {
		t.Errorf("a volume noted twice")
	}
	h.Ack("v", 0)
	h.Ack("v", 4)
	h.Ack("v", 2) // acknowledged late, in another read of the log
	snap, err := h.Lineage("v")
	if err != nil {
		t.Fatal(err)
	}
	h.Ack("v", 9) // after the snapshot was asked for
	if err := h.Restore("r", snap); err != nil {
		t.Fatal(err)
	}
	h.Ack("r", 1)
	clone, _ := h.Lineage("r")
	if err := h.Restore("c", clone); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		owner string
		want  []Expect
	}{
		{"v", []Expect{{"v", 10}}},
		{"r", []Expect{{"v", 5}, {"r", 2}}},
		{"c", []Expect{{"v", 5}, {"r", 2}, {"c", 0}}},
	} {
		got, err := h.Lineage(tc.owner)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.owner, got, err, tc.want)
		}
	}
	if _, err := h.Lineage("ghost"); err == nil {
		t.Errorf("the lineage of a volume never noted")
	}
	if err := h.Restore("x", nil); err == nil {
		t.Errorf("a restore of nothing")
	}
}

// TestReadHoldsAnOpenToTheAcksBeforeIt: a restarted writer's open is held
// to its last run's acks, though that run's log is read after its own, and
// a writer's own acks, though the clock stepped back between its open and
// them, do not count against its open.
func TestReadHoldsAnOpenToTheAcksBeforeIt(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 11, 29, 19, 0, s, 0, time.UTC) }
	ack := func(s int, owner string, seq uint64) Line { return Line{at(s), LineAck, owner, seq} }
	open := func(s int, owner string, n uint64) Line { return Line{at(s), LineOpen, owner, n} }
	for _, tc := range []struct {
		name  string
		files [][]Line
		lost  []string
	}{
		{"a new run's log read before its last run's", [][]Line{
			{open(10, "v", 5), ack(11, "v", 20)},
			{open(0, "v", 0), ack(1, "v", 9)},
		}, []string{"volume v: its writer began again on 5 of its records, but 10 were acknowledged: 5 lost"}},
		{"a run that found all", [][]Line{
			{open(10, "v", 12), ack(11, "v", 20)},
			{open(0, "v", 0), ack(1, "v", 9)},
		}, nil},
		{"the clock stepped back after an open", [][]Line{
			{open(0, "v", 0), ack(1, "v", 9)},
			{open(10, "v", 10), ack(9, "v", 30), ack(12, "v", 40)},
		}, nil},
		{"another owner's acks", [][]Line{
			{open(0, "w", 0), ack(1, "w", 90)},
			{open(10, "v", 0), ack(11, "v", 3)},
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory()
			if got := h.Read(Order(tc.files)); !slices.Equal(got, tc.lost) {
				t.Errorf("%q, want %q", got, tc.lost)
			}
		})
	}
}

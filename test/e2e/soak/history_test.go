package soak

import (
	"slices"
	"testing"
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

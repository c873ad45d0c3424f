package soak

import (
	"errors"
	"slices"
	"testing"

	"go.etcd.io/gofail/runtime"
)

// testFailpoint is a failpoint of gofail's runtime, registered once per
// test process (a second registration of a name panics), that the terms
// are tried on.
var testFailpoint = runtime.NewFailpoint("soakTerms")

func TestPickFailpointReplays(t *testing.T) {
	names := []string{"reconcilerBeforeAction", "stateLogAfterSync", "devicesImageAfterRename"}
	shuffled := []string{"stateLogAfterSync", "devicesImageAfterRename", "reconcilerBeforeAction"}
	for draw := -3; draw < 200; draw++ {
		name, term := PickFailpoint(names, draw)
		if n2, t2 := PickFailpoint(names, draw); n2 != name || t2 != term {
			t.Fatalf("draw %d: got %s=%s, then %s=%s", draw, name, term, n2, t2)
		}
		if n2, t2 := PickFailpoint(shuffled, draw); n2 != name || t2 != term {
			t.Errorf("draw %d: got %s=%s from the names in another order, want %s=%s", draw, n2, t2, name, term)
		}
		if !slices.Contains(names, name) {
			t.Errorf("draw %d: got failpoint %q, want one of %v", draw, name, names)
		}
	}
	if name, term := PickFailpoint(nil, 7); name != "" || term != "" {
		t.Errorf("no names: got %q=%q, want nothing", name, term)
	}
}

func TestPickFailpointCoversEveryTerm(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	terms := []string{CrashTerm, KillTerm, "1*sleep(500)", "1*sleep(1500)", "1*sleep(3000)"}
	seen := map[[2]string]int{}
	span := len(names) * 3 * len(failpointDelays)
	for draw := range span {
		name, term := PickFailpoint(names, draw)
		seen[[2]string{name, term}]++
	}
	for _, n := range names {
		for _, term := range terms {
			if seen[[2]string{n, term}] == 0 {
				t.Errorf("no draw of %d picks %s=%s", span, n, term)
			}
		}
	}
	if len(seen) != len(names)*len(terms) {
		t.Errorf("got %d pairs, want %d: %v", len(seen), len(names)*len(terms), seen)
	}
	crashes, kills := 0, 0
	for p, k := range seen {
		switch p[1] {
		case CrashTerm:
			crashes += k
		case KillTerm:
			kills += k
		}
	}
	if crashes != span/3 || kills != span/3 {
		t.Errorf("got %d crashes and %d kills in %d draws, want a third each", crashes, kills, span)
	}
}

// TestFailpointTermsAreGofails checks every term against gofail's own
// runtime: it parses, and the crash panics once, then lets the failpoint
// pass.
func TestFailpointTermsAreGofails(t *testing.T) {
	// One name: the draws 2, 5, 8... sleep for each delay in turn.
	terms := []string{CrashTerm, KillTerm}
	for i := range failpointDelays {
		_, term := PickFailpoint([]string{"x"}, 3*i+2)
		terms = append(terms, term)
	}
	for _, term := range terms {
		if err := runtime.Enable("soakTerms", term); err != nil {
			t.Errorf("gofail refuses %s: %v", term, err)
		}
		if got, _, err := runtime.Status("soakTerms"); err != nil || got != term {
			t.Errorf("gofail's status: got %q (%v), want %q", got, err, term)
		}
	}
	if err := runtime.Enable("soakTerms", CrashTerm); err != nil {
		t.Fatal(err)
	}
	defer runtime.Disable("soakTerms")
	panicked := func() (p any) {
		defer func() { p = recover() }()
		testFailpoint.Acquire()
		return nil
	}
	if p := panicked(); p != `failpoint panic: soak` {
		t.Errorf("the first pass: got panic %v, want %q", p, "failpoint panic: soak")
	}
	if p := panicked(); p != nil {
		t.Errorf("the second pass: got panic %v, want none", p)
	}
	if _, err := testFailpoint.Acquire(); !errors.Is(err, runtime.ErrDisabled) {
		t.Errorf("the third pass: got %v, want %v", err, runtime.ErrDisabled)
	}
}

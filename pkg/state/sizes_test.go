package state

import (
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
)

func TestRange(t *testing.T) {
	for _, tc := range []struct {
		name  string
		r     Range
		have  int64
		check classified.Kind
		grows classified.Kind
	}{
		{name: "empty", r: Range{}, have: 10, check: -1, grows: -1},
		{name: "negative required", r: Range{Required: -1}, check: classified.KindInvalidArgument, grows: -1},
		{name: "negative limit", r: Range{Limit: -1}, check: classified.KindInvalidArgument, grows: -1},
		{name: "required over limit", r: Range{Required: 11, Limit: 10}, check: classified.KindOutOfRange, grows: -1},
		{name: "at the limit", r: Range{Required: 10, Limit: 10}, have: 10, check: -1, grows: -1},
		{name: "would shrink", r: Range{Limit: 10}, have: 11, check: -1, grows: classified.KindOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := kindOf(tc.r.Check()); got != tc.check {
				t.Errorf("Check: got %v, want %v", got, tc.check)
			}
			if got := kindOf(tc.r.Grows("v", tc.have)); got != tc.grows {
				t.Errorf("Grows(%d): got %v, want %v", tc.have, got, tc.grows)
			}
		})
	}
}

// kindOf is err's kind, -1 for no error.
func kindOf(err error) classified.Kind {
	if err == nil {
		return -1
	}
	return classified.AsError(err).Kind
}

func TestValidPoolName(t *testing.T) {
	for name, ok := range map[string]bool{"default": true, "nvme-0": true, "a": true, "9": true, "": false, "-a": false, "a-": false,
		"Fast": false, "a_b": false, "a.b": false, string(make([]byte, 64)): false, "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk": true} {
		if err := ValidPoolName(name); (err == nil) != ok {
			t.Errorf("%q: got %v, want valid %t", name, err, ok)
		}
	}
}

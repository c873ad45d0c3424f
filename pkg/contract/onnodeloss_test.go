package contract

import (
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
)

func TestParseOnNodeLoss(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want OnNodeLoss
		ok   bool
	}{
		{"", OnNodeLossRetain, true},
		{"retain", OnNodeLossRetain, true},
		{"release", OnNodeLossRelease, true},
		{"Release", "", false},
		{"delete", "", false},
		{" retain", "", false},
	} {
		got, err := ParseOnNodeLoss(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("ParseOnNodeLoss(%q) = %q, %v; want %q, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && classified.AsError(err).Kind != classified.KindInvalidArgument {
			t.Errorf("ParseOnNodeLoss(%q): kind %v, want InvalidArgument", tc.in, classified.AsError(err).Kind)
		}
	}
}

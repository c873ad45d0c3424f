package contract

import (
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
)

func TestValidID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"pvc-1234", true}, {"a.b_c-D", true}, {"", false}, {".", false}, {"..", false},
		{".hidden", false}, {"a/b", false}, {"a b", false}, {"é", false},
		{string(make([]byte, 129)), false},
	}
	for _, tc := range tests {
		if err := ValidID(tc.id); (err == nil) != tc.ok {
			t.Errorf("ValidID(%q): got %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

// kindOf is err's kind, -1 for no error.
func kindOf(err error) classified.Kind {
	if err == nil {
		return -1
	}
	return classified.AsError(err).Kind
}

// TestCheckID owns the one rule for IDs as a classified answer: none is
// INVALID_ARGUMENT; one ValidID refuses is INVALID_ARGUMENT for a request
// that records it and NOT_FOUND for one that finds what it names
// (Finds); a valid one passes either way.
func TestCheckID(t *testing.T) {
	for _, tc := range []struct {
		id             string
		records, finds classified.Kind
	}{
		{id: "", records: classified.KindInvalidArgument, finds: classified.KindInvalidArgument},
		{id: "../x", records: classified.KindInvalidArgument, finds: classified.KindNotFound},
		{id: ".hidden", records: classified.KindInvalidArgument, finds: classified.KindNotFound},
		{id: string(make([]byte, 129)), records: classified.KindInvalidArgument, finds: classified.KindNotFound},
		{id: "v_node", records: -1, finds: -1},
	} {
		if got := kindOf(CheckID("volume", tc.id, Records)); got != tc.records {
			t.Errorf("%q recorded: got %v, want %v", tc.id, got, tc.records)
		}
		if got := kindOf(CheckID("volume", tc.id, Finds)); got != tc.finds {
			t.Errorf("%q found: got %v, want %v", tc.id, got, tc.finds)
		}
	}
}

// TestNodeOfID: the node is what follows the last separator, so a name
// that holds one itself still gives the node; an ID with none names none.
func TestNodeOfID(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"snapshot-1_node-a", "node-a"},
		{"groupsnapshot-42_db-0_node-a", "node-a"},
		{"pvc-1", ""},
		{"pvc-1_", ""},
		{"_node-a", "node-a"},
	} {
		if got := NodeOfID(tc.id); got != tc.want {
			t.Errorf("NodeOfID(%q): got %q, want %q", tc.id, got, tc.want)
		}
	}
}

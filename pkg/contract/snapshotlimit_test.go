package contract

import (
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
)

// TestParseMaxSnapshots owns the per-volume snapshot cap's values: absent
// is no cap, a positive whole number is the cap, and anything else is
// INVALID_ARGUMENT naming the key and the value.
func TestParseMaxSnapshots(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   int
		ok     bool
	}{
		{name: "absent", params: nil, want: 0, ok: true},
		{name: "other keys only", params: map[string]string{"csi.storage.k8s.io/volumesnapshot/name": "s"}, want: 0, ok: true},
		{name: "one", params: map[string]string{MaxSnapshotsPerVolumeKey: "1"}, want: 1, ok: true},
		{name: "ten", params: map[string]string{MaxSnapshotsPerVolumeKey: "10"}, want: 10, ok: true},
		{name: "the largest", params: map[string]string{MaxSnapshotsPerVolumeKey: "2147483647"}, want: 1<<31 - 1, ok: true},
		{name: "zero", params: map[string]string{MaxSnapshotsPerVolumeKey: "0"}},
		{name: "negative", params: map[string]string{MaxSnapshotsPerVolumeKey: "-1"}},
		{name: "signed", params: map[string]string{MaxSnapshotsPerVolumeKey: "+3"}},
		{name: "a word", params: map[string]string{MaxSnapshotsPerVolumeKey: "x"}},
		{name: "a fraction", params: map[string]string{MaxSnapshotsPerVolumeKey: "1.5"}},
		{name: "empty", params: map[string]string{MaxSnapshotsPerVolumeKey: ""}},
		{name: "spaces", params: map[string]string{MaxSnapshotsPerVolumeKey: " 3"}},
		{name: "too large", params: map[string]string{MaxSnapshotsPerVolumeKey: "2147483648"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMaxSnapshots(tc.params)
			if got != tc.want || (err == nil) != tc.ok {
				t.Fatalf("got %d, %v; want %d, ok %v", got, err, tc.want, tc.ok)
			}
			if err == nil {
				return
			}
			if k := classified.AsError(err).Kind; k != classified.KindInvalidArgument {
				t.Errorf("got kind %v, want InvalidArgument", k)
			}
			if v := tc.params[MaxSnapshotsPerVolumeKey]; !strings.Contains(err.Error(), MaxSnapshotsPerVolumeKey) || !strings.Contains(err.Error(), `"`+v+`"`) {
				t.Errorf("got %q, want it to name %s and the value %q", err, MaxSnapshotsPerVolumeKey, v)
			}
		})
	}
}

// TestSnapshotParametersAreCopies checks that no importer can widen what a
// snapshot class may carry.
func TestSnapshotParametersAreCopies(t *testing.T) {
	SnapshotParameters()[0] = "x"
	GroupSnapshotParameters()[0] = "x"
	if got := SnapshotParameters(); len(got) != 1 || got[0] != MaxSnapshotsPerVolumeKey {
		t.Errorf("SnapshotParameters: got %v, want [%s]", got, MaxSnapshotsPerVolumeKey)
	}
	if got := GroupSnapshotParameters(); len(got) != 2 || got[0] != GroupDeletionPolicyKey || got[1] != MaxSnapshotsPerVolumeKey {
		t.Errorf("GroupSnapshotParameters: got %v, want [%s %s]", got, GroupDeletionPolicyKey, MaxSnapshotsPerVolumeKey)
	}
}

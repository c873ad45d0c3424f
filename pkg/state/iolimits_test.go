package state

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/converge-csi/converge/pkg/host"
)

// TestIOLimitsGenerations checks that the IO limits intent takes the
// generation of the update that changes its limits, and keeps it through
// other updates and through the same limits asked again (which write
// nothing), so that a result under IOLimitsKey tells limits applied from
// limits asked for; removing every limit is a change like any other.
func TestIOLimitsGenerations(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	limits := host.IOLimits{ReadIOPS: 100, WriteBPS: 1 << 20}
	steps := []struct {
		name    string
		fn      func(v *Volume) error
		wantGen int64 // of the record
		wantIO  int64 // of the intent; 0 for none
		want    host.IOLimits
	}{
		{"made with its class's limits", func(v *Volume) error {
			v.RecordMade("v", DefaultPool, ProvisionThick, AccessMount, limits)
			return nil
		}, 1, 1, limits},
		{"another change keeps the limits' generation", func(v *Volume) error { v.FsSize = 1 << 30; return nil }, 2, 1, limits},
		{"the same limits again write nothing", func(v *Volume) error { return v.RequestIOLimits(limits) }, 2, 1, limits},
		{"other limits", func(v *Volume) error { return v.RequestIOLimits(host.IOLimits{ReadIOPS: 50}) }, 3, 3, host.IOLimits{ReadIOPS: 50}},
		{"every limit removed", func(v *Volume) error { return v.RequestIOLimits(host.IOLimits{}) }, 4, 4, host.IOLimits{}},
		{"none again write nothing", func(v *Volume) error { return v.RequestIOLimits(host.IOLimits{}) }, 4, 4, host.IOLimits{}},
	}
	for _, st := range steps {
		v, err := s.Update("v", st.fn)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		var gotIO int64
		if v.IOLimits != nil {
			gotIO = v.IOLimits.Generation
		}
		if v.Generation != st.wantGen || gotIO != st.wantIO || v.WantsIOLimits() != st.want {
			t.Errorf("%s: got generation %d, limits %+v at %d; want %d, %+v at %d", st.name, v.Generation, v.WantsIOLimits(), gotIO, st.wantGen, st.want, st.wantIO)
		}
	}
}

// TestIOLimitsSurviveReopen checks that the IO limits asked of a volume
// are in its record after the store is opened again, and that a record
// written before limits existed reads as one without limits.
func TestIOLimitsSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	limits := host.IOLimits{ReadIOPS: 2, WriteIOPS: 3, ReadBPS: 100 << 20, WriteBPS: 50e6}
	written, err := s.Update("v", func(v *Volume) error {
		v.RecordMade("v", DefaultPool, ProvisionThin, AccessBlock, limits)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := openStore(t, path).Get("v")
	if err != nil {
		t.Fatal(err)
	}
	if got.IOLimits == nil || *got.IOLimits != *written.IOLimits {
		t.Errorf("after reopen: got %+v, want %+v", got.IOLimits, written.IOLimits)
	}

	var old Volume
	if err := json.Unmarshal([]byte(`{"id":"o","generation":3,"provisioning":"thick","access":"mount"}`), &old); err != nil {
		t.Fatal(err)
	}
	if old.IOLimits != nil || !old.WantsIOLimits().IsZero() {
		t.Errorf("a record older than IO limits: got %+v, want none", old.IOLimits)
	}
}

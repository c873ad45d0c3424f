package driver

import (
	"path/filepath"
	"testing"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// TestDropTempSnapshotIntents checks that a start forgets the intents of
// the snapshots only an interrupted clone needed, and keeps every other.
func TestDropTempSnapshotIntents(t *testing.T) {
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	snaps := &devices.Snapshots{Dir: t.TempDir()}
	temp := snaps.TempID("clone-v2")
	if _, err := store.Update("v1", func(v *state.Volume) error {
		v.Provisioning = state.ProvisionThick
		v.Snapshots = map[string]*state.SnapshotIntent{temp: {}, "s1_node": {}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := dropTempSnapshotIntents(store, snaps.IsTemp); err != nil {
		t.Fatal(err)
	}
	v, err := store.Get("v1")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Snapshots) != 1 || v.Snapshots["s1_node"] == nil {
		t.Errorf("snapshot intents after the start: got %v, want only s1_node", v.SnapshotIDs())
	}
}

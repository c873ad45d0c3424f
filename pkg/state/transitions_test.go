package state

import (
	"maps"
	"path/filepath"
	"testing"
)

// record is a volume staged at generation 3 with a live publish at /a
// (generation 4) and a withdrawn one at /b (generation 5).
func record() *Volume {
	return &Volume{ID: "v", Generation: 5,
		Stage:  &Stage{Path: "/s", Generation: 3},
		Expand: &Expand{Bytes: 1 << 30, Generation: 3},
		Publishes: map[string]*Publish{
			"/a": {Generation: 4},
			"/b": {Generation: 5, Deleting: true},
		}}
}

// TestTransitionsApplyToTheirGeneration checks each transition on the
// intent of its generation, and that an intent of another generation, or
// in the other state (live or withdrawn), is left as it is.
func TestTransitionsApplyToTheirGeneration(t *testing.T) {
	v := record()
	if v.ForgetPublish("/a", 4) || v.ForgetPublish("/b", 4) || v.Publishes["/b"] == nil {
		t.Error("forgot a live publish, or one of another generation")
	}
	if !v.ForgetPublish("/b", 5) || v.Publishes["/b"] != nil {
		t.Error("kept a withdrawn publish of its generation")
	}

	v = record()
	if v.RecordMountID("/b", 5, 7) || v.RecordMountID("/a", 3, 7) || v.RecordMountID("", 4, 7) {
		t.Error("recorded a mount ID on a withdrawn intent or another generation")
	}
	if !v.RecordMountID("/a", 4, 7) || !v.RecordMountID("", 3, 8) || v.Publishes["/a"].MountID != 7 || v.Stage.MountID != 8 {
		t.Errorf("mount IDs not recorded: %+v, %+v", v.Publishes["/a"], v.Stage)
	}

	v = record()
	if _, ok := v.WithdrawStage(4); ok || v.Stage.Deleting {
		t.Error("withdrew a stage of another generation")
	}
	pubs, ok := v.WithdrawStage(3)
	if !ok || !v.Stage.Deleting || !maps.Equal(pubs, map[string]int64{"/a": 4}) || !v.Publishes["/a"].Deleting {
		t.Errorf("withdrawing the stage: ok %v, publishes %v, record %+v", ok, pubs, v)
	}
	if _, ok := v.WithdrawStage(3); ok {
		t.Error("withdrew a withdrawn stage again")
	}
	if v.ForgetStage(4) || !v.ForgetStage(3) || v.Stage != nil || v.Expand != nil {
		t.Errorf("forgetting the withdrawn stage: %+v", v)
	}

	v = record()
	if v.WithdrawPublish("/a", 5) || v.WithdrawPublish("/b", 5) || !v.WithdrawPublish("/a", 4) || !v.Publishes["/a"].Deleting {
		t.Errorf("withdrawing publishes: %+v", v.Publishes)
	}

	v = record()
	if v.KeepStaged(3) {
		t.Error("kept a live stage as if withdrawn")
	}
	v.Stage.Deleting = true
	if v.KeepStaged(4) || !v.KeepStaged(3) || v.Stage.Deleting {
		t.Errorf("keeping the stage: %+v", v.Stage)
	}
	if v.ForgetStage(3) {
		t.Error("forgot a stage kept live")
	}
}

// TestWithdrawIdleStage: a deletion withdraws a stage left
// without publishes, and nothing else.
func TestWithdrawIdleStage(t *testing.T) {
	v := record()
	if v.WithdrawIdleStage() || v.Stage.Deleting {
		t.Error("withdrew a stage under publishes (one live, one withdrawn)")
	}
	v.Publishes = nil
	v.Snapshots = map[string]*SnapshotIntent{"s": {Generation: 6}}
	if v.WithdrawIdleStage() || v.Stage.Deleting {
		t.Error("withdrew a stage under a snapshot being taken")
	}
	v.Snapshots = nil
	v.Frozen = v.Stage.Path
	if v.WithdrawIdleStage() || v.Stage.Deleting {
		t.Error("withdrew a stage a snapshot left frozen")
	}
	v.Frozen = ""
	if !v.WithdrawIdleStage() || !v.Stage.Deleting {
		t.Error("kept a filesystem stage with nothing on it (the kubelet forgets those too)")
	}
	if v.WithdrawIdleStage() {
		t.Error("withdrew a withdrawn stage again")
	}
}

// TestSnapshotIntents checks that a snapshot intent takes the generation
// of the update that asks for it and keeps it while other intents change,
// that it holds the volume's removal back, and that ForgetSnapshot drops
// only the intent of its generation.
func TestSnapshotIntents(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	v, err := s.Update("v", func(v *Volume) error { v.Provisioning = ProvisionThick; return nil })
	if err != nil {
		t.Fatal(err)
	}
	v, err = s.Update("v", func(v *Volume) error {
		v.Snapshots = map[string]*SnapshotIntent{"s1": {}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gen := v.Snapshots["s1"].Generation
	if gen != v.Generation {
		t.Fatalf("snapshot intent generation: got %d, want %d", gen, v.Generation)
	}
	v, err = s.Update("v", func(v *Volume) error { v.Stage = stage("/s"); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Snapshots["s1"].Generation; got != gen {
		t.Errorf("another intent's change restamped the snapshot: got %d, want %d", got, gen)
	}
	v.Stage = nil
	if err := v.StartRemoval(); err == nil || v.Removing {
		t.Errorf("removal while a snapshot is being taken: got %v, want refused", err)
	}
	if v.ForgetSnapshot("s1", gen+1) || v.ForgetSnapshot("s2", gen) || v.Snapshots["s1"] == nil {
		t.Error("forgot a snapshot intent of another generation or ID")
	}
	if !v.ForgetSnapshot("s1", gen) || v.Snapshots != nil {
		t.Errorf("snapshot intent not forgotten: %+v", v.Snapshots)
	}
}

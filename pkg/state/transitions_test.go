package state

import (
	"maps"
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

package state

import (
	"path/filepath"
	"testing"
)

// TestReportsFollowRecords checks the reports against the records they
// answer for: no condition without a record, results of withdrawn intents
// dropped, waiters woken by every commit, and what a reopened store knows.
func TestReportsFollowRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openStore(t, path)
	bad := Condition{Abnormal: true, Reason: "StagingMountMissing"}

	s.SetCondition("v", bad)
	if c := s.Condition("v"); c.Abnormal {
		t.Errorf("a volume without a record has condition %+v", c)
	}
	w := s.Watch("v")
	if _, err := s.Update("v", func(v *Volume) error { v.Stage = stage("/k/s"); return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w:
	default:
		t.Error("the commit did not wake the waiter")
	}
	s.SetCondition("v", bad)
	s.SetResult("v", StageKey, Result{Generation: 1, Ready: true})
	if c := s.Condition("v"); c.Reason != bad.Reason {
		t.Errorf("condition %+v, want %+v", c, bad)
	}
	if _, err := s.Update("v", func(v *Volume) error { v.Stage = nil; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Result("v", StageKey); ok {
		t.Error("the result of a withdrawn stage is still there")
	}
	if c := s.Condition("v"); c.Abnormal {
		t.Errorf("a deleted volume still has condition %+v", c)
	}
	s.SetCondition("v", bad)
	if c := s.Condition("v"); c.Abnormal {
		t.Errorf("a deleted volume took condition %+v", c)
	}

	if _, err := s.Update("w", func(v *Volume) error { v.Stage = stage("/k/w"); return nil }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, path)
	s.SetCondition("w", bad)
	if c := s.Condition("w"); c.Reason != bad.Reason {
		t.Errorf("after a reopen, a recorded volume takes no condition: %+v", c)
	}
}

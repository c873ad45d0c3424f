package state

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	clocktesting "k8s.io/utils/clock/testing"
)

func openStore(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func stage(path string) *Stage {
	return &Stage{Path: path, Access: AccessMount, AccessMode: "SINGLE_NODE_WRITER", MountFlags: []string{"noatime"}}
}

func TestUpdateGenerations(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	v, err := s.Update("v", func(v *Volume) error { v.Stage = stage("/s"); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if v.Generation != 1 || v.Stage.Generation != 1 {
		t.Fatalf("first update: got generation %d, stage %d; want 1, 1", v.Generation, v.Stage.Generation)
	}
	// A no-op update writes nothing and keeps the generation.
	v, _ = s.Update("v", func(v *Volume) error { return nil })
	if v.Generation != 1 {
		t.Errorf("no-op update: got generation %d, want 1", v.Generation)
	}
	// A publish bumps the volume generation but not the stage's.
	v, _ = s.Update("v", func(v *Volume) error {
		v.Publishes = map[string]*Publish{"/t": {Access: AccessMount}}
		return nil
	})
	if v.Generation != 2 || v.Stage.Generation != 1 || v.Publishes["/t"].Generation != 2 {
		t.Errorf("after publish: got %d/%d/%d, want 2/1/2", v.Generation, v.Stage.Generation, v.Publishes["/t"].Generation)
	}
	// Marking the stage deleting stamps it.
	v, _ = s.Update("v", func(v *Volume) error { v.Stage.Deleting = true; return nil })
	if v.Stage.Generation != 3 {
		t.Errorf("after deleting: got stage generation %d, want 3", v.Stage.Generation)
	}
	// An expansion is stamped; another update keeps its generation, and a
	// new expansion of the same size (asked again) is stamped anew.
	v, _ = s.Update("v", func(v *Volume) error { v.Expand = &Expand{Bytes: 1 << 30}; return nil })
	if v.Expand.Generation != 4 {
		t.Errorf("after expand: got expand generation %d, want 4", v.Expand.Generation)
	}
	v, _ = s.Update("v", func(v *Volume) error { v.FsSize = 1 << 20; return nil })
	if v.Expand.Generation != 4 {
		t.Errorf("after another update: got expand generation %d, want 4", v.Expand.Generation)
	}
	v, _ = s.Update("v", func(v *Volume) error { v.Expand = &Expand{Bytes: 1 << 30}; return nil })
	if v.Expand.Generation != 6 {
		t.Errorf("the same expansion asked again: got generation %d, want 6", v.Expand.Generation)
	}
	// A failing update changes nothing.
	boom := errors.New("boom")
	if _, err := s.Update("v", func(v *Volume) error { v.Stage = nil; return boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v, want boom", err)
	}
	if got, _ := s.Get("v"); got.Stage == nil || got.Generation != 6 {
		t.Errorf("after failed update: got %+v", got)
	}
	// Emptying the record deletes it.
	s.Update("v", func(v *Volume) error { v.Stage, v.Publishes = nil, nil; return nil })
	if _, err := s.Get("v"); !errors.Is(err, ErrNotFound) {
		t.Errorf("emptied record: got %v, want ErrNotFound", err)
	}
}

func TestCopiesAreDeep(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	s.Update("v", func(v *Volume) error {
		v.Stage = stage("/s")
		v.Publishes = map[string]*Publish{"/t": {MountFlags: []string{"ro"}}}
		v.Snapshots = map[string]*SnapshotIntent{"s1": {}}
		return nil
	})
	got, _ := s.Get("v")
	got.Snapshots["s1"].Generation = 99
	got.Snapshots["s2"] = &SnapshotIntent{}
	got.Stage.Path = "/evil"
	got.Stage.MountFlags[0] = "evil"
	got.Publishes["/t"].MountFlags[0] = "evil"
	got.Publishes["/x"] = &Publish{}
	for _, l := range s.List() {
		l.Stage.MountFlags[0] = "evil"
	}
	again, _ := s.Get("v")
	if again.Stage.Path != "/s" || again.Stage.MountFlags[0] != "noatime" ||
		again.Publishes["/t"].MountFlags[0] != "ro" || len(again.Publishes) != 1 ||
		len(again.Snapshots) != 1 || again.Snapshots["s1"].Generation != 1 {
		t.Errorf("mutating a returned copy changed the store: %+v", again)
	}
}

func TestDurableAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Update("v", func(v *Volume) error { v.Stage = stage("/s"); v.Formatted = "ext4"; return nil })
	s.Close()

	s2 := openStore(t, path)
	got, err := s2.Get("v")
	if err != nil || got.Stage.Path != "/s" || got.Formatted != "ext4" || got.Generation != 1 {
		t.Fatalf("after reopen: got %+v, %v", got, err)
	}
}

// TestChangedStamped checks that every write of a record stamps when it
// changed, a write of nothing does not, the stamp survives a reopen, and
// a record written before records were stamped gets the time of the Open
// that found it (its age is never overstated).
func TestChangedStamped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	fake := clocktesting.NewFakePassiveClock(t0)
	s.clock = fake
	v, _ := s.Update("v", func(v *Volume) error { v.Formatted = "ext4"; return nil })
	if !v.Changed.Equal(t0) {
		t.Errorf("first write: Changed %v, want %v", v.Changed, t0)
	}
	fake.SetTime(t0.Add(time.Hour))
	if v, _ = s.Update("v", func(v *Volume) error { v.Formatted = "ext4"; return nil }); !v.Changed.Equal(t0) {
		t.Errorf("a write of nothing: Changed %v, want %v", v.Changed, t0)
	}
	if v, _ = s.Update("v", func(v *Volume) error { v.DeviceID = "uuid"; return nil }); !v.Changed.Equal(t0.Add(time.Hour)) {
		t.Errorf("a change: Changed %v, want %v", v.Changed, t0.Add(time.Hour))
	}
	s.Close()

	s = openStore(t, path)
	if got, _ := s.Get("v"); !got.Changed.Equal(t0.Add(time.Hour)) {
		t.Errorf("after reopen: Changed %v, want %v", got.Changed, t0.Add(time.Hour))
	}
	s.Close()

	// A record as an older binary wrote it: without Changed.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Put([]byte("old"), []byte(`{"id": "old", "generation": 3, "formatted": "xfs"}`))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before := time.Now()
	s = openStore(t, path)
	after := time.Now()
	got, err := s.Get("old")
	if err != nil || got.Changed.Before(before) || got.Changed.After(after) {
		t.Errorf("a record without Changed, opened between %v and %v: %+v, %v", before, after, got, err)
	}
}

func TestSecondOpenIsLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	openStore(t, path)
	if _, err := Open(path); !errors.Is(err, ErrLocked) {
		t.Errorf("second open: got %v, want ErrLocked", err)
	}
}

func TestSchemaMismatchRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucketIfNotExists(bucketMeta)
		return b.Put(keySchema, []byte("99"))
	})
	db.Close()
	if _, err := Open(path); err == nil {
		t.Error("opened a store of schema 99")
	}
}

func TestStateDirIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	openStore(t, filepath.Join(dir, "state.db"))
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Errorf("state directory mode: got %o, want 700", got)
	}
}

func TestWatchWakesOnChange(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	ch := s.Watch("v")
	s.SetResult("v", StageKey, Result{Generation: 1})
	select {
	case <-ch:
	default:
		t.Fatal("SetResult did not wake the watcher")
	}
	ch = s.Watch("v")
	s.SetResult("v", StageKey, Result{Generation: 1}) // unchanged
	select {
	case <-ch:
		t.Fatal("an unchanged result woke the watcher")
	default:
	}
	s.Update("v", func(v *Volume) error { v.Stage = stage("/s"); return nil })
	select {
	case <-ch:
	default:
		t.Fatal("Update did not wake the watcher")
	}
}

package state

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// openSized opens a store whose log holds size bytes.
func openSized(t *testing.T, path string, size int64) *Store {
	t.Helper()
	s, err := open(path, size, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// crash closes s as a killed process leaves it: no checkpoint, the log
// file as written.
func crash(s *Store) {
	s.log.f.Close()
	s.db.Close()
}

// records returns the records of s by ID.
func records(s *Store) map[string]*Volume {
	out := map[string]*Volume{}
	for _, v := range s.List() {
		out[v.ID] = v
	}
	return out
}

func setSize(t *testing.T, s *Store, id string, n int64) {
	t.Helper()
	if _, err := s.Update(id, func(v *Volume) error { v.Formatted, v.FsSize = "ext4", n; return nil }); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, s *Store, id string) {
	t.Helper()
	if _, err := s.Update(id, func(v *Volume) error { *v = Volume{ID: id}; return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestLogReplaysAfterCrash writes, rewrites and deletes records through
// several checkpoints of a small log, crashes, and finds every record as
// it was acknowledged; a deleted record written before a checkpoint is not
// brought back by the older records the log file still holds.
func TestLogReplaysAfterCrash(t *testing.T) {
	for _, crashAt := range []int{0, 1, 7, 40, 123, 300} {
		t.Run(fmt.Sprint(crashAt), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s := openSized(t, path, 2048)
			for i := range crashAt {
				id := fmt.Sprintf("v%d", i%5)
				if i%7 == 6 {
					remove(t, s, id)
				} else {
					setSize(t, s, id, int64(i))
				}
			}
			want := records(s)
			s.log.mu.Lock()
			inLog := len(s.log.pending)
			s.log.mu.Unlock()
			crash(s)
			s = openSized(t, path, 2048)
			defer s.Close()
			if got := records(s); !reflect.DeepEqual(got, want) {
				t.Fatalf("after crash at write %d:\n got %+v\nwant %+v", crashAt, got, want)
			}
			if s.Replayed() < inLog {
				t.Errorf("replayed %d records, the log held %d volumes' records", s.Replayed(), inLog)
			}
			// It goes on from there, and a clean close keeps it too,
			// in bbolt: nothing to replay.
			setSize(t, s, "after", 1)
			want = records(s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openSized(t, path, 2048)
			defer s.Close()
			if got := records(s); !reflect.DeepEqual(got, want) {
				t.Fatalf("after a clean close:\n got %+v\nwant %+v", got, want)
			}
			if s.Replayed() != 0 {
				t.Errorf("replayed %d records after a clean close, want 0", s.Replayed())
			}
		})
	}
}

// TestLogTornRecord damages one record of the log, as a crash in the
// middle of writing it does: replay stops before it, and what follows it
// (which no writer had been told was durable) is not applied.
func TestLogTornRecord(t *testing.T) {
	for _, torn := range []int{0, 2, 4} {
		t.Run(fmt.Sprint(torn), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s := openSized(t, path, DefaultLogSize)
			var offs []int64
			for i := range 5 {
				s.log.mu.Lock()
				offs = append(offs, s.log.off)
				s.log.mu.Unlock()
				setSize(t, s, fmt.Sprintf("v%d", i), int64(i))
			}
			crash(s)
			f, err := os.OpenFile(path+"-wal", os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			// Flip a byte of the record's value: its CRC fails.
			b := make([]byte, 1)
			at := offs[torn] + logHeader + 10
			f.ReadAt(b, at)
			b[0] ^= 0xff
			f.WriteAt(b, at)
			f.Close()

			s = openSized(t, path, DefaultLogSize)
			defer s.Close()
			got := records(s)
			if len(got) != torn {
				t.Fatalf("records after record %d was torn: got %d, want %d", torn, len(got), torn)
			}
			for i := range torn {
				if v := got[fmt.Sprintf("v%d", i)]; v == nil || v.FsSize != int64(i) {
					t.Errorf("record v%d: got %+v", i, v)
				}
			}
		})
	}
}

// TestLogMissingRecordsRefused opens a store whose bbolt file is older
// than the log's first record (as when it was restored from a copy):
// records in between are missing, so Open refuses rather than start
// without them.
func TestLogMissingRecordsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openSized(t, path, 1024)
	for i := range 40 {
		setSize(t, s, fmt.Sprintf("v%d", i%3), int64(i))
	}
	crash(s)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		seq := binary.BigEndian.Uint64(b.Get(keyLogSeq))
		if seq < 5 {
			return fmt.Errorf("log-seq %d: the test needs a few checkpoints", seq)
		}
		return b.Put(keyLogSeq, binary.BigEndian.AppendUint64(nil, seq-3))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := open(path, 1024, Options{}); err == nil || !strings.Contains(err.Error(), "missing records") {
		if err == nil {
			s.Close()
		}
		t.Fatalf("open with records missing: got %v, want a refusal", err)
	}
}

// TestLogConcurrentWriters writes from many goroutines at once through a
// log small enough to checkpoint often, crashes, and finds every writer's
// last acknowledged value.
func TestLogConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openSized(t, path, 4096)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				if _, err := s.Update(fmt.Sprintf("w%d", w), func(v *Volume) error { v.Formatted, v.FsSize = "ext4", int64(i); return nil }); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	crash(s)
	s = openSized(t, path, 4096)
	defer s.Close()
	got := records(s)
	for w := range 8 {
		if v := got[fmt.Sprintf("w%d", w)]; v == nil || v.FsSize != 99 || v.Generation != 100 {
			t.Errorf("writer %d: got %+v, want its 100th write", w, v)
		}
	}
}

// TestRecordLargerThanLog writes a record that an empty log cannot hold: it
// goes to bbolt directly, durable all the same, and the records around it
// keep their order.
func TestRecordLargerThanLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openSized(t, path, 512)
	setSize(t, s, "small", 1)
	if _, err := s.Update("large", func(v *Volume) error {
		v.Stage = stage("/" + strings.Repeat("x", 600))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	setSize(t, s, "small", 2)
	want := records(s)
	crash(s)
	s = openSized(t, path, 512)
	defer s.Close()
	if got := records(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("after crash:\n got %+v\nwant %+v", got, want)
	}
}

// TestLogKeepsItsSize checks that the log is allocated when it is made and
// that writes never grow it (a growing file makes every fdatasync commit
// its metadata too).
func TestLogKeepsItsSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openStore(t, path)
	size := func() int64 {
		t.Helper()
		st, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	if got := size(); got != DefaultLogSize {
		t.Fatalf("new log: %d bytes, want %d", got, DefaultLogSize)
	}
	for i := range 50 {
		setSize(t, s, fmt.Sprintf("v%d", i), int64(i))
	}
	if got := size(); got != DefaultLogSize {
		t.Errorf("log after 50 writes: %d bytes, want %d", got, DefaultLogSize)
	}
}

// TestClosedStoreRefusesWrites closes a store twice (harmless) and then
// writes to it: refused, and nothing reaches the files.
func TestClosedStoreRefusesWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openSized(t, path, 4096)
	setSize(t, s, "v", 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := s.Update("w", func(v *Volume) error { v.Formatted = "ext4"; return nil }); err == nil {
		t.Fatal("update of a closed store succeeded")
	}
	s = openSized(t, path, 4096)
	defer s.Close()
	if got := records(s); len(got) != 1 || got["v"] == nil {
		t.Errorf("records: got %+v, want only v", got)
	}
}

// TestUncleanStoreRefusedByOlderBinaries checks the schema a store is left
// with: 1 (what binaries older than the log read) only after a Close that
// put every record in bbolt; 2 while the log may hold records bbolt has
// not, so that an older binary refuses the store rather than start without
// them.
func TestUncleanStoreRefusedByOlderBinaries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	schema := func() string {
		t.Helper()
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v string
		db.View(func(tx *bolt.Tx) error { v = string(tx.Bucket(bucketMeta).Get(keySchema)); return nil })
		return v
	}
	s := openSized(t, path, 4096)
	setSize(t, s, "v", 1)
	crash(s)
	if got := schema(); got != schemaLogged {
		t.Fatalf("schema after a crash: %q, want %q", got, schemaLogged)
	}
	s = openSized(t, path, 4096)
	if got := records(s); got["v"] == nil {
		t.Fatalf("record lost: %+v", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := schema(); got != SchemaVersion {
		t.Fatalf("schema after a clean close: %q, want %q", got, SchemaVersion)
	}
	// What an older binary finds then: every record in bbolt.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	db.View(func(tx *bolt.Tx) error { raw = tx.Bucket(bucketVolumes).Get([]byte("v")); return nil })
	db.Close()
	if raw == nil {
		t.Error("after a clean close, bbolt lacks record v")
	}
}

// TestWriteBeforeSync checks Store.UpdateUnsynced: its record is in memory and in
// the log file before it is durable, so a killed process leaves it for the
// next Open; durable makes it (and any earlier write) durable, also for a
// write that changed nothing and so would otherwise answer on a record
// still on its way to the disk.
func TestWriteBeforeSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openStore(t, path)
	v, durable, err := s.UpdateUnsynced("a", func(v *Volume) error { v.Formatted = "ext4"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get("a"); err != nil || got.Formatted != "ext4" || got.Generation != v.Generation {
		t.Fatalf("before its sync: got %+v, %v; want the record written", got, err)
	}
	written, synced := s.log.written.Load(), s.log.synced.Load()
	if synced >= written {
		t.Fatalf("synced %d of %d records before durable was called; want the write unsynced", synced, written)
	}
	_, unchanged, err := s.UpdateUnsynced("a", func(v *Volume) error { v.Formatted = "ext4"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := unchanged(); err != nil {
		t.Fatal(err)
	}
	if got := s.log.synced.Load(); got < written {
		t.Errorf("an unchanged write answered durable with record %d of %d synced", got, written)
	}
	if err := durable(); err != nil {
		t.Fatal(err)
	}

	// A write never synced is found by the next Open of a killed process.
	if _, _, err := s.UpdateUnsynced("b", func(v *Volume) error { v.FsSize = 7; return nil }); err != nil {
		t.Fatal(err)
	}
	want := records(s)
	crash(s)
	s = openStore(t, path)
	defer s.Close()
	if got := records(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a crash of the process:\n got %+v\nwant %+v", got, want)
	}
}

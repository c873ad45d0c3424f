package soak

import (
	"os"
	"path/filepath"
	"testing"
)

func appendN(t *testing.T, w *Writer, n int) {
	t.Helper()
	for range n {
		if _, err := w.Append(); err != nil {
			t.Fatal(err)
		}
	}
}

func logRecords(t *testing.T, path string) []Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rs, _, err := Scan(data)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestWriterGoesOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	w, err := OpenWriter(path, "a")
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, w, 3)
	w.Close()

	// A crash mid-write: part of a record at the end.
	torn, _ := Record{Owner: "a", Seq: 3}.Encode()
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(torn[:200])
	f.Close()

	w, err = OpenWriter(path, "a")
	if err != nil {
		t.Fatal(err)
	}
	if w.Next() != 3 {
		t.Fatalf("after 3 records, next %d", w.Next())
	}
	appendN(t, w, 2)
	w.Close()
	if p := Check(logRecords(t, path), []Expect{{"a", 5}}); len(p) > 0 {
		t.Fatalf("after a torn record and two more: %q", p)
	}

	// A restore of it, written to by its own claim.
	w, err = OpenWriter(path, "b")
	if err != nil {
		t.Fatal(err)
	}
	if w.Next() != 0 {
		t.Fatalf("a new owner's next: %d", w.Next())
	}
	appendN(t, w, 2)
	w.Close()
	if p := Check(logRecords(t, path), []Expect{{"a", 5}, {"b", 2}}); len(p) > 0 {
		t.Fatalf("the restore: %q", p)
	}
	// Its source's writer cannot go on after the restore's records.
	if _, err := OpenWriter(path, "a"); err == nil {
		t.Errorf("a writer opened on a log whose owner's records are not last")
	}
}

func TestWriterRefusesAHole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	w, _ := OpenWriter(path, "a")
	appendN(t, w, 3)
	w.Close()
	f, _ := os.OpenFile(path, os.O_WRONLY, 0)
	f.WriteAt(make([]byte, RecordSize), RecordSize)
	f.Close()
	if _, err := OpenWriter(path, "a"); err == nil {
		t.Errorf("a writer opened on a log with a hole")
	}
}

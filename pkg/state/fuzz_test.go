package state

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzValidID checks that an accepted ID can only name a plain file in the
// data directory.
func FuzzValidID(f *testing.F) {
	for _, s := range []string{"vol-1", "", ".", "..", "../x", "a/b", "a\x00", strings.Repeat("a", 129), "pvc-1234.img", "-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ValidID(id) != nil {
			return
		}
		if len(id) == 0 || len(id) > MaxIDLength || strings.ContainsAny(id, "/\x00") || id[0] == '.' {
			t.Fatalf("accepted %q", id)
		}
		if p := filepath.Join("/data", id+".img"); filepath.Dir(p) != "/data" {
			t.Fatalf("ID %q leaves the data directory: %s", id, p)
		}
	})
}

// FuzzScanLog reads arbitrary bytes as a log (what a crash, a bad disk or
// a stale file can leave): it never panics nor reads past the data, and
// what it returns is a chain of intact records numbered one after another,
// which encode back to the bytes they were read from.
func FuzzScanLog(f *testing.F) {
	two := append(encodeRecord(7, "v", []byte(`{"id":"v"}`)), encodeRecord(8, "w", nil)...)
	f.Add(two)
	f.Add(append(two, encodeRecord(3, "old", []byte("{}"))...))
	f.Add(two[:len(two)-1])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, end := scanLog(data)
		if end < 0 || end > int64(len(data)) {
			t.Fatalf("chain ends at %d of %d bytes", end, len(data))
		}
		var off int64
		for i, r := range recs {
			if r.seq == 0 || i > 0 && r.seq != recs[i-1].seq+1 {
				t.Fatalf("record %d numbered %d after %d", i, r.seq, recs[max(i-1, 0)].seq)
			}
			b := encodeRecord(r.seq, r.id, r.value)
			if string(data[off:off+int64(len(b))]) != string(b) {
				t.Fatalf("record %d does not encode back to its bytes", i)
			}
			off += int64(len(b))
		}
		if off != end {
			t.Fatalf("records span %d bytes, chain ends at %d", off, end)
		}
	})
}

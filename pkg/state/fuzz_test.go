package state

import "testing"

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

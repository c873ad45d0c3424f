package soak

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
)

// log is the bytes of records written in order.
func log(t *testing.T, rs ...Record) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, r := range rs {
		e, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		b.Write(e)
	}
	return b.Bytes()
}

func seqs(owner string, from, to uint64) []Record {
	var out []Record
	for s := from; s < to; s++ {
		out = append(out, Record{owner, s})
	}
	return out
}

func TestRecordRoundTrip(t *testing.T) {
	r := Record{Owner: "soak-thin-3", Seq: 41}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil || got != r {
		t.Fatalf("Decode = %+v, %v; want %+v", got, err, r)
	}
	// Any one byte changed is caught.
	for i := range b {
		c := slices.Clone(b)
		c[i] ^= 0x40
		if _, err := Decode(c); err == nil {
			t.Errorf("byte %d changed: decoded", i)
		}
	}
	// Another owner's or seq's payload under this header, its checksum
	// made anew (a block copied to the wrong place by something that
	// rewrote the checksum) is not this record.
	other, _ := Record{Owner: "soak-thin-3", Seq: 42}.Encode()
	forged := slices.Clone(b)
	copy(forged[payloadAt:crcAt], other[payloadAt:crcAt])
	if _, err := Decode(reChecksum(forged)); err == nil || !strings.Contains(err.Error(), "payload") {
		t.Errorf("a record with another's payload: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxOwner+1)} {
		if _, err := (Record{Owner: bad}).Encode(); err == nil {
			t.Errorf("owner %q encoded", bad)
		}
	}
}

// reChecksum makes b's checksum that of its bytes.
func reChecksum(b []byte) []byte {
	binary.BigEndian.PutUint32(b[crcAt:], crc32.Checksum(b[:crcAt], castagnoli))
	return b
}

func TestScan(t *testing.T) {
	good := log(t, seqs("a", 0, 5)...)
	rs, end, err := Scan(good)
	if err != nil || len(rs) != 5 || end != 5*RecordSize {
		t.Fatalf("Scan = %d records, end %d, %v", len(rs), end, err)
	}
	// A torn last record, then zeroes (a preallocated file): the end is
	// before it.
	torn := append(slices.Clone(good), log(t, Record{"a", 5})[:100]...)
	torn = append(torn, make([]byte, RecordSize-100+3*RecordSize)...)
	if rs, end, err = Scan(torn); err != nil || len(rs) != 5 || end != 5*RecordSize {
		t.Errorf("torn tail: %d records, end %d, %v", len(rs), end, err)
	}
	// A hole in the middle: an error.
	holed := slices.Clone(good)
	clear(holed[2*RecordSize : 3*RecordSize])
	if _, _, err = Scan(holed); err == nil {
		t.Errorf("a hole in the middle: no error")
	}
}

func TestCheck(t *testing.T) {
	restored := append(seqs("src", 0, 4), seqs("dst", 0, 3)...)
	for _, tc := range []struct {
		name    string
		records []Record
		lineage []Expect
		want    []string // a word of each problem, in order
	}{
		{"all there, and one more than acknowledged", seqs("a", 0, 5), []Expect{{"a", 4}}, nil},
		{"acknowledged records lost", seqs("a", 0, 3), []Expect{{"a", 5}}, []string{"2 lost"}},
		{"a gap", append(seqs("a", 0, 2), seqs("a", 3, 5)...), []Expect{{"a", 5}}, []string{"want a/2"}},
		{"a record twice", append(seqs("a", 0, 3), seqs("a", 2, 4)...), []Expect{{"a", 4}}, []string{"want a/3"}},
		{"a restore: the source's then its own", restored, []Expect{{"src", 3}, {"dst", 3}}, nil},
		{"a restore missing what the snapshot had to hold", restored, []Expect{{"src", 6}, {"dst", 3}}, []string{"2 lost"}},
		{"the source's after the restore's own", append(slices.Clone(restored), Record{"src", 4}), []Expect{{"src", 3}, {"dst", 3}}, []string{"after records of dst"}},
		{"another volume's data", append(seqs("a", 0, 2), Record{"b", 0}), []Expect{{"a", 2}}, []string{"not of this volume's lineage"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.records, tc.lineage)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d: %q, want %q in it", i, got[i], w)
				}
			}
		})
	}
}

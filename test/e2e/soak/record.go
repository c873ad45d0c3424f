// Package soak holds what issue 71's soak checks its volumes' data with,
// and plans its faults with, apart from any cluster so that its tests run
// with the e2e module's unit tests: the append-only log of checksummed
// records a soak pod writes, the check of a volume's log against what its
// writers had acknowledged, the seeded schedule of faults, and the log of
// the alerts Prometheus raised meanwhile.
package soak

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
)

// A record is RecordSize bytes, one sector, so that a write torn by a
// crash spoils at most the record being written:
//
//	[0:4]     magic "CVRL"
//	[4:6]     version (1), big-endian like every number here
//	[6:8]     the owner's length
//	[8:72]    the owner: who wrote it (the claim), zero-padded
//	[72:80]   seq: the owner's 0, 1, 2... in the order written
//	[80:508]  payload, a function of owner and seq (fill)
//	[508:512] CRC-32C of [0:508]
//
// A writer appends a record, fsyncs, and only then acknowledges it (on
// its stdout, which the soak reads from outside the node). A volume
// restored or cloned from another holds the source's records first, then
// its own writer's.
const (
	RecordSize = 512
	MaxOwner   = 64
	magic      = "CVRL"
	version    = 1
	payloadAt  = 80
	crcAt      = RecordSize - 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Record is one record of a log.
type Record struct {
	Owner string
	Seq   uint64
}

// Encode is the record's bytes.
func (r Record) Encode() ([]byte, error) {
	if len(r.Owner) == 0 || len(r.Owner) > MaxOwner {
		return nil, fmt.Errorf("owner %q: want 1 to %d bytes", r.Owner, MaxOwner)
	}
	b := make([]byte, RecordSize)
	copy(b, magic)
	binary.BigEndian.PutUint16(b[4:], version)
	binary.BigEndian.PutUint16(b[6:], uint16(len(r.Owner)))
	copy(b[8:8+MaxOwner], r.Owner)
	binary.BigEndian.PutUint64(b[72:], r.Seq)
	fill(b[payloadAt:crcAt], r.Owner, r.Seq)
	binary.BigEndian.PutUint32(b[crcAt:], crc32.Checksum(b[:crcAt], castagnoli))
	return b, nil
}

// fill writes the payload of owner's record seq: bytes that differ for
// every owner and seq, so that a record copied to the wrong place, or a
// block of another volume, does not pass for one of this log's.
func fill(p []byte, owner string, seq uint64) {
	h := fnv.New64a()
	h.Write([]byte(owner))
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	h.Write(s[:])
	x := h.Sum64() | 1
	for i := 0; i < len(p); i += 8 {
		// xorshift64
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.BigEndian.PutUint64(s[:], x)
		copy(p[i:], s[:])
	}
}

// errNoRecord is a slot that holds no record (zeroes: past the end of
// what was written, or a hole).
var errNoRecord = errors.New("no record")

// Decode reads the record of one slot: errNoRecord for a slot of zeroes,
// another error for one that is not a whole, intact record.
func Decode(b []byte) (Record, error) {
	if len(b) != RecordSize {
		return Record{}, fmt.Errorf("%d bytes, want %d", len(b), RecordSize)
	}
	if allZero(b) {
		return Record{}, errNoRecord
	}
	if string(b[:4]) != magic {
		return Record{}, fmt.Errorf("no magic: %q", b[:4])
	}
	if v := binary.BigEndian.Uint16(b[4:]); v != version {
		return Record{}, fmt.Errorf("version %d", v)
	}
	if got, want := binary.BigEndian.Uint32(b[crcAt:]), crc32.Checksum(b[:crcAt], castagnoli); got != want {
		return Record{}, fmt.Errorf("checksum %08x, want %08x", got, want)
	}
	n := int(binary.BigEndian.Uint16(b[6:]))
	if n == 0 || n > MaxOwner {
		return Record{}, fmt.Errorf("owner of %d bytes", n)
	}
	r := Record{Owner: string(b[8 : 8+n]), Seq: binary.BigEndian.Uint64(b[72:])}
	want := make([]byte, crcAt-payloadAt)
	fill(want, r.Owner, r.Seq)
	if string(want) != string(b[payloadAt:crcAt]) {
		return Record{}, fmt.Errorf("record %s/%d: its payload is not its own", r.Owner, r.Seq)
	}
	return r, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Scan reads a log: its records in order, and where they end (the offset
// a writer appends at). Past the end there may be a torn record (a crash
// mid-write) and nothing else; a bad slot followed by a good record is a
// hole in the middle, an error.
func Scan(data []byte) (records []Record, end int, err error) {
	for off := 0; off+RecordSize <= len(data); off += RecordSize {
		r, derr := Decode(data[off : off+RecordSize])
		if derr != nil {
			// Nothing whole may follow the end.
			for next := off + RecordSize; next+RecordSize <= len(data); next += RecordSize {
				if _, e := Decode(data[next : next+RecordSize]); e == nil {
					return records, off, fmt.Errorf("slot %d (offset %d): %v, and a record after it", off/RecordSize, off, derr)
				}
			}
			return records, off, nil
		}
		records = append(records, r)
	}
	return records, len(records) * RecordSize, nil
}

// Expect is what one writer of a volume's lineage had acknowledged: its
// records 0 to Acked-1 were fsynced before it said so, and must be there.
// A record beyond may be there or not (written, not yet acknowledged).
type Expect struct {
	Owner string
	Acked uint64
}

// Check compares a log's records with its lineage, the writers whose
// records it may hold, in the order they wrote to it (a restore's source
// first). It returns every problem: a record of an owner not in the
// lineage (another volume's data), an owner's records out of order, or
// after a later owner's, and acknowledged records missing.
func Check(records []Record, lineage []Expect) []string {
	var problems []string
	pos := map[string]int{}
	for i, e := range lineage {
		pos[e.Owner] = i
	}
	next := make([]uint64, len(lineage))
	at := 0 // the lineage's writer whose records come now
	foreign := map[string]int{}
	for i, r := range records {
		p, ok := pos[r.Owner]
		switch {
		case !ok:
			foreign[r.Owner]++
			continue
		case p < at:
			problems = append(problems, fmt.Sprintf("record %d: %s/%d after records of %s", i, r.Owner, r.Seq, lineage[at].Owner))
			continue
		}
		at = p
		if r.Seq != next[p] {
			problems = append(problems, fmt.Sprintf("record %d: %s/%d, want %s/%d", i, r.Owner, r.Seq, r.Owner, next[p]))
		}
		next[p] = r.Seq + 1
	}
	for owner, n := range foreign {
		problems = append(problems, fmt.Sprintf("%d records of %s, which is not of this volume's lineage", n, owner))
	}
	for i, e := range lineage {
		if next[i] < e.Acked {
			problems = append(problems, fmt.Sprintf("%s: records to %d, but %d were acknowledged: %d lost", e.Owner, next[i], e.Acked, e.Acked-next[i]))
		}
	}
	return problems
}

package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestWriteAcksOnlyWhatItWrote runs a group's writer a while: every seq it
// printed as acknowledged is in its owner's log, each log holds only its
// owner's records, and a scan gives them back as runs.
func TestWriteAcksOnlyWhatItWrote(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	if err := write(ctx, []string{"-every=1ms", "-report=10ms", "a=" + a, "b=" + b}, &out); err != nil {
		t.Fatal(err)
	}
	h := NewHistory()
	for _, o := range []string{"a", "b"} {
		if err := h.New(o); err != nil {
			t.Fatal(err)
		}
	}
	acks := 0
	for i, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		got, ok := ParseLine("2026-11-28T16:00:00.000000000Z stdout F " + l)
		switch {
		case !ok:
			t.Fatalf("%q is no line a writer prints", l)
		case i < 2 && (got.Kind != LineOpen || got.N != 0):
			t.Fatalf("line %d: %q, want an open of an empty log first", i, l)
		case i < 2:
			if err := h.Open(got.Owner, got.N); err != nil {
				t.Fatal(err)
			}
		case got.Kind != LineAck:
			t.Fatalf("line %d: %q, want an ack", i, l)
		default:
			h.Ack(got.Owner, got.N)
			acks++
		}
	}
	if acks < 4 {
		t.Fatalf("%d acks in 300ms, want several:\n%s", acks, out.String())
	}
	for _, o := range []struct{ owner, path string }{{"a", a}, {"b", b}} {
		s := ScanPath(o.path)
		if s.Error != "" || len(s.Runs) != 1 || s.Runs[0].Owner != o.owner {
			t.Fatalf("%s: %+v", o.path, s)
		}
		lineage, _ := h.Lineage(o.owner)
		if lineage[0].Acked == 0 {
			t.Fatalf("%s: nothing acknowledged", o.owner)
		}
		if p := Check(s.Records(), lineage); len(p) > 0 {
			t.Errorf("%s: %v", o.owner, p)
		}
		// The other owner's acks are not this log's.
		other, _ := h.Lineage(map[string]string{"a": "b", "b": "a"}[o.owner])
		if p := Check(s.Records(), other); len(p) == 0 {
			t.Errorf("%s's log passes for %s's", o.owner, other[0].Owner)
		}
	}
}

func TestParseLine(t *testing.T) {
	at := time.Date(2026, 11, 28, 16, 0, 0, 100_000_000, time.UTC)
	for _, c := range []struct {
		line string
		want Line
		ok   bool
	}{
		{"2026-11-28T16:00:00.1Z stdout F ack soak-3 41", Line{at, LineAck, "soak-3", 41}, true},
		{"2026-11-28T16:00:00.100000000Z stdout F open soak-3 7", Line{at, LineOpen, "soak-3", 7}, true},
		{"2026-11-28T16:00:00.1Z stderr F soak-writer: write /data/log: no space", Line{}, false},
		{"2026-11-28T16:00:00.1Z stderr F ack a 1", Line{}, false},
		{"2026-11-28T16:00:00.1Z stdout P ack a 1", Line{}, false},
		{"2026-11-28T16:00:00.1Z stdout F close a 1", Line{}, false},
		{"2026-11-28T16:00:00.1Z stdout F ack a x", Line{}, false},
		{"yesterday stdout F ack a 1", Line{}, false},
		{"ack a 0", Line{}, false},
	} {
		got, ok := ParseLine(c.line)
		if !got.At.Equal(c.want.At) || got.Kind != c.want.Kind || got.Owner != c.want.Owner || got.N != c.want.N || ok != c.ok {
			t.Errorf("ParseLine(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

// TestOpenSeesALossARewriteHides: a log that lost its acknowledged tail
// and is written on passes a later scan, as the writer writes the lost
// seqs again; what its writer printed on opening it does not.
func TestOpenSeesALossARewriteHides(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	h := NewHistory()
	if err := h.New("v"); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWriter(path, "v")
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, w, 10)
	w.Close()
	h.Ack("v", 9)
	if err := os.Truncate(path, 6*RecordSize); err != nil { // the last 4 lost
		t.Fatal(err)
	}
	// Until it has acknowledged past what was lost, however slow the
	// machine.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := &ackWatch{past: 11, cancel: cancel}
	if err := write(ctx, []string{"-every=1ms", "-report=1ms", "v=" + path}, out); err != nil {
		t.Fatal(err)
	}
	lineage, _ := h.Lineage("v")
	if p := Check(ScanPath(path).Records(), lineage); len(p) > 0 {
		t.Fatalf("the rewritten log fails the scan's check (%v): the test shows nothing", p)
	}
	first, _, _ := strings.Cut(out.buf.String(), "\n")
	open, ok := ParseLine("2026-11-28T16:00:00Z stdout F " + first)
	if !ok || open.Kind != LineOpen || open.N != 6 {
		t.Fatalf("the writer's first line %q, want it to have opened on 6 records", first)
	}
	if err := h.Open(open.Owner, open.N); err == nil || !strings.Contains(err.Error(), "4 lost") {
		t.Errorf("an open on 6 records, 10 acknowledged: %v, want 4 lost", err)
	}
	if err := h.Open(open.Owner, 10); err != nil {
		t.Errorf("an open on every acknowledged record: %v", err)
	}
}

// TestScanRuns: a restored log's runs, the source's then its own, and a
// log with a hole says so.
func TestScanRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	w, err := OpenWriter(path, "src")
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, w, 3)
	w.Close()
	w, err = OpenWriter(path, "copy")
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, w, 2)
	w.Close()
	s := ScanPath(path)
	want := []Run{{"src", 0, 2}, {"copy", 0, 1}}
	if s.Error != "" || !slices.Equal(s.Runs, want) || s.End != 5*RecordSize {
		t.Fatalf("scan: %+v, want runs %v ending at %d", s, want, 5*RecordSize)
	}
	// Through JSON, as the soak reads it from the pod.
	var back Scanned
	b, _ := json.Marshal(s)
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.Runs, want) {
		t.Fatalf("%s back: %+v, %v", b, back, err)
	}

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, RecordSize), RecordSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if s := ScanPath(path); s.Error == "" {
		t.Fatalf("a hole scanned as %+v", s)
	}
}

// TestReadLogOfADevice reads a log from something that is not a regular
// file (a FIFO, which like a block device is read as far as the log goes):
// it stops at the first chunk of zeroes, so a volume's size is not read.
func TestReadLogOfADevice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	var log []byte
	for seq := range uint64(3000) { // past one chunk
		b, _ := Record{Owner: "a", Seq: seq}.Encode()
		log = append(log, b...)
	}
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			done <- err
			return
		}
		defer f.Close()
		if _, err := f.Write(log); err != nil {
			done <- err
			return
		}
		// The rest of the "device": zeroes, more than readLog may read.
		_, err = f.Write(make([]byte, 8*readChunk))
		done <- err
	}()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := readLog(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	<-done // EPIPE once readLog stops reading, or nil
	if len(data) > len(log)+2*readChunk {
		t.Fatalf("read %d bytes of a log of %d", len(data), len(log))
	}
	records, end, err := Scan(data)
	if err != nil || len(records) != 3000 || end != len(log) {
		t.Fatalf("%d records ending at %d, %v; want 3000 ending at %d", len(records), end, err, len(log))
	}
}

// TestGroupWriterCatchesUp runs a group's writer on logs that a writer
// ended mid-round left (the first member a record ahead): before its
// next round the second catches up, so that a cut of the two at any
// moment of the new writing passes CheckGroupCut.
func TestGroupWriterCatchesUp(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	wa, err := OpenWriter(a, "a")
	if err != nil {
		t.Fatal(err)
	}
	wb, err := OpenWriter(b, "b")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := wa.Append(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := wb.Append(); err != nil {
		t.Fatal(err)
	}
	wa.Close()
	wb.Close()
	// The writer goes on for a moment: its first round is all a cut of
	// the new writing can see before the second.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := write(ctx, []string{"-every=1h", "a=" + a, "b=" + b}, io.Discard); err != nil {
		t.Fatal(err)
	}
	counts := []uint64{uint64(len(ScanPath(a).Records())), uint64(len(ScanPath(b).Records()))}
	if counts[0] != 4 || counts[1] != 4 {
		t.Errorf("after a round: a holds %d records, b %d; want 4 and 4", counts[0], counts[1])
	}
	if err := CheckGroupCut(counts); err != nil {
		t.Error(err)
	}
}

// TestWriterVouchesForWhatItFound opens a writer on a log of another
// writer's records: it writes them again as they were, fsynced (they may
// have been in the page cache alone), and may acknowledge them.
func TestWriterVouchesForWhatItFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	w, err := OpenWriter(path, "a")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := w.Append(); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	before, _ := os.ReadFile(path)
	w, err = OpenWriter(path, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Errorf("the log changed when a writer opened it")
	}
	if w.Synced() != 3 || w.Next() != 3 {
		t.Errorf("synced %d, next %d; want 3 and 3", w.Synced(), w.Next())
	}
}

// TestScanTakesNoAppendForAHole: a read that found a slot empty (or torn)
// near its end and the records appended past it meanwhile is read again; a
// hole found again at the same offset is reported, and a hole that keeps
// moving is reported once the reads run out. A bad slot far before the
// end no append explains: it is reported at once.
func TestScanTakesNoAppendForAHole(t *testing.T) {
	var bad []byte
	log := func(n int, hole int) []byte {
		var data []byte
		for seq := range n {
			b, err := Record{Owner: "v", Seq: uint64(seq)}.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if seq == hole {
				b = make([]byte, RecordSize)
				if bad != nil {
					b = bad
				}
			}
			data = append(data, b...)
		}
		return data
	}
	long := appendWindow/RecordSize + 10
	bad = bytes.Repeat([]byte{0xff}, RecordSize)
	torn, corrupt := log(10, 7), log(long, 3)
	bad = nil
	for _, tc := range []struct {
		name    string
		reads   [][]byte
		records int
		hole    bool
		read    int
	}{
		{"a whole log", [][]byte{log(10, -1)}, 10, false, 1},
		{"an append past a slot read empty", [][]byte{log(10, 7), log(12, -1)}, 12, false, 2},
		{"a hole read twice", [][]byte{log(10, 7), log(12, 7)}, 7, true, 2},
		{"a hole that moves", [][]byte{log(10, 1), log(10, 2), log(10, 3), log(10, 4), log(10, 5), log(10, 6)}, 5, true, maxReads},
		{"an append past a slot read empty, then a hole", [][]byte{log(10, 7), log(12, 9), log(12, 9)}, 9, true, 3},
		{"a slot read torn near the end", [][]byte{torn, log(12, -1)}, 12, false, 2},
		{"a slot read bad far before the end", [][]byte{corrupt, log(long, -1)}, 3, true, 1},
		{"a slot read empty far before the end", [][]byte{log(long, 3), log(long, -1)}, 3, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := 0
			s := scanLive(func() ([]byte, error) {
				read++
				return tc.reads[min(read, len(tc.reads))-1], nil
			})
			if got := len(s.Records()); got != tc.records || (s.Error != "") != tc.hole || read != tc.read {
				t.Errorf("%d records, error %q, in %d reads; want %d records, a hole %v, in %d reads", got, s.Error, read, tc.records, tc.hole, tc.read)
			}
		})
	}
}

// ackWatch keeps what a writer prints, and cancels it once it has
// acknowledged a seq of past or more.
type ackWatch struct {
	buf    bytes.Buffer
	past   uint64
	cancel func()
}

func (w *ackWatch) Write(p []byte) (int, error) {
	for _, l := range strings.Split(string(p), "\n") {
		if got, ok := ParseLine("2026-11-29T00:00:00Z stdout F " + l); ok && got.Kind == LineAck && got.N >= w.past {
			w.cancel()
		}
	}
	return w.buf.Write(p)
}

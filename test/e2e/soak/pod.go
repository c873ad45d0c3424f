package soak

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// WriterName is the name a soak pod runs the e2e test binary by (its
// TestMain dispatches on it to PodMain).
const WriterName = "soak-writer"

// PodMain is what a soak pod runs:
//
//	soak-writer write [-every D] [-report D] owner=path...
//	soak-writer scan path
//
// write appends each owner's records to its log in turn, round after
// round (one owner, or a group's members in the order given). It prints
// "open <owner> <n>" for each log it opens, n the owner's records it found
// there, and "ack <owner> <seq>" for the last record of each that it
// fsynced, every -report; the soak reads these lines from the node's pod
// logs, outside the node. It goes on until SIGTERM, or exits 1 on an error: the kubelet
// starts it again, and it goes on where each log ends.
//
// scan prints a log as JSON (Scanned): its records as runs, where it ends,
// and what is wrong with it.
func PodMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "soak-writer: write or scan")
		return 2
	}
	var err error
	switch args[0] {
	case "write":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		err = write(ctx, args[1:], stdout)
	case "scan":
		if len(args) != 2 {
			err = errors.New("scan takes one path")
			break
		}
		err = json.NewEncoder(stdout).Encode(ScanPath(args[1]))
	default:
		err = fmt.Errorf("%q: write or scan", args[0])
	}
	if err != nil {
		fmt.Fprintf(stderr, "soak-writer: %v\n", err)
		return 1
	}
	return 0
}

func write(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("write", flag.ContinueOnError)
	every := fs.Duration("every", 20*time.Millisecond, "the pause between rounds")
	report := fs.Duration("report", 200*time.Millisecond, "how often to print the acknowledged records")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("write: no owner=path")
	}
	var writers []*Writer
	defer func() {
		for _, w := range writers {
			w.Close()
		}
	}()
	for _, a := range fs.Args() {
		owner, path, ok := strings.Cut(a, "=")
		if !ok || owner == "" || path == "" {
			return fmt.Errorf("write: %q is not owner=path", a)
		}
		w, err := OpenWriter(path, owner)
		if err != nil {
			return err
		}
		writers = append(writers, w)
		// What it found, before it writes more: a writer that found fewer
		// than were acknowledged would write the lost seqs again, and a
		// later scan find them all.
		fmt.Fprintf(stdout, "%s %s %d\n", LineOpen, owner, w.Next())
	}
	// A group's writer that ended mid-round left the first members a
	// record ahead: the others catch up before the next round, so that at
	// every moment the members hold the same records, or the first ones
	// one more (CheckGroupCut).
	if err := catchUp(writers); err != nil {
		return err
	}
	ack := func() {
		for _, w := range writers {
			if w.Synced() > 0 {
				fmt.Fprintf(stdout, "%s %s %d\n", LineAck, w.owner, w.Synced()-1)
			}
		}
	}
	defer ack()
	last := time.Now()
	for ctx.Err() == nil {
		for _, w := range writers {
			if _, err := w.Append(); err != nil {
				return err
			}
		}
		if time.Since(last) >= *report {
			ack()
			last = time.Now()
		}
		select {
		case <-ctx.Done():
		case <-time.After(*every):
		}
	}
	return nil
}

// What a writer prints: each line is "<kind> <owner> <n>".
const (
	LineOpen = "open" // n: the owner's records it found in the log it opened
	LineAck  = "ack"  // n: the seq of the owner's last record it fsynced
)

// A Line is one a writer printed, as the kubelet logged it: when, and
// what.
type Line struct {
	At    time.Time
	Kind  string // LineOpen or LineAck
	Owner string
	N     uint64
}

// ParseLine reads a line of the kubelet's log of a writer ("<time> stdout
// F <kind> <owner> <n>"), and whether it was one a writer printed.
func ParseLine(line string) (Line, bool) {
	f := strings.Fields(line)
	if len(f) != 6 || f[1] != "stdout" || f[2] != "F" || (f[3] != LineOpen && f[3] != LineAck) {
		return Line{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, f[0])
	if err != nil {
		return Line{}, false
	}
	l := Line{At: at, Kind: f[3], Owner: f[4]}
	if _, err := fmt.Sscan(f[5], &l.N); err != nil {
		return Line{}, false
	}
	return l, true
}

// Run is a run of one owner's records in a log, seqs From to To.
type Run struct {
	Owner    string `json:"owner"`
	From, To uint64
}

// Scanned is a log as scan prints it.
type Scanned struct {
	Runs  []Run  `json:"runs"`
	End   int64  `json:"end"`
	Error string `json:"error,omitempty"`
}

// Records are the runs' records, as Check takes them.
func (s Scanned) Records() []Record {
	var out []Record
	for _, r := range s.Runs {
		for seq := r.From; seq <= r.To; seq++ {
			out = append(out, Record{Owner: r.Owner, Seq: seq})
		}
	}
	return out
}

// ScanPath scans the log at path, a file or a block device.
func ScanPath(path string) Scanned {
	return scanLive(func() ([]byte, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return readLog(f)
	})
}

// maxReads bounds the reads of a log whose hole moves from one read to
// the next.
const maxReads = 5

// appendWindow is how far before the end of what a read read a slot it
// found empty (or torn) may lie and be an append's: a read of a device stops at the
// first chunk of zeroes, so a slot read empty in one chunk, with the
// records the writer appended meanwhile in the next, lies within the last
// three (a writer appends a chunk in tens of seconds, and a read takes
// milliseconds).
const appendWindow = 3 * readChunk

// scanLive scans the log that read reads while its writer may go on
// appending: a read in chunks may find a slot still empty and, in its
// next chunk, the records the writer appended meanwhile past it, a hole
// that is not one (a soak saw one at the 4 MiB boundary). Appends never
// empty a slot, so a hole that a later read finds again, at the same
// offset, is one; one that moved was an append (or a record read as it
// was written). Only a slot near the end is read again: an append
// explains no other.
func scanLive(read func() ([]byte, error)) Scanned {
	hole := -1
	for reads := 1; ; reads++ {
		data, err := read()
		if err != nil {
			return Scanned{Error: err.Error()}
		}
		records, end, err := Scan(data)
		appended := err != nil && len(data)-end <= appendWindow
		if appended && end != hole && reads < maxReads {
			hole = end
			continue
		}
		return scanned(records, end, err)
	}
}

// scanned is Scan's answer as scan prints it.
func scanned(records []Record, end int, err error) Scanned {
	s := Scanned{End: int64(end)}
	if err != nil {
		s.Error = err.Error()
	}
	for _, r := range records {
		if n := len(s.Runs); n > 0 && s.Runs[n-1].Owner == r.Owner && s.Runs[n-1].To+1 == r.Seq {
			s.Runs[n-1].To = r.Seq
			continue
		}
		s.Runs = append(s.Runs, Run{Owner: r.Owner, From: r.Seq, To: r.Seq})
	}
	return s
}

// readChunk is what readLog reads of a block device at a time.
const readChunk = 1 << 20

// readLog reads a log: a file whole; a block device, which is as long as
// the volume, until a chunk of zeroes (a chunk past the log's end, and
// before it the end, or a hole Scan sees). A hole of a chunk or more of
// zeroes in a device is taken for the end, and the records after it are
// not read.
func readLog(f *os.File) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Mode().IsRegular() {
		return io.ReadAll(f)
	}
	var data []byte
	buf := make([]byte, readChunk)
	for {
		n, err := io.ReadFull(f, buf)
		data = append(data, buf[:n]...)
		if err == io.EOF || err == io.ErrUnexpectedEOF || allZero(buf[:n]) {
			return data, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// catchUp appends to each writer behind the first until it is level with
// it.
func catchUp(writers []*Writer) error {
	for _, w := range writers[1:] {
		for w.Next() < writers[0].Next() {
			if _, err := w.Append(); err != nil {
				return err
			}
		}
	}
	return nil
}

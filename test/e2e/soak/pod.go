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
// round (one owner, or a group's members in the order given), and prints
// "ack <owner> <seq>" for the last record of each that it fsynced, every
// -report; the soak reads these lines from the node's pod logs, outside
// the node. It goes on until SIGTERM, or exits 1 on an error: the kubelet
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
				fmt.Fprintf(stdout, "ack %s %d\n", w.owner, w.Synced()-1)
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

// ParseAck reads a line a writer printed (within a line of the kubelet's
// log format, "<time> stdout F ack <owner> <seq>"): the owner and the seq
// it acknowledged, and whether the line was one.
func ParseAck(line string) (owner string, seq uint64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 3 || f[len(f)-3] != "ack" {
		return "", 0, false
	}
	if _, err := fmt.Sscan(f[len(f)-1], &seq); err != nil {
		return "", 0, false
	}
	return f[len(f)-2], seq, true
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

// scanLive scans the log that read reads while its writer may go on
// appending: a read in chunks may find a slot still empty and, in its
// next chunk, the records the writer appended meanwhile past it, a hole
// that is not one (a soak saw one at the 4 MiB boundary). Appends never
// empty a slot, so a hole that a later read finds again, at the same
// offset, is one; one that moved was an append.
func scanLive(read func() ([]byte, error)) Scanned {
	hole := -1
	for reads := 1; ; reads++ {
		data, err := read()
		if err != nil {
			return Scanned{Error: err.Error()}
		}
		records, end, err := Scan(data)
		if err != nil && end != hole && reads < maxReads {
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

package soak

import (
	"fmt"
	"os"
)

// Writer appends an owner's records to a log: a file on a filesystem
// volume, or a raw block volume's device. It goes on where the log ends
// (after a restart, or on a volume restored from another's), over a torn
// record if a crash left one.
type Writer struct {
	f     *os.File
	owner string
	next  uint64 // the seq of the owner's next record
	off   int64  // where it goes
	// synced is how many of the owner's records the writer made sure of
	// on the disk, by its own fsync: the records it may acknowledge.
	synced uint64
}

// OpenWriter opens the log at path for owner. The log must hold nothing
// an owner's writer may not go on from: no hole in the middle, and the
// owner's records, if any, 0, 1, 2... and last.
func OpenWriter(path, owner string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	data, err := readLog(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	records, end, err := Scan(data)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w := &Writer{f: f, owner: owner, off: int64(end)}
	for i, r := range records {
		if r.Owner != owner {
			continue
		}
		if r.Seq != w.next {
			f.Close()
			return nil, fmt.Errorf("%s: record %d is %s/%d, want %s/%d", path, i, owner, r.Seq, owner, w.next)
		}
		w.next++
	}
	if w.next > 0 && records[len(records)-1].Owner != owner {
		f.Close()
		return nil, fmt.Errorf("%s: records of %s follow %s's own", path, records[len(records)-1].Owner, owner)
	}
	// What it read may lie in the page cache alone: a write whose
	// writeback failed (its pool full) stays there, clean and readable,
	// until the page is dropped, and the fsync of a process that opened
	// the file after the failure does not report it. Written again and
	// fsynced, it is the disk's.
	if _, err := f.WriteAt(data[:end], 0); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	w.synced = w.next
	return w, nil
}

// Next is the seq the next Append writes.
func (w *Writer) Next() uint64 { return w.next }

// Append writes the owner's next record and fsyncs it: once it returns
// nil, the record is the volume's, and may be acknowledged. After an
// error the writer is done: what reached the disk is unknown.
func (w *Writer) Append() (uint64, error) {
	b, err := Record{Owner: w.owner, Seq: w.next}.Encode()
	if err != nil {
		return 0, err
	}
	if _, err := w.f.WriteAt(b, w.off); err != nil {
		return 0, err
	}
	if err := w.f.Sync(); err != nil {
		return 0, err
	}
	seq := w.next
	w.next++
	w.off += RecordSize
	w.synced = w.next
	return seq, nil
}

// Synced is how many of the owner's records the writer knows are on the
// disk: the records it may acknowledge.
func (w *Writer) Synced() uint64 { return w.synced }

// Close closes the log.
func (w *Writer) Close() error { return w.f.Close() }

package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/locks"
)

// The store's write-ahead log.
//
// An Update is durable once its record is in the log: one write and one
// fdatasync, shared by the writers that meet (group commit), into a file
// whose blocks were allocated and zeroed when it was made, so that the
// fdatasync has no file metadata to commit. A bbolt transaction costs two
// (its pages, then its meta page). bbolt takes the log's records at a
// checkpoint, in one transaction that also records the sequence number of
// the last of them; the log then starts again at its beginning. Open
// replays the records after that number.
//
// A record is: magic (4 bytes) | n, the length of what follows up to the
// CRC (4) | sequence number (8) | ID length (2) | ID | value | CRC-32C of
// everything before it (4), integers little-endian. The value is the
// volume's record as bbolt holds it; empty, it deletes the volume's record.
//
// The records of the log form a chain from offset 0, each numbered one
// more than the one before; the chain ends at the first record that is
// torn, fails its CRC or breaks the numbering, which is how a record
// written after a checkpoint hides what the log held before (those are
// all numbered lower).
const (
	logMagic  = 0x31475643 // "CVG1"
	logHeader = 16
	logCRC    = 4
	// DefaultLogSize is the size of the log file. A volume's record takes
	// a few hundred bytes, so a checkpoint comes every few thousand writes.
	DefaultLogSize = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// logRecord is one decoded record.
type logRecord struct {
	seq   uint64
	id    string
	value []byte
}

// encodeRecord returns the bytes of a record.
func encodeRecord(seq uint64, id string, value []byte) []byte {
	n := 2 + len(id) + len(value)
	b := make([]byte, logHeader+n+logCRC)
	binary.LittleEndian.PutUint32(b[0:], logMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint16(b[16:], uint16(len(id)))
	copy(b[18:], id)
	copy(b[18+len(id):], value)
	binary.LittleEndian.PutUint32(b[logHeader+n:], crc32.Checksum(b[:logHeader+n], castagnoli))
	return b
}

// scanLog decodes the chain of records at the start of data and returns
// them with the offset where the chain ends.
func scanLog(data []byte) ([]logRecord, int64) {
	var recs []logRecord
	off := 0
	for len(data)-off >= logHeader+logCRC {
		b := data[off:]
		if binary.LittleEndian.Uint32(b[0:]) != logMagic {
			break
		}
		n := int(binary.LittleEndian.Uint32(b[4:]))
		if n < 2 || n > len(b)-logHeader-logCRC {
			break
		}
		seq := binary.LittleEndian.Uint64(b[8:])
		if seq == 0 || len(recs) > 0 && seq != recs[len(recs)-1].seq+1 {
			break
		}
		if crc32.Checksum(b[:logHeader+n], castagnoli) != binary.LittleEndian.Uint32(b[logHeader+n:]) {
			break
		}
		idLen := int(binary.LittleEndian.Uint16(b[16:]))
		if 2+idLen > n {
			break
		}
		recs = append(recs, logRecord{
			seq:   seq,
			id:    string(b[18 : 18+idLen]),
			value: b[18+idLen : logHeader+n],
		})
		off += logHeader + n + logCRC
	}
	return recs, int64(off)
}

// writeLog is the store's log file. Writers append under mu and then make
// what they wrote durable with sync (Store.UpdateUnsynced lets the work on a record
// run meanwhile).
type writeLog struct {
	f  *os.File
	fd int
	// checkpoint commits the values of IDs written since the last
	// checkpoint (nil deletes) to bbolt, with seq, the number of the last.
	checkpoint func(values map[string][]byte, seq uint64) error

	// mu guards everything below and the file's contents.
	mu locks.Mutex
	// size is the usable size of the file.
	size int64
	// off is where the next record goes; seq is the number of the last.
	off int64
	seq uint64
	// pending holds the values written since the last checkpoint.
	pending map[string][]byte
	// broken is the error that made the log unusable: after a failed
	// fdatasync nothing tells which of the written pages reached the disk.
	broken error

	// syncMu serialises fdatasyncs.
	syncMu locks.Mutex
	// written is the number of the last record written to the file (under
	// mu); synced that of the last known durable.
	written atomic.Uint64
	synced  atomic.Uint64
}

// recoverLog opens the log at path and hands apply, in order, each record
// it holds after logSeq, the last that bbolt holds; it returns the log,
// ready for appends of size bytes, and how many records it applied.
// checkpoint commits what was written since the last checkpoint to bbolt.
// Replayed records are checkpointed when they can be (not on a full disk:
// appends then go on after them until the log is full). A chain that does
// not continue bbolt's, or a record apply refuses, fails it.
func recoverLog(path string, logSeq uint64, size int64, checkpoint func(map[string][]byte, uint64) error, apply func(id string, value []byte) error) (*writeLog, int, error) {
	l, recs, end, err := openLog(path)
	if err != nil {
		return nil, 0, err
	}
	l.checkpoint = checkpoint
	l.seq, l.off = logSeq, 0
	applied := 0
	for _, r := range recs {
		if r.seq <= logSeq {
			continue
		}
		if r.seq != l.seq+1 {
			l.f.Close()
			return nil, 0, fmt.Errorf("state log at %s starts at record %d, but the store holds records up to %d only; refusing to open a store missing records", path, r.seq, logSeq)
		}
		if err := apply(r.id, r.value); err != nil {
			l.f.Close()
			return nil, 0, fmt.Errorf("state log at %s: record %d of volume %s %w", path, r.seq, r.id, err)
		}
		l.pending[r.id] = bytesOrNil(r.value)
		l.seq = r.seq
		applied++
	}
	if l.seq > logSeq {
		l.off = end
		l.mu.Lock()
		l.checkpointLocked()
		l.mu.Unlock()
	}
	l.written.Store(l.seq)
	l.synced.Store(l.seq)
	if err := l.prepare(size); err != nil {
		l.f.Close()
		return nil, 0, err
	}
	return l, applied, nil
}

// openLog opens the log at path, creating it if needed, and returns it
// with the records it holds and where their chain ends. recoverLog sets
// checkpoint, seq, off and pending, then calls prepare.
func openLog(path string) (*writeLog, []logRecord, int64, error) {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("opening state log: %w", err)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		// The new file's name must survive a crash too.
		if err := syncDir(filepath.Dir(path)); err != nil {
			f.Close()
			return nil, nil, 0, err
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		f.Close()
		return nil, nil, 0, fmt.Errorf("reading state log: %w", err)
	}
	recs, end := scanLog(data)
	l := &writeLog{f: f, fd: int(f.Fd()), size: int64(len(data)), pending: map[string][]byte{}}
	return l, recs, end, nil
}

// prepare zero-fills the file up to size, so that appending never changes
// its size or allocates a block. When the disk has not room for all of it,
// the log uses what it has; a record that does not fit even an empty log
// goes to bbolt directly.
func (l *writeLog) prepare(size int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size >= size {
		return nil
	}
	zeros := make([]byte, 64<<10)
	for l.size < size {
		n, err := unix.Pwrite(l.fd, zeros[:min(int64(len(zeros)), size-l.size)], l.size)
		if err != nil && !NoSpace(err) {
			return fmt.Errorf("allocating state log: %w", err)
		}
		l.size += int64(max(n, 0))
		if err != nil || n == 0 {
			break
		}
	}
	if err := unix.Fsync(l.fd); err != nil {
		return fmt.Errorf("allocating state log: %w", err)
	}
	return nil
}

// append writes the record of id to the file, after a checkpoint when the
// log is full, and returns its number. A record too large for an empty log
// is committed to bbolt directly, durable when append returns.
func (l *writeLog) append(id string, value []byte) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken != nil {
		return 0, l.broken
	}
	rec := encodeRecord(l.seq+1, id, value)
	if l.off+int64(len(rec)) > l.size {
		if err := l.checkpointLocked(); err != nil {
			return 0, err
		}
	}
	if int64(len(rec)) > l.size {
		seq := l.seq + 1
		if err := l.checkpoint(map[string][]byte{id: value}, seq); err != nil {
			return 0, err
		}
		l.seq = seq
		l.written.Store(seq)
		raise(&l.synced, seq)
		return seq, nil
	}
	// A crash here loses the record: its request was never answered.
	// gofail: var stateLogBeforeWrite struct{}
	n, err := unix.Pwrite(l.fd, rec, l.off)
	if err == nil && n < len(rec) {
		// Out of room (a filesystem that allocates on overwrite).
		err = syscall.ENOSPC
	}
	if err != nil {
		if NoSpace(err) {
			// The record is not counted and what part of it reached the
			// file ends the chain there, until the next record
			// overwrites it.
			return 0, err
		}
		l.broken = fmt.Errorf("state log unusable after a failed write, restart the plugin: %w", err)
		return 0, l.broken
	}
	l.seq++
	l.off += int64(len(rec))
	l.pending[id] = value
	l.written.Store(l.seq)
	return l.seq, nil
}

// sync returns once record seq is durable. One fdatasync covers every
// record written before it, so writers that meet share it.
func (l *writeLog) sync(seq uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.synced.Load() >= seq {
		return nil
	}
	upto := l.written.Load()
	if err := unix.Fdatasync(l.fd); err != nil {
		l.mu.Lock()
		l.broken = fmt.Errorf("state log unusable after a failed fdatasync, restart the plugin: %w", err)
		err = l.broken
		l.mu.Unlock()
		return err
	}
	// A crash here keeps the record: its request may not have been answered.
	// gofail: var stateLogAfterSync struct{}
	raise(&l.synced, upto)
	return nil
}

// checkpointLocked commits the records written since the last checkpoint
// to bbolt and starts the log again at its beginning. On failure the log
// keeps them.
func (l *writeLog) checkpointLocked() error {
	if len(l.pending) > 0 {
		// gofail: var stateCheckpointBeforeCommit struct{}
		if err := l.checkpoint(l.pending, l.seq); err != nil {
			return err
		}
		// A crash here leaves bbolt and the log holding the same records;
		// the next Open skips those bbolt has by their numbers.
		// gofail: var stateCheckpointAfterCommit struct{}
		raise(&l.synced, l.seq)
	}
	l.pending = map[string][]byte{}
	l.off = 0
	return nil
}

// close commits what the log holds to bbolt, when it can (the log keeps it
// otherwise), and closes the file. clean reports that bbolt holds every
// record.
func (l *writeLog) close() (clean bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if errors.Is(l.broken, os.ErrClosed) {
		return false, nil
	}
	clean = l.broken == nil && l.checkpointLocked() == nil
	l.broken = os.ErrClosed
	return clean, l.f.Close()
}

// raise sets v to n unless it is already higher.
func raise(v *atomic.Uint64, n uint64) {
	for {
		old := v.Load()
		if old >= n || v.CompareAndSwap(old, n) {
			return
		}
	}
}

// NoSpace reports whether err says a filesystem is full or a quota is
// exhausted (ENOSPC, EDQUOT): what a request answers RESOURCE_EXHAUSTED.
func NoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// bytesOrNil returns b, or nil when it is empty (a deletion).
func bytesOrNil(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

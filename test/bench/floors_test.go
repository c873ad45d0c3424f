package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// recordLog writes records durably as the store's log does
// (pkg/state/wal.go): into a file zero-filled when it was made, so that a
// record written and fdatasynced has no file metadata to commit, on the
// filesystem of the plugin's state directory, where its log is. One write
// and one fdatasync is the least a durable intent costs.
type recordLog struct {
	f         *os.File
	off, size int64
	record    []byte
}

const (
	// recordSize is about a published volume's record in the store.
	recordSize = 300
	// recordLogSize is the store's log's (state.DefaultLogSize).
	recordLogSize = 1 << 20
)

func newRecordLog(b *testing.B, dir string) *recordLog {
	f, err := os.OpenFile(filepath.Join(dir, "bench-records"), os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	if _, err := f.Write(make([]byte, recordLogSize)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	l := &recordLog{f: f, size: recordLogSize, record: make([]byte, recordSize)}
	for i := range l.record {
		l.record[i] = byte(i)
	}
	return l
}

// write appends one record and makes it durable; at the end of the file it
// starts again at its beginning, as the log does after a checkpoint.
func (l *recordLog) write() error {
	if l.off+recordSize > l.size {
		l.off = 0
	}
	if _, err := l.f.WriteAt(l.record, l.off); err != nil {
		return err
	}
	l.off += recordSize
	return unix.Fdatasync(int(l.f.Fd()))
}

// stepTimes collects the raw floor's steps' times by name.
type stepTimes struct {
	// mu guards took.
	mu   sync.Mutex
	took map[string][]time.Duration
}

// add records the time since start under step and returns the time now.
// On a nil stepTimes it records nothing.
func (s *stepTimes) add(step string, start time.Time) time.Time {
	now := time.Now()
	if s == nil {
		return now
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.took == nil {
		s.took = map[string][]time.Duration{}
	}
	s.took[step] = append(s.took[step], now.Sub(start))
	return now
}

// String gives each step's median, in the order a stage and a publish
// take them.
func (s *stepTimes) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, step := range []string{"attach", "mkfs", "mount", "bind"} {
		if ds := s.took[step]; len(ds) > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f ms", step, ms(quantile(slices.Clone(ds), 0.5))))
		}
	}
	return strings.Join(parts, ", ")
}

package state

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLogFlushesThroughAIO checks that the log's fdatasyncs go through AIO
// on this machine, and that writers that meet share them: 8 writers at
// once, 50 writes each, make every write durable with fewer flushes than
// writes, and survive a crash.
func TestLogFlushesThroughAIO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openStore(t, path)
	if s.log.aio == nil {
		t.Fatalf("the log flushes without AIO: %v", s.log.noAIO)
	}
	before := s.log.aio.submitted()
	const writers, writes = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range writes {
				if _, err := s.Update(fmt.Sprintf("w%d", w), func(v *Volume) error { v.Formatted, v.FsSize = "ext4", int64(i); return nil }); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	flushes := s.log.aio.submitted() - before
	if flushes == 0 || flushes >= writers*writes {
		t.Errorf("%d writes made %d flushes: want at least one, and fewer than the writes", writers*writes, flushes)
	}
	if synced, written := s.log.synced.Load(), s.log.written.Load(); synced < written {
		t.Errorf("every write answered, but records up to %d only are durable of %d", synced, written)
	}
	crash(s)
	s = openStore(t, path)
	defer s.Close()
	got := records(s)
	for w := range writers {
		if v := got[fmt.Sprintf("w%d", w)]; v == nil || v.FsSize != writes-1 {
			t.Errorf("writer %d: got %+v after the crash, want its last write", w, v)
		}
	}
}

// TestFailedFlushBreaksTheLog makes the log's fdatasync fail for real
// through AIO: its descriptor is turned into one of a loop device whose
// backing file lies on a full tmpfs, holding a dirty page, so that the
// flush's writeback fails with EIO. The write waiting for it fails, and so
// does every later one: nothing tells which pages reached the disk.
func TestFailedFlushBreaksTheLog(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a tmpfs and a loop device")
	}
	s := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	if s.log.aio == nil {
		t.Fatalf("the log flushes without AIO: %v", s.log.noAIO)
	}
	setSize(t, s, "before", 1)
	_, durable, err := s.Write("v", func(v *Volume) error { v.Formatted = "ext4"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	// The record is written; its flush goes to the device, which has a
	// page to write back that its backing file has no room for.
	if err := unix.Dup2(deviceOnFullDisk(t), s.log.fd); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(s.log.fd, make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := durable(); !errors.Is(err, unix.EIO) {
		t.Fatalf("a write whose flush failed: got %v, want EIO", err)
	}
	if _, err := s.Update("w", func(v *Volume) error { v.Formatted = "ext4"; return nil }); err == nil {
		t.Fatal("a write after a failed flush succeeded")
	}
	s.Close()
}

// deviceOnFullDisk returns a descriptor of a loop device backed by a sparse
// file on a tmpfs that is full, all undone when the test ends.
func deviceOnFullDisk(t *testing.T) int {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	backing := filepath.Join(dir, "backing")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fill"), make([]byte, 2<<20), 0o600); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling the tmpfs: %v", err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

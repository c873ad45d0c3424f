package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
)

// TestFullStateDirectory fills a small tmpfs under the store: new intents
// are refused as ResourceExhausted, and every record written before is
// intact after a reopen.
func TestFullStateDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=512k"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	path := filepath.Join(dir, "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var written []string
	add := func(id string) error {
		_, err := s.Update(id, func(v *Volume) error {
			v.Stage = &Stage{Path: "/var/lib/kubelet/plugins/x/" + id, Access: AccessMount, AccessMode: "SINGLE_NODE_WRITER"}
			return nil
		})
		if err == nil {
			written = append(written, id)
		}
		return err
	}
	for i := range 50 {
		if err := add(fmt.Sprintf("before-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Fill what the store does not hold yet.
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := filler.Write(buf); err != nil {
			break
		}
	}
	filler.Close()

	var full error
	for i := 0; i < 100_000 && full == nil; i++ {
		full = add(fmt.Sprintf("vol-%06d", i))
	}
	t.Logf("%d records written, then: %v", len(written), full)
	var e *classified.Error
	if !errors.As(full, &e) || e.Kind != classified.KindResourceExhausted {
		t.Fatalf("after %d records: got %v, want a ResourceExhausted error", len(written), full)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("closing a full store: %v", err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatalf("reopening a full store: %v", err)
	}
	defer s.Close()
	if got := len(s.List()); got != len(written) {
		t.Errorf("records after reopen: got %d, want the %d written", got, len(written))
	}
	// Room again: intents are accepted.
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update("after", func(v *Volume) error { v.Formatted = "ext4"; return nil }); err != nil {
		t.Errorf("update after freeing space: %v", err)
	}
}

package devices

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/converge-csi/converge/pkg/host"
)

// TestReadFreshSeesWhatCameBefore has many callers each add a mount to a
// mount table and then read it at the same moment: each must see its own
// mount, however their reads are shared (a caller given a read that began
// before its mount was added would not), and a copy of its own.
func TestReadFreshSeesWhatCameBefore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mountinfo")
	// A long table, so that reads take long enough to overlap.
	const base = 20000
	table0 := []byte("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")
	for i := range base - 1 {
		table0 = fmt.Appendf(table0, "%d 1 0:%d / /base/%d rw - tmpfs tmpfs rw\n", 100000+i, 100+i, i)
	}
	if err := os.WriteFile(path, table0, 0o600); err != nil {
		t.Fatal(err)
	}
	table := newMountTable(path)
	defer table.close()
	var mu sync.Mutex // serializes the appends
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			mu.Lock()
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err == nil {
				_, err = fmt.Fprintf(f, "%d 1 7:%d / /p%d rw - ext4 /dev/loop%d rw\n", i+2, i, i, i)
				f.Close()
			}
			mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			mounts, err := table.readFresh()
			if err != nil {
				t.Error(err)
				return
			}
			want := fmt.Sprintf("/p%d", i)
			if !slices.ContainsFunc(mounts, func(m host.Mount) bool { return m.Path == want }) {
				t.Errorf("caller %d: its mount %s missing from the %d mounts read after it was added", i, want, len(mounts))
			}
			// Each caller's copy is its own.
			mounts[0].Path = "/changed"
		})
	}
	wg.Wait()
	if mounts, err := table.readFresh(); err != nil || len(mounts) != base+64 || mounts[0].Path != "/" {
		t.Fatalf("final read: %d mounts, first %v, %v; want %d, the first at /", len(mounts), mounts[0].Path, err, base+64)
	}
	t.Logf("%d reads for 65 calls", table.started)
}

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv"
)

// mountsUnder returns the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	ms, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		if m.Path == dir || strings.HasPrefix(m.Path, dir+"/") {
			out = append(out, m.Path)
		}
	}
	return out
}

// TestSymlinkRace flips a pod directory between a real directory and a
// symlink to a directory outside the roots, as fast as it can, while
// publishes and unpublishes of a volume at a target inside it run. Nothing
// may ever be mounted, created or removed outside the roots.
func TestSymlinkRace(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	race := create(t, p, "race")
	staging := mkdir(t, filepath.Join(p.Root, "staging-race"))
	must(t, "stage", stage(t, p, race, staging, rwo))

	outside := mkdir(t, filepath.Join(p.Dir, "outside"))
	bait := mkdir(t, filepath.Join(outside, "mount")) // what the target would resolve to
	must(t, "bait file", os.WriteFile(filepath.Join(bait, "keep"), []byte("x"), 0o600))
	pod := mkdir(t, filepath.Join(p.Root, "pod"))
	alt := filepath.Join(p.Root, "pod.alt")
	must(t, "symlink", os.Symlink(outside, alt))
	target := filepath.Join(pod, "mount")

	var stop atomic.Bool
	var flips atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			// Atomically swap the directory and the symlink.
			if err := unix.Renameat2(unix.AT_FDCWD, pod, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("exchange: %v", err)
				return
			}
			flips.Add(1)
		}
	}()

	codes := map[string]int{}
	deadline := time.Now().Add(4 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		codes["publish "+status.Code(publish(t, p, race, staging, target, i%2 == 1)).String()]++
		_, err := p.Node().NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: race, TargetPath: target})
		codes["unpublish "+status.Code(err).String()]++
		if m := mountsUnder(t, outside); len(m) > 0 {
			t.Fatalf("iteration %d: mounted outside the roots: %v", i, m)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d flips; answers %v", flips.Load(), codes)

	// Put the directory back where the kubelet had it and clean up.
	if fi, err := os.Lstat(pod); err != nil || fi.Mode()&os.ModeSymlink != 0 {
		must(t, "exchange back", unix.Renameat2(unix.AT_FDCWD, pod, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE))
	}
	unpublish(t, p, race, target)
	unstage(t, p, race, staging)
	entries, err := os.ReadDir(outside)
	if err != nil || len(entries) != 1 || entries[0].Name() != "mount" {
		t.Errorf("outside the roots: got %v, %v; want only the bait directory", entries, err)
	}
	if entries, _ := os.ReadDir(bait); len(entries) != 1 {
		t.Errorf("bait directory: got %v, want only its file", entries)
	}
	if m := mountsUnder(t, outside); len(m) > 0 {
		t.Errorf("mounted outside the roots: %v", m)
	}
	if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

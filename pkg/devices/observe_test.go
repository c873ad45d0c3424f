package devices

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// TestObserveSeesRenamedMountPoint renames the directory above a mount
// point between two observations: the second must show the mount at its new
// path. The kernel announces mounts and unmounts to a poller of mountinfo
// (POLLPRI) but not renames, which change the paths mountinfo shows, so an
// observer that reused its last parse until an announced change would still
// show the old path; operations decided on it fail (an unpublish that finds
// its target "not mounted" cannot remove it: EBUSY).
func TestObserveSeesRenamedMountPoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	before, after := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	mnt := filepath.Join(before, "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Unmount(filepath.Join(after, "mnt"), syscall.MNT_DETACH)
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Partitions: "/proc/partitions"}
	paths := func() []string {
		t.Helper()
		snap, err := o.Observe()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range []string{mnt, filepath.Join(after, "mnt")} {
			if m, ok := snap.MountAt(p); ok && m.FsType == "tmpfs" {
				out = append(out, p)
			}
		}
		return out
	}
	if got := paths(); !slices.Equal(got, []string{mnt}) {
		t.Fatalf("before the rename: got %v, want [%s]", got, mnt)
	}
	if err := os.Rename(before, after); err != nil {
		t.Fatal(err)
	}
	if got, want := paths(), []string{filepath.Join(after, "mnt")}; !slices.Equal(got, want) {
		t.Fatalf("after the rename: got %v, want %v", got, want)
	}
}

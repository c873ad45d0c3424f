package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// PoolFilesystem makes a filesystem of type fs (mkfs.<fs> mkfsArgs) of
// size bytes on a loop device of the test's own and mounts it as the
// directory of pool name, which it returns (see FilesystemAt).
func PoolFilesystem(t testing.TB, p *Plugin, name string, size int64, fs string, mkfsArgs ...string) string {
	t.Helper()
	dir := filepath.Join(p.Dir, "pool-"+name)
	FilesystemAt(t, p, dir, size, fs, mkfsArgs...)
	return dir
}

// FilesystemAt makes a filesystem of type fs (mkfs.<fs> mkfsArgs) of size
// bytes on a loop device of the test's own and mounts it at dir (a data
// directory or a pool's). When the test ends the plugin stops, nothing of
// it may be left on the filesystem (but the mounts of the test's own
// filesystems), and the filesystem goes.
func FilesystemAt(t testing.TB, p *Plugin, dir string, size int64, fs string, mkfsArgs ...string) {
	t.Helper()
	Filesystem(t, dir, size, fs, mkfsArgs...)
	t.Cleanup(func() {
		// The volumes' devices and mounts go while their images are
		// still reachable.
		p.Stop()
		var left []string
		for _, l := range Leftovers(p.Dir, dir) {
			if l != "mount "+dir && !strings.HasPrefix(l, "mount "+filepath.Join(p.Dir, "pool-")) && l != "mount "+p.DataDir {
				left = append(left, l)
			}
		}
		if len(left) > 0 {
			t.Errorf("left behind in %s: %s", dir, strings.Join(left, "; "))
		}
		ForceClean(p.Dir, dir)
	})
}

// Filesystem makes a filesystem of type fs (mkfs.<fs> mkfsArgs) of size
// bytes on a loop device of the test's own, backed by a sparse file, and
// mounts it at dir. Cleanups the test registers later run first; then the
// filesystem is unmounted, an error if something still holds it, and its
// device goes.
func Filesystem(t testing.TB, dir string, size int64, fs string, mkfsArgs ...string) {
	t.Helper()
	img := filepath.Join(t.TempDir(), filepath.Base(dir)+".img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		// A device left bound would hold the deleted image's space on
		// the machine's disk until a reboot.
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("detaching the test's filesystem device %s: %v: %s", dev, err, out)
		}
	})
	if out, err := exec.Command("mkfs."+fs, append(mkfsArgs, dev)...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.%s: %v: %s", fs, err, out)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dev, dir, fs, 0, ""); err != nil {
		t.Fatalf("mounting %s: %v", dir, err)
	}
	t.Cleanup(func() {
		// A test's ForceClean of a directory above it may have unmounted
		// it already (EINVAL: not mounted any more).
		if err := syscall.Unmount(dir, 0); err != nil && err != syscall.EINVAL {
			// Something still holds it (a volume's loop device): say so,
			// rather than leave it behind unseen.
			t.Errorf("unmounting the test's filesystem at %s: %v", dir, err)
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
}

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
// directory of pool name, which it returns. When the test ends the plugin
// stops, nothing of it may be left on the filesystem, and the filesystem
// goes.
func PoolFilesystem(t testing.TB, p *Plugin, name string, size int64, fs string, mkfsArgs ...string) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), name+".img")
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
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	if out, err := exec.Command("mkfs."+fs, append(mkfsArgs, dev)...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.%s: %v: %s", fs, err, out)
	}
	dir := filepath.Join(p.Dir, "pool-"+name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dev, dir, fs, 0, ""); err != nil {
		t.Fatalf("mounting pool %s: %v", name, err)
	}
	t.Cleanup(func() {
		p.Stop()
		var left []string
		for _, l := range Leftovers(p.Dir, dir) {
			if !strings.HasPrefix(l, "mount "+filepath.Join(p.Dir, "pool-")) {
				left = append(left, l)
			}
		}
		if len(left) > 0 {
			t.Errorf("left behind in pool %s: %s", name, strings.Join(left, "; "))
		}
		ForceClean(p.Dir, dir)
		syscall.Unmount(dir, syscall.MNT_DETACH)
	})
	return dir
}

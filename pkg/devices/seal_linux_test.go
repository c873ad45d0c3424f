package devices

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// sealRoot returns a root for Paths under t.TempDir(), on the machine's
// own filesystem (which takes the immutable flag and trusted extended
// attributes), and skips the test unless it runs as root. Whatever a
// failed test leaves immutable or mounted under it is undone at its end.
func sealRoot(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, the immutable flag and trusted extended attributes")
	}
	root := t.TempDir()
	t.Cleanup(func() {
		for range 4 { // mounts stacked on each other
			filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
				unix.Unmount(path, unix.MNT_DETACH)
				return nil
			})
		}
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			setImmutable(t, path, false)
			return nil
		})
	})
	return root
}

// setImmutable sets or clears the immutable flag of path, as chattr does;
// a path that cannot take it is left as it is.
func setImmutable(t *testing.T, path string, on bool) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags)); err != nil && on {
		t.Fatalf("chattr +i %s: %v", path, err)
	}
}

// immutable reports whether path (not what is mounted on it, when it is
// a mount's root: then the mount's root) is immutable.
func immutable(t *testing.T, path string) bool {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatal(err)
	}
	return flags&fsImmutableFL != 0
}

func mountTmpfs(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mount("tmpfs", path, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs at %s: %v", path, err)
	}
}

func bind(t *testing.T, from, to string) {
	t.Helper()
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("binding %s at %s: %v", from, to, err)
	}
}

func unmount(t *testing.T, path string) {
	t.Helper()
	if err := unix.Unmount(path, 0); err != nil {
		t.Fatalf("unmounting %s: %v", path, err)
	}
}

// write creates name in dir and returns the error.
func write(dir, name string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte("record"), 0o600)
}

// TestSealedTargetTakesNoWriteTillRemoved follows a repair: the target is
// sealed under its live volume (which still takes writes), unmounted, and
// then refuses writes, root's included, as does a container's bind of the
// bare target made meanwhile, even once the volume is mounted again; a
// second seal is a no-op, and Remove unseals and removes the target.
func TestSealedTargetTakesNoWriteTillRemoved(t *testing.T) {
	root := sealRoot(t)
	p := NewPaths([]string{root})
	target := filepath.Join(root, "pod", "mount")
	container := filepath.Join(root, "container")
	for _, d := range []string{target, container} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	mountTmpfs(t, target)
	if err := p.Seal(target); err != nil {
		t.Fatalf("Seal under the live volume: %v", err)
	}
	if err := write(target, "in-volume"); err != nil {
		t.Fatalf("a write to the volume, sealed beneath: got %v, want none (the volume's root must not be sealed)", err)
	}
	unmount(t, target)
	if err := write(target, "on-node"); !errors.Is(err, unix.EPERM) {
		t.Fatalf("a write to the bare target after the unmount: got %v, want EPERM", err)
	}
	bind(t, target, container) // the runtime starts a container meanwhile
	mountTmpfs(t, target)      // the repair mounts the volume again
	if err := write(target, "in-volume"); err != nil {
		t.Fatalf("a write to the volume mounted again: %v", err)
	}
	if err := write(container, "on-node"); !errors.Is(err, unix.EPERM) {
		t.Fatalf("a write in the container's bind of the bare target, volume back: got %v, want EPERM", err)
	}
	if err := p.Seal(target); err != nil {
		t.Fatalf("a second Seal: %v", err)
	}
	unmount(t, container)
	unmount(t, target)
	if err := p.Remove(target); err != nil {
		t.Fatalf("Remove of the sealed target: %v", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the target after Remove: got %v, want it gone", err)
	}

	// A raw block volume's target is a file with the device bound on it.
	file := filepath.Join(root, "pod", "block")
	device := filepath.Join(root, "device")
	for _, f := range []string{file, device} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bind(t, device, file)
	if err := p.Seal(file); err != nil {
		t.Fatalf("Seal of a block target: %v", err)
	}
	if immutable(t, device) {
		t.Fatal("the device bound on the block target was sealed, not the target beneath it")
	}
	unmount(t, file)
	if err := os.WriteFile(file, []byte("x"), 0o600); !errors.Is(err, unix.EPERM) {
		t.Fatalf("a write to the bare block target: got %v, want EPERM", err)
	}
	if err := p.Remove(file); err != nil {
		t.Fatalf("Remove of the sealed block target: %v", err)
	}
	if _, err := os.Lstat(file); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the block target after Remove: got %v, want it gone", err)
	}
}

// TestSealTouchesOnlyTargets: Seal and Remove leave alone what is not a
// target they sealed: an administrator's immutable directory keeps its
// flag through a seal and a removal, a FIFO and a file with two links are
// refused, and Remove works where no mount can be cloned.
func TestSealTouchesOnlyTargets(t *testing.T) {
	root := sealRoot(t)
	p := NewPaths([]string{root})

	admins := filepath.Join(root, "admins")
	if err := os.Mkdir(admins, 0o750); err != nil {
		t.Fatal(err)
	}
	setImmutable(t, admins, true)
	if err := p.Seal(admins); err != nil {
		t.Fatalf("Seal of an immutable directory: got %v, want a no-op", err)
	}
	if err := p.Remove(admins); !errors.Is(err, unix.EPERM) {
		t.Fatalf("Remove of an administrator's immutable directory: got %v, want EPERM", err)
	}
	if !immutable(t, admins) {
		t.Fatal("an administrator's immutable directory lost its flag")
	}

	fifo := filepath.Join(root, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Seal(fifo); !errors.Is(err, errNotSealable) {
		t.Fatalf("Seal of a FIFO: got %v, want %v", err, errNotSealable)
	}
	linked := filepath.Join(root, "linked")
	if err := os.WriteFile(linked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(linked, filepath.Join(root, "other-name")); err != nil {
		t.Fatal(err)
	}
	if err := p.Seal(linked); !errors.Is(err, errNotSealable) {
		t.Fatalf("Seal of a file with two links: got %v, want %v", err, errNotSealable)
	}
	if immutable(t, linked) {
		t.Fatal("a file with two links was sealed")
	}

	// Under an unbindable mount no clone can be made: Seal fails, and
	// Remove, which needs none, still removes.
	unbindable := filepath.Join(root, "unbindable")
	if err := os.Mkdir(unbindable, 0o750); err != nil {
		t.Fatal(err)
	}
	mountTmpfs(t, unbindable)
	if err := unix.Mount("", unbindable, "", unix.MS_UNBINDABLE, ""); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(unbindable, "mount")
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := p.Seal(target); err == nil {
		t.Fatal("Seal under an unbindable mount: got no error, want the clone's")
	}
	if err := p.Remove(target); err != nil {
		t.Fatalf("Remove under an unbindable mount: %v", err)
	}
	unmount(t, unbindable)

	// A target left sealed by a plugin that stopped: UnsealTree unseals
	// it, and it alone, so that the tree can be removed.
	left := filepath.Join(root, "pod", "left")
	if err := os.MkdirAll(left, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := p.Seal(left); err != nil {
		t.Fatal(err)
	}
	if n, err := UnsealTree(root); n != 1 || err != nil {
		t.Fatalf("UnsealTree: got %d unsealed, %v; want 1, no error", n, err)
	}
	if immutable(t, left) || !immutable(t, admins) {
		t.Fatalf("after UnsealTree: the left target immutable %v, the administrator's %v; want false, true", immutable(t, left), immutable(t, admins))
	}
	if err := os.Remove(left); err != nil {
		t.Fatalf("removing the target UnsealTree unsealed: %v", err)
	}
}

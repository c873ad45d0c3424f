package devices

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

func TestUnescapeOctal(t *testing.T) {
	tests := []struct{ in, want string }{
		{`/a/b`, `/a/b`},
		{`/a\040b`, `/a b`},
		{`/a\134b`, `/a\b`},
		{`/a\011\012`, "/a\t\n"},
		{`/trailing\04`, `/trailing\04`},
	}
	for _, tc := range tests {
		if got := unescapeOctal(tc.in); got != tc.want {
			t.Errorf("unescapeOctal(%q): got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestPathsRefuseSymlinks(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	p := NewPaths([]string{root})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(root, "real"), 0o750))
	must(os.Symlink(outside, filepath.Join(root, "link")))

	if err := p.CheckDir(filepath.Join(root, "real")); err != nil {
		t.Errorf("CheckDir(real): %v", err)
	}
	for _, path := range []string{filepath.Join(root, "link"), filepath.Join(root, "link", "x")} {
		if err := p.Mkdir(path); !errors.Is(err, ErrSymlink) {
			t.Errorf("Mkdir(%s): got %v, want ErrSymlink", path, err)
		}
		if err := p.CheckDir(path); !errors.Is(err, ErrSymlink) {
			t.Errorf("CheckDir(%s): got %v, want ErrSymlink", path, err)
		}
	}
	if err := p.Remove(filepath.Join(root, "link", "x")); !errors.Is(err, ErrSymlink) {
		t.Errorf("Remove through a symlink: got %v, want ErrSymlink", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("created outside the root: %v", entries)
	}
	if err := p.Mkdir(filepath.Join(outside, "x")); !errors.Is(err, ErrOutsideRoots) {
		t.Errorf("Mkdir outside: got %v, want ErrOutsideRoots", err)
	}
	target := filepath.Join(root, "real", "target")
	must(p.Mkdir(target))
	must(p.Mkdir(target)) // existing directory: no-op
	must(p.Remove(target))
	must(p.Remove(target)) // missing: no-op
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target still there: %v", err)
	}
	if err := p.CheckDir(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckDir(missing): got %v, want ErrNotExist", err)
	}
}

func TestImagesCreateIsIdempotent(t *testing.T) {
	im := &Images{Dir: t.TempDir()}
	if err := im.Create("v", 1<<20, true); err != nil {
		t.Fatal(err)
	}
	if err := im.Create("v", 1<<20, true); err != nil {
		t.Errorf("same size again: %v", err)
	}
	if err := im.Create("v", 2<<20, true); !errors.Is(err, ErrImageExists) {
		t.Errorf("other size: got %v, want ErrImageExists", err)
	}
	ids, _ := im.List()
	if len(ids) != 1 || ids[0] != "v" {
		t.Errorf("List: got %v, want [v] (no temporary files)", ids)
	}
	if id, ok := im.IDOf(im.Path("v")); !ok || id != "v" {
		t.Errorf("IDOf: got %q %v", id, ok)
	}
	if err := im.Delete("v"); err != nil {
		t.Fatal(err)
	}
	if err := im.Delete("v"); err != nil {
		t.Errorf("delete missing: %v", err)
	}
}

func TestBtrfsMountsAreMatchedToTheirLoopDevice(t *testing.T) {
	loops := []host.Device{{Device: "/dev/loop3", Dev: host.DevNum{Major: 7, Minor: 3}}}
	mounts := []host.Mount{
		{Path: "/s", Dev: host.DevNum{Major: 0, Minor: 40}, Source: "/dev/loop3", FsType: "btrfs"},
		{Path: "/t", Dev: host.DevNum{Major: 0, Minor: 41}, Source: "tmpfs", FsType: "tmpfs"},
		{Path: "/u", Dev: host.DevNum{Major: 7, Minor: 3}, Source: "/dev/loop3", FsType: "ext4"},
	}
	got := byDevice(mounts, loops)
	want := []host.DevNum{{Major: 7, Minor: 3}, {Major: 0, Minor: 41}, {Major: 7, Minor: 3}}
	for i := range got {
		if got[i].Dev != want[i] {
			t.Errorf("%s: got %v, want %v", got[i].Path, got[i].Dev, want[i])
		}
	}
}

// TestFileReaders reads attributes and lists a directory through both
// readers of the loop listing: each attribute read whole, through a buffer
// smaller than it too; a kept descriptor reporting that it was open before
// (same), the one-shot reader never; and at its bound, the kept reader
// reading all the same but keeping nothing.
func TestFileReaders(t *testing.T) {
	dir := t.TempDir()
	content := map[string]string{"size": "131072\n", "backing_file": "/var/lib/converge/volumes/pvc-1.img\n"}
	for name, c := range content {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kept := newKeptFiles()
	defer kept.close()
	kept.buf = make([]byte, 7)
	full := newKeptFiles()
	defer full.close()
	full.max = 0
	for _, r := range []struct {
		name string
		r    fileReader
		same bool // on the second round
	}{{"one-shot", &oneShot{buf: make([]byte, 16)}, false}, {"kept", kept, true}, {"kept, at its bound", full, false}} {
		for round := range 2 {
			names, err := r.r.names(dir)
			slices.Sort(names)
			if err != nil || !slices.Equal(names, []string{"backing_file", "size"}) {
				t.Errorf("%s, round %d: names %v, %v", r.name, round, names, err)
			}
			for name, c := range content {
				got, same, err := r.r.read(filepath.Join(dir, name))
				if err != nil || got != c || same != (round == 1 && r.same) {
					t.Errorf("%s, round %d, %s: got %q, same %v, %v; want %q, same %v", r.name, round, name, got, same, err, c, round == 1 && r.same)
				}
			}
		}
	}
	if len(kept.fds) != 2 || len(full.fds) != 0 {
		t.Errorf("%d and %d descriptors kept, want 2 and none", len(kept.fds), len(full.fds))
	}
}

// TestBindAttr checks the attributes a bind mount gets from its flags: the
// access-time flags are values of one field, which mount_setattr takes only
// with the field cleared; the last one given wins.
func TestBindAttr(t *testing.T) {
	for _, tc := range []struct {
		name     string
		options  []string
		set, clr uint64
	}{
		{name: "none", options: nil},
		{name: "noatime", options: []string{"noatime"}, set: unix.MOUNT_ATTR_NOATIME, clr: unix.MOUNT_ATTR__ATIME},
		{name: "strictatime", options: []string{"strictatime"}, set: unix.MOUNT_ATTR_STRICTATIME, clr: unix.MOUNT_ATTR__ATIME},
		{name: "relatime", options: []string{"relatime"}, set: unix.MOUNT_ATTR_RELATIME, clr: unix.MOUNT_ATTR__ATIME},
		{name: "last atime wins", options: []string{"noatime", "strictatime"}, set: unix.MOUNT_ATTR_STRICTATIME, clr: unix.MOUNT_ATTR__ATIME},
		{name: "nodiratime is its own flag", options: []string{"nodiratime", "noatime"}, set: unix.MOUNT_ATTR_NODIRATIME | unix.MOUNT_ATTR_NOATIME, clr: unix.MOUNT_ATTR__ATIME},
		{name: "flags", options: []string{"ro", "nosuid", "nodev", "noexec"}, set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC},
		{name: "filesystem options are ignored", options: []string{"discard", "errors=remount-ro", "rw", "atime"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := bindAttr(tc.options)
			if got.Attr_set != tc.set || got.Attr_clr != tc.clr {
				t.Errorf("bindAttr(%v): got set %#x clr %#x, want set %#x clr %#x", tc.options, got.Attr_set, got.Attr_clr, tc.set, tc.clr)
			}
		})
	}
}

// TestImagesThickAndThin checks the allocation of images: a thick image
// has every block from its creation and growth on, a thin one none until
// written, and Reserve fills the holes of one.
func TestImagesThickAndThin(t *testing.T) {
	im := &Images{Dir: t.TempDir()}
	allocated := func(id string) int64 {
		t.Helper()
		us, err := im.Usages()
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range us {
			if u.ID == id {
				return u.Allocated
			}
		}
		t.Fatalf("no image %s in %v", id, us)
		return 0
	}
	const mib = 1 << 20
	if err := im.Create("thick", 8*mib, true); err != nil {
		t.Fatal(err)
	}
	if err := im.Create("thin", 8*mib, false); err != nil {
		t.Fatal(err)
	}
	if got := allocated("thick"); got < 8*mib {
		t.Errorf("thick image: %d bytes allocated, want all 8 MiB", got)
	}
	if got := allocated("thin"); got > 64<<10 {
		t.Errorf("thin image: %d bytes allocated, want next to none", got)
	}
	if n, err := im.Grow("thick", 12*mib, true); err != nil || n != 12*mib {
		t.Fatalf("grow thick: %d, %v", n, err)
	}
	if got := allocated("thick"); got < 12*mib {
		t.Errorf("grown thick image: %d bytes allocated, want all 12 MiB", got)
	}
	if n, err := im.Grow("thin", 12*mib, false); err != nil || n != 12*mib {
		t.Fatalf("grow thin: %d, %v", n, err)
	}
	if got := allocated("thin"); got > 64<<10 {
		t.Errorf("grown thin image: %d bytes allocated, want next to none", got)
	}
	if err := im.Reserve("thin"); err != nil {
		t.Fatal(err)
	}
	if got := allocated("thin"); got < 12*mib {
		t.Errorf("reserved image: %d bytes allocated, want all 12 MiB", got)
	}
	if size, _ := im.Size("thin"); size != 12*mib {
		t.Errorf("reserve changed the size to %d", size)
	}
}

// TestFilesystemHolding checks that a path not made yet is on the
// filesystem of its nearest existing ancestor, one that exists on its own,
// and that another filesystem (procfs) tells apart.
func TestFilesystemHolding(t *testing.T) {
	dir := t.TempDir()
	want, err := FilesystemOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "kubelet"), filepath.Join(dir, "a", "b", "c")} {
		if got, err := FilesystemHolding(p); err != nil || got != want {
			t.Errorf("FilesystemHolding(%s) = %d, %v; want %d", p, got, err, want)
		}
	}
	if got, err := FilesystemHolding("/proc/no/such/dir"); err != nil || got == want {
		t.Errorf("FilesystemHolding in procfs = %d, %v; want another filesystem than %d", got, err, want)
	}
}

package devices

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// copyDirs returns, for each copy mode, a directory on a filesystem that
// copies that way: a fresh ext4 (no reflinks) and a fresh xfs with reflinks.
func copyDirs(t *testing.T) map[CopyMode]string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	ext4, _ := mountFresh(t, t.TempDir(), host.FsExt4)
	xfs, _ := mountFresh(t, t.TempDir(), host.FsXFS, "-m", "reflink=1")
	return map[CopyMode]string{CopySparse: ext4, CopyReflink: xfs}
}

// TestProbeCopyMode finds reflinks on xfs made with them and none on ext4,
// and leaves nothing behind.
func TestProbeCopyMode(t *testing.T) {
	for want, dir := range copyDirs(t) {
		got, err := ProbeCopyMode(dir)
		if err != nil || got != want {
			t.Errorf("ProbeCopyMode(%s): got %q, %v; want %q", dir, got, err, want)
		}
		if left := filesIn(t, dir); len(left) != 0 {
			t.Errorf("ProbeCopyMode left %v in %s", left, dir)
		}
	}
}

// filesIn returns the names in dir but lost+found.
func filesIn(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Name() != "lost+found" {
			out = append(out, e.Name())
		}
	}
	return out
}

// allocated returns the bytes allocated to the file at path.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestCopyFile copies an image with two data extents and holes each way:
// the copy holds the same bytes and size, keeps the holes (it allocates no
// more than the source), and is independent of the source afterwards; it
// never replaces an existing file; and a cancelled or refused copy leaves
// no file and no temporary behind.
func TestCopyFile(t *testing.T) {
	for mode, dir := range copyDirs(t) {
		t.Run(string(mode), func(t *testing.T) {
			src := filepath.Join(dir, "src.img")
			f, err := os.Create(src)
			if err != nil {
				t.Fatal(err)
			}
			a, b := bytes.Repeat([]byte("a"), 1<<20), bytes.Repeat([]byte("b"), 1<<20)
			if _, err := f.WriteAt(a, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(b, 40<<20); err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(64 << 20); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			want, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}

			dst := filepath.Join(dir, "dst.img")
			if err := CopyFile(context.Background(), src, dst, mode, CopyOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the copy differs from the source (%d against %d bytes)", len(got), len(want))
			}
			if srcA, dstA := allocated(t, src), allocated(t, dst); dstA > srcA {
				t.Errorf("the copy allocates %d bytes, the source %d: holes were filled", dstA, srcA)
			}
			// Written after the copy, the source changes alone.
			if err := os.WriteFile(src, []byte("changed"), 0o600); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
				t.Error("writing the source changed the copy")
			}

			if err := CopyFile(context.Background(), src, dst, mode, CopyOptions{}); !errors.Is(err, os.ErrExist) {
				t.Errorf("copying over an existing file: got %v, want os.ErrExist", err)
			}
			if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
				t.Error("a refused copy changed the existing file")
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err = CopyFile(ctx, dst, filepath.Join(dir, "cancelled.img"), CopySparse, CopyOptions{})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("a cancelled copy: got %v, want context.Canceled", err)
			}
			if left := filesIn(t, dir); strings.Join(left, ",") != "dst.img,src.img" {
				t.Errorf("files after the refused and cancelled copies: got %v, want dst.img and src.img", left)
			}
		})
	}
}

// TestRemoveStaleTemps removes what a crash left of a copy in progress
// and nothing else.
func TestRemoveStaleTemps(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{tempPrefix + "snap-1-123", "v1.img", "keep"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := RemoveStaleTemps(dir); err != nil {
		t.Fatal(err)
	}
	if got := filesIn(t, dir); strings.Join(got, ",") != "keep,v1.img" {
		t.Errorf("got %v, want keep and v1.img", got)
	}
	if err := RemoveStaleTemps(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("a missing directory: got %v, want no error", err)
	}
}

// TestFreezeThaw freezes a mounted filesystem through Paths: a second
// freeze finds it frozen, a thaw thaws it (a second thaw is a no-op), and
// it can be frozen again; a path through a symlink is refused.
func TestFreezeThaw(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	for _, fs := range []string{host.FsExt4, host.FsXFS, host.FsBtrfs} {
		t.Run(fs, func(t *testing.T) {
			dir := t.TempDir()
			mnt, _ := mountFresh(t, dir, fs)
			paths := NewPaths([]string{dir})
			if err := paths.Freeze(mnt); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { paths.Thaw(mnt) })
			if err := paths.Freeze(mnt); !errors.Is(err, ErrFrozen) {
				t.Errorf("freezing a frozen filesystem: got %v, want ErrFrozen", err)
			}
			for range 2 {
				if err := paths.Thaw(mnt); err != nil {
					t.Errorf("thaw: %v", err)
				}
			}
			if err := paths.Freeze(mnt); err != nil {
				t.Errorf("freezing a thawed filesystem: %v", err)
			}
			if err := paths.Thaw(mnt); err != nil {
				t.Errorf("thaw: %v", err)
			}
			link := filepath.Join(dir, "link")
			if err := os.Symlink(mnt, link); err != nil {
				t.Fatal(err)
			}
			if err := paths.Freeze(link); !errors.Is(err, ErrSymlink) {
				t.Errorf("freezing through a symlink: got %v, want ErrSymlink", err)
			}
		})
	}
}

// TestSnapshots takes a snapshot of an image each way of copying, then
// writes the image and deletes it: the snapshot still describes what it
// was taken of, lists, refuses to be taken again, and restores the bytes
// of when it was taken; a crash's leftover is neither listed nor kept;
// deleting it twice is fine.
func TestSnapshots(t *testing.T) {
	for mode, dir := range copyDirs(t) {
		t.Run(string(mode), func(t *testing.T) {
			image := filepath.Join(dir, "v1.img")
			before := bytes.Repeat([]byte("before"), 100_000)
			if err := os.WriteFile(image, before, 0o600); err != nil {
				t.Fatal(err)
			}
			snaps := &Snapshots{Dir: filepath.Join(dir, "snapshots"), Mode: mode}
			now := time.Date(2026, 11, 23, 16, 0, 0, 123, time.UTC)
			of := SnapshotOf{Source: "v1", FsType: host.FsExt4, Access: "mount"}
			info, err := snaps.Take(context.Background(), "s1", image, of, now)
			if err != nil {
				t.Fatal(err)
			}
			want := SnapshotInfo{ID: "s1", SnapshotOf: of, Size: int64(len(before)), Allocated: info.Allocated, Created: now}
			if info != want || info.Allocated <= 0 {
				t.Errorf("Take: got %+v, want %+v with blocks allocated", info, want)
			}
			if err := os.WriteFile(image, []byte("after"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(image); err != nil {
				t.Fatal(err)
			}
			if _, err := snaps.Take(context.Background(), "s1", filepath.Join(dir, "missing.img"), of, now); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("taking a snapshot of a missing image: got %v, want os.ErrNotExist", err)
			}
			other := filepath.Join(dir, "other.img")
			if err := os.WriteFile(other, []byte("other"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := snaps.Take(context.Background(), "s1", other, SnapshotOf{Source: "other"}, now); !errors.Is(err, os.ErrExist) {
				t.Errorf("taking s1 again: got %v, want os.ErrExist", err)
			}
			// What a crash in the middle of a copy leaves.
			if err := os.WriteFile(filepath.Join(snaps.Dir, tempPrefix+"s2.snap-1"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if got, err := snaps.List(); err != nil || len(got) != 1 || got[0] != info {
				t.Errorf("List: got %+v, %v; want only %+v", got, err, info)
			}
			if err := snaps.RemoveStaleTemps(); err != nil {
				t.Fatal(err)
			}
			if got := filesIn(t, snaps.Dir); strings.Join(got, ",") != "s1.snap" {
				t.Errorf("after RemoveStaleTemps: got %v, want s1.snap", got)
			}
			restored := filepath.Join(dir, "v2.img")
			if err := snaps.Restore(context.Background(), "s1", restored, 0, false); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(restored); !bytes.Equal(got, before) {
				t.Error("the restored image does not hold the bytes of when the snapshot was taken")
			}
			// Restored larger, thin then thick: the snapshot's bytes, then
			// zeros; the thick image has every block of its size.
			const larger = 4 << 20
			for _, thick := range []bool{false, true} {
				image := filepath.Join(dir, fmt.Sprintf("larger-%v.img", thick))
				if err := snaps.Restore(context.Background(), "s1", image, larger, thick); err != nil {
					t.Fatal(err)
				}
				got, _ := os.ReadFile(image)
				if len(got) != larger || !bytes.Equal(got[:len(before)], before) || bytes.ContainsFunc(got[len(before):], func(r rune) bool { return r != 0 }) {
					t.Errorf("restored to %d bytes (thick %v): got %d bytes, want the snapshot's then zeros", larger, thick, len(got))
				}
				if a := allocated(t, image); thick && a < larger || !thick && a >= larger {
					t.Errorf("restored to %d bytes (thick %v): %d bytes allocated", larger, thick, a)
				}
			}
			for range 2 {
				if err := snaps.Delete("s1"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := snaps.Get("s1"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Get after Delete: got %v, want os.ErrNotExist", err)
			}
		})
	}
}

// TestSharedBytes counts what a file shares with its reflinked copy: all
// of it after the copy, less what the source overwrote since; nothing
// where the filesystem copies without sharing.
func TestSharedBytes(t *testing.T) {
	for mode, dir := range copyDirs(t) {
		t.Run(string(mode), func(t *testing.T) {
			src := filepath.Join(dir, "src.img")
			if err := os.WriteFile(src, bytes.Repeat([]byte("x"), 8<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			shared := func(path string) int64 {
				t.Helper()
				n, err := SharedBytes(path)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := shared(src); n != 0 {
				t.Errorf("before any copy: %d bytes shared, want 0", n)
			}
			dst := filepath.Join(dir, "dst.img")
			if err := CopyFile(context.Background(), src, dst, mode, CopyOptions{}); err != nil {
				t.Fatal(err)
			}
			want := int64(8 << 20)
			if mode == CopySparse {
				want = 0
			}
			if n, m := shared(src), shared(dst); n != want || m != want {
				t.Errorf("after the copy: source shares %d bytes, copy %d; want %d", n, m, want)
			}
			f, err := os.OpenFile(src, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(bytes.Repeat([]byte("y"), 1<<20), 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if mode == CopyReflink {
				want -= 1 << 20
			}
			if n := shared(src); n != want {
				t.Errorf("after 1 MiB of the source was overwritten: it shares %d bytes, want %d", n, want)
			}
		})
	}
}

// TestImagesCopying finds what a copy to an image holds before it is the
// image: its temporary file's size and blocks, and on xfs with reflinks
// the blocks it shares with its source; nothing of another image's copy
// (one whose ID begins alike), and nothing once the copy is the image.
func TestImagesCopying(t *testing.T) {
	for mode, dir := range copyDirs(t) {
		t.Run(string(mode), func(t *testing.T) {
			im := &Images{Dir: dir, Shares: mode == CopyReflink}
			src := filepath.Join(dir, "src")
			if err := os.WriteFile(src, bytes.Repeat([]byte("x"), 4<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			copying := func(id string) Usage {
				t.Helper()
				u, err := im.Copying(id)
				if err != nil {
					t.Fatal(err)
				}
				return u
			}
			if u := copying("v1"); u.Size != 0 || u.Allocated != 0 || u.Shared != 0 {
				t.Errorf("no copy under way: got %+v, want nothing", u)
			}
			// Another image's copy, whose ID begins with v1's.
			other, err := CopyTemp(im.Path("v10"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.Write(bytes.Repeat([]byte("z"), 1<<20)); err != nil {
				t.Fatal(err)
			}
			other.Close()
			tmp, err := CopyTemp(im.Path("v1"))
			if err != nil {
				t.Fatal(err)
			}
			defer tmp.Close()
			wantShared := int64(0)
			if mode == CopyReflink {
				in, err := os.Open(src)
				if err != nil {
					t.Fatal(err)
				}
				defer in.Close()
				if err := unix.IoctlFileClone(int(tmp.Fd()), int(in.Fd())); err != nil {
					t.Fatal(err)
				}
				wantShared = 4 << 20
			} else if _, err := tmp.Write(bytes.Repeat([]byte("y"), 1<<20)); err != nil {
				t.Fatal(err)
			}
			if err := tmp.Sync(); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(int(tmp.Fd()), &st); err != nil {
				t.Fatal(err)
			}
			u := copying("v1")
			if u.Size != st.Size || u.Allocated != st.Blocks*512 || u.Shared != wantShared || u.Allocated < 1<<20 {
				t.Errorf("a copy under way: got %+v, want size %d, %d bytes allocated (at least 1 MiB), %d shared",
					u, st.Size, st.Blocks*512, wantShared)
			}
			if err := os.Rename(tmp.Name(), im.Path("v1")); err != nil {
				t.Fatal(err)
			}
			if u := copying("v1"); u.Size != 0 || u.Allocated != 0 {
				t.Errorf("the copy made the image: got %+v, want nothing under way", u)
			}
		})
	}
}

// TestImagesBlank checks, on ext4 and on xfs, that a new image holds no
// data whether thin (holes) or thick (blocks allocated, never written),
// and that one written block, or a filesystem, is data.
func TestImagesBlank(t *testing.T) {
	for mode, dir := range copyDirs(t) {
		fs := map[CopyMode]string{CopySparse: "ext4", CopyReflink: "xfs"}[mode]
		images := &Images{Dir: dir}
		for _, thick := range []bool{false, true} {
			id := fmt.Sprintf("blank-%v", thick)
			if err := images.Create(id, 64<<20, thick); err != nil {
				t.Fatal(err)
			}
			if blank, err := images.Blank(id); !blank || err != nil {
				t.Errorf("%s: a new image (thick %v): blank %v, %v; want blank", fs, thick, blank, err)
			}
			f, err := os.OpenFile(images.Path(id), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteAt([]byte{1}, 40<<20)
			if err == nil {
				err = f.Sync()
			}
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			if blank, err := images.Blank(id); blank || err != nil {
				t.Errorf("%s: an image with a byte written (thick %v): blank %v, %v; want data", fs, thick, blank, err)
			}
		}
		if err := images.Create("mkfs", 64<<20, true); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", images.Path("mkfs")).CombinedOutput(); err != nil {
			t.Fatalf("mkfs: %v: %s", err, out)
		}
		if blank, err := images.Blank("mkfs"); blank || err != nil {
			t.Errorf("%s: an image with a filesystem: blank %v, %v; want data", fs, blank, err)
		}
		if _, err := images.Blank("missing"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a missing image: got %v, want os.ErrNotExist", fs, err)
		}
	}
}

// TestCopyAcrossFilesystemTypes copies an image from an xfs to an ext4,
// as a restore into another storage pool does, where the kernel refuses
// copy_file_range between them: the copy holds the data, at its offsets,
// and leaves the holes.
func TestCopyAcrossFilesystemTypes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	from, _ := mountFresh(t, mkdirIn(t, "xfs"), host.FsXFS)
	to, _ := mountFresh(t, mkdirIn(t, "ext4"), host.FsExt4)
	src := filepath.Join(from, "image")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("converge"), 3<<17) // 3 MiB
	if _, err := f.WriteAt(data, 8<<20); err == nil {
		err = f.Truncate(32 << 20)
	}
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(to, "copy")
	if err := CopyFile(t.Context(), src, dst, CopySparse, CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 32<<20 || !bytes.Equal(got[8<<20:8<<20+len(data)], data) || bytes.ContainsFunc(got[:8<<20], func(r rune) bool { return r != 0 }) {
		t.Fatalf("the copy: %d bytes, data at 8 MiB %t; want 32 MiB with the data at 8 MiB and zeros before", len(got), bytes.Equal(got[8<<20:8<<20+len(data)], data))
	}
	var st unix.Stat_t
	if err := unix.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 8<<20 {
		t.Errorf("the copy allocates %d bytes for 3 MiB of data: the holes were written", st.Blocks*512)
	}
}

// mkdirIn makes a directory called name in the test's directory.
func mkdirIn(t *testing.T, name string) string {
	dir := filepath.Join(t.TempDir(), name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestProbeFilesystem finds the type of real filesystems and that each
// punches holes.
func TestProbeFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	for _, fs := range []string{host.FsExt4, host.FsXFS, host.FsBtrfs} {
		t.Run(fs, func(t *testing.T) {
			mnt, _ := mountFresh(t, t.TempDir(), fs)
			got, holes, err := ProbeFilesystem(mnt)
			if err != nil || got != fs || !holes {
				t.Errorf("got %q, punches holes %t, %v; want %s punching holes", got, holes, err, fs)
			}
			if entries, _ := os.ReadDir(mnt); len(entries) > 1 { // lost+found
				t.Errorf("the probe left %v", entries)
			}
		})
	}
}

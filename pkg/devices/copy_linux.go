package devices

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CopyMode is how the data directory's filesystem copies an image.
type CopyMode string

const (
	// CopyReflink shares the source's blocks (FICLONE): atomic against
	// concurrent writes to the source, milliseconds whatever the size, and
	// no space until either copy is written (xfs with reflink, btrfs).
	CopyReflink CopyMode = "reflink"
	// CopySparse copies the source's data extents (SEEK_DATA, SEEK_HOLE,
	// copy_file_range) and leaves its holes holes: time and space in
	// proportion to the data.
	CopySparse CopyMode = "sparse"
)

// copyChunk bounds one copy_file_range, so that a cancelled copy stops
// within about one chunk's time.
const copyChunk = 64 << 20

// ProbeCopyMode finds out how dir's filesystem copies: it clones an empty
// file there (FICLONE) and removes both files; empty, so that a full
// filesystem answers too. A filesystem without reflinks answers
// EOPNOTSUPP, EINVAL or EXDEV: CopySparse.
func ProbeCopyMode(dir string) (CopyMode, error) {
	src, err := os.CreateTemp(dir, tempPrefix+"probe-")
	if err != nil {
		return "", fmt.Errorf("probing how %s copies: %w", dir, err)
	}
	defer os.Remove(src.Name())
	defer src.Close()
	dst, err := os.CreateTemp(dir, tempPrefix+"probe-")
	if err != nil {
		return "", fmt.Errorf("probing how %s copies: %w", dir, err)
	}
	defer os.Remove(dst.Name())
	defer dst.Close()
	switch err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); {
	case err == nil:
		return CopyReflink, nil
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL), errors.Is(err, unix.EXDEV):
		return CopySparse, nil
	default:
		return "", fmt.Errorf("probing how %s copies: FICLONE: %w", dir, err)
	}
}

// CopyOptions says what a copy gets beyond src's bytes before it takes
// dst's name. The zero value is a plain copy.
type CopyOptions struct {
	// Attrs are extended attributes given to the copy.
	Attrs map[string]string
	// Size, when larger than src, is the copy's size; the bytes it adds
	// read as zeros.
	Size int64
	// Thick allocates every block of the copy, its holes and what Size
	// adds: the space it will ever need is taken before it exists.
	Thick bool
}

// CopyTemp creates the temporary file that a copy to dst is made in,
// beside dst (see CopyFile and Images.Copying).
func CopyTemp(dst string) (*os.File, error) {
	return os.CreateTemp(filepath.Dir(dst), copyTempPrefix(dst))
}

// copyTempPrefix begins the names of the temporary files of copies to dst.
func copyTempPrefix(dst string) string { return tempPrefix + filepath.Base(dst) + "-" }

// CopyFile copies the file src to dst, which must not exist, as mode says,
// and gives the copy what opts says (attributes, a larger size, its
// blocks). The copy is made under a temporary name in dst's directory and
// renamed to dst only once it is complete, with all of that, and on the
// disk, so a crash leaves dst complete or absent (and a temporary file,
// which RemoveStaleTemps removes). A copy cancelled through ctx, or failed,
// leaves nothing. An existing dst is an error matching os.ErrExist; no
// space for a thick copy is an error matching unix.ENOSPC, a filesystem
// that cannot allocate ahead ErrCannotAllocate.
func CopyFile(ctx context.Context, src, dst string, mode CopyMode, opts CopyOptions) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	tmp, err := CopyTemp(dst)
	if err != nil {
		return err
	}
	done := false
	defer func() {
		tmp.Close()
		if !done {
			os.Remove(tmp.Name())
		}
	}()
	if err := copyData(ctx, in, tmp, st.Size(), mode); err != nil {
		return err
	}
	if err := opts.apply(tmp, src, st.Size()); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("syncing the copy of %s: %w", src, err)
	}
	// A crash here leaves a temporary copy that the next start removes.
	// gofail: var devicesCopyBeforeRename struct{}

	// renameat2(RENAME_NOREPLACE): never over an existing dst.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp.Name(), unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%s: %w", dst, os.ErrExist)
		}
		return fmt.Errorf("renaming the copy of %s to %s: %w", src, dst, err)
	}
	done = true
	// The copy is in place, its name not yet synced.
	// gofail: var devicesCopyAfterRename struct{}
	return syncDir(filepath.Dir(dst))
}

// copyData fills out, empty, with the size bytes of in as mode says:
// sharing in's blocks (CopyReflink) or copying its data extents
// (CopySparse). Any other mode is refused before anything is copied.
func copyData(ctx context.Context, in, out *os.File, size int64, mode CopyMode) error {
	switch mode {
	case CopyReflink:
		if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
			return fmt.Errorf("cloning %s: %w", in.Name(), err)
		}
		return nil
	case CopySparse:
		if err := copySparse(ctx, in, out, size); err != nil {
			return fmt.Errorf("copying %s: %w", in.Name(), err)
		}
		return nil
	default:
		return fmt.Errorf("unknown copy mode %q", mode)
	}
}

// apply gives f, the copy of src (of srcSize bytes), what o says beyond
// those bytes: o.Size when larger, with every block allocated when
// o.Thick (unix.ENOSPC when they do not fit, ErrCannotAllocate where the
// filesystem cannot allocate ahead), and o.Attrs.
func (o CopyOptions) apply(f *os.File, src string, srcSize int64) error {
	if size := max(o.Size, srcSize); o.Thick {
		if err := allocate(f, size); err != nil {
			return fmt.Errorf("allocating the copy of %s: %w", src, err)
		}
	} else if size > srcSize {
		if err := f.Truncate(size); err != nil {
			return fmt.Errorf("sizing the copy of %s: %w", src, err)
		}
	}
	for name, value := range o.Attrs {
		if err := unix.Fsetxattr(int(f.Fd()), name, []byte(value), 0); err != nil {
			return fmt.Errorf("setting %s on the copy of %s: %w", name, src, err)
		}
	}
	return nil
}

// copyRange copies n bytes at off of in to the same offset of out, and
// returns how many it copied: by copy_file_range, or, between filesystems
// of different types (a restore into another storage pool), where the
// kernel refuses it (EXDEV since Linux 5.19), by pread and pwrite.
func copyRange(in, out int, off int64, n int) (int, error) {
	rOff, wOff := off, off
	copied, err := unix.CopyFileRange(in, &rOff, out, &wOff, n, 0)
	if err == nil {
		return copied, nil
	}
	if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) {
		return 0, fmt.Errorf("copy_file_range: %w", err)
	}
	buf := make([]byte, min(n, 1<<20))
	got, err := unix.Pread(in, buf, off)
	if err != nil {
		return 0, fmt.Errorf("reading at %d: %w", off, err)
	}
	for done := 0; done < got; {
		w, err := unix.Pwrite(out, buf[done:got], off+int64(done))
		if err != nil {
			return 0, fmt.Errorf("writing at %d: %w", off+int64(done), err)
		}
		done += w
	}
	return got, nil
}

// copySparse copies the data extents of in to out, leaving holes, and
// gives out in's size.
func copySparse(ctx context.Context, in, out *os.File, size int64) error {
	inFd, outFd := int(in.Fd()), int(out.Fd())
	var off int64
	for off < size {
		start, err := unix.Seek(inFd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA: %w", err)
		}
		end, err := unix.Seek(inFd, start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE: %w", err)
		}
		for start < end {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := copyRange(inFd, outFd, start, int(min(end-start, copyChunk)))
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF // the source shrank
			}
			start += int64(n)
		}
		off = end
	}
	return out.Truncate(size)
}

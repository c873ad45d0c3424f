package devices

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// imageSuffix ends every volume image file name.
	imageSuffix = ".img"
	// tempPrefix starts the name of an image being created or copied; IDs
	// never start with a dot, so no image can be mistaken for one.
	tempPrefix = ".tmp-"
)

// ErrImageExists is returned by Images.Create when an image of another size
// already exists.
var ErrImageExists = errors.New("image exists with another size")

// ErrCannotAllocate is returned when the data directory's filesystem cannot
// allocate a file's space ahead of its writes (fallocate), which a thick
// volume needs.
var ErrCannotAllocate = errors.New("the storage pool's filesystem cannot allocate space ahead of writes (fallocate)")

// allocate gives f's first size bytes their blocks, growing the file to
// size where it is smaller; the data already there is untouched.
func allocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return ErrCannotAllocate
	}
	if err != nil {
		return fmt.Errorf("allocating %d bytes: %w", size, err)
	}
	return nil
}

// sizeTo makes f size bytes long: every block allocated for a thick image,
// a sparse extension otherwise.
func sizeTo(f *os.File, size int64, thick bool) error {
	if thick {
		return allocate(f, size)
	}
	return f.Truncate(size)
}

// Images manages the image files that back file-backend volumes: thick
// (every block allocated) or sparse. An
// image's path is always derived from the volume ID inside Dir; it is never
// taken from a request. IDs must have been validated by the caller.
type Images struct {
	// Dir is the data directory.
	Dir string
	// Shares is true when Dir's filesystem shares blocks between files
	// (reflinks, see ProbeCopyMode): Usages then counts what each image
	// shares.
	Shares bool
}

// Path returns the image file of id.
func (im *Images) Path(id string) string {
	return filepath.Join(im.Dir, id+imageSuffix)
}

// IDOf returns the volume ID whose image is path, and false when path is
// not an image in Dir.
func (im *Images) IDOf(path string) (string, bool) {
	if filepath.Dir(path) != filepath.Clean(im.Dir) {
		return "", false
	}
	return strings.CutSuffix(filepath.Base(path), imageSuffix)
}

// Size returns the size of id's image; an error matching os.ErrNotExist when
// there is none.
func (im *Images) Size(id string) (int64, error) {
	fi, err := os.Stat(im.Path(id))
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Changed returns when id's image last changed, and its size; an error
// matching os.ErrNotExist when there is none.
func (im *Images) Changed(id string) (time.Time, int64, error) {
	fi, err := os.Stat(im.Path(id))
	if err != nil {
		return time.Time{}, 0, err
	}
	return fi.ModTime(), fi.Size(), nil
}

// Grow makes id's image at least size bytes and returns its size; the new
// bytes of a thick image are allocated, those of a thin one are not. An
// image already that large is left as it is: images never shrink.
func (im *Images) Grow(id string, size int64, thick bool) (int64, error) {
	f, err := os.OpenFile(im.Path(id), os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if fi.Size() >= size {
		return fi.Size(), nil
	}
	if err := sizeTo(f, size, thick); err != nil {
		// A thick growth that ran out of space may have allocated part of
		// the new range (still beyond the old end); cut it off.
		f.Truncate(fi.Size())
		return 0, fmt.Errorf("growing image of %s: %w", id, err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("growing image of %s: %w", id, err)
	}
	// The image is grown; the device and the filesystem are not.
	// gofail: var devicesImageAfterGrow struct{}
	return size, nil
}

// Blank reports whether id's image holds no data at all: the filesystem
// has no data extent in it (SEEK_DATA finds none; holes and blocks
// allocated but never written read as zeros), so it holds no filesystem,
// no partition table, nothing. false, and no error, when anything is
// there. A filesystem that cannot tell holes reports the whole file as
// data, never blank. A device attached to the image may hold writes in its
// cache that the image does not show yet: ask before attaching.
func (im *Images) Blank(id string) (bool, error) {
	fd, err := unix.Open(im.Path(id), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	_, err = unix.Seek(fd, 0, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking for data in the image of %s: %w", id, err)
	}
	return false, nil
}

// Create makes an image of size bytes for id, every block allocated when
// thick and sparse otherwise, atomically: a crash leaves either no image or
// a complete one. An existing image of the same size is a no-op; of
// another size, ErrImageExists.
func (im *Images) Create(id string, size int64, thick bool) error {
	if err := os.MkdirAll(im.Dir, 0o700); err != nil {
		return err
	}
	if cur, err := im.Size(id); err == nil {
		if cur != size {
			return fmt.Errorf("%w: %d bytes, asked for %d", ErrImageExists, cur, size)
		}
		return nil
	}
	tmp, err := os.CreateTemp(im.Dir, tempPrefix+id+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := sizeTo(tmp, size, thick); err != nil {
		tmp.Close()
		return fmt.Errorf("sizing image: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// A crash here leaves a temporary file that the next start removes.
	// gofail: var devicesImageBeforeRename struct{}

	// RENAME_NOREPLACE keeps a concurrent creator's image intact.
	err = unix.Renameat2(unix.AT_FDCWD, tmp.Name(), unix.AT_FDCWD, im.Path(id), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		return im.Create(id, size, thick)
	}
	if err != nil {
		return fmt.Errorf("publishing image: %w", err)
	}
	// The image is in place, its name not yet synced.
	// gofail: var devicesImageAfterRename struct{}
	return syncDir(im.Dir)
}

// Reserve allocates every block of id's image that is not allocated (the
// holes of an image made sparse, or punched by discards). On failure
// (ENOSPC) part of the holes may have been filled; what was written is
// never touched.
func (im *Images) Reserve(id string) error {
	f, err := os.OpenFile(im.Path(id), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := allocate(f, fi.Size()); err != nil {
		return fmt.Errorf("reserving the space of %s: %w", id, err)
	}
	return f.Sync()
}

// Usage is the size of an image and the space allocated to it.
type Usage struct {
	ID              string
	Size, Allocated int64
	// Shared is what of Allocated the image shares with other files (its
	// snapshots'): a write there must allocate anew.
	Shared int64
}

// Usages returns the size and allocation of every image, in ID order.
func (im *Images) Usages() ([]Usage, error) {
	ids, err := im.List()
	if err != nil {
		return nil, err
	}
	out := make([]Usage, 0, len(ids))
	for _, id := range ids {
		u, err := im.Usage(id)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// Usage returns the size and allocation of id's image; an error matching
// os.ErrNotExist when there is none.
func (im *Images) Usage(id string) (Usage, error) {
	var st unix.Stat_t
	if err := unix.Stat(im.Path(id), &st); err != nil {
		return Usage{}, &os.PathError{Op: "stat", Path: im.Path(id), Err: err}
	}
	u := Usage{ID: id, Size: st.Size, Allocated: st.Blocks * 512}
	if im.Shares {
		shared, err := SharedBytes(im.Path(id))
		if err != nil {
			return Usage{}, err
		}
		u.Shared = shared
	}
	return u, nil
}

// Copying returns what the copies being made to id's image (CopyFile's
// temporary files beside it, a restore's, say) hold so far: zero when
// there are none.
func (im *Images) Copying(id string) (Usage, error) {
	u := Usage{ID: id}
	entries, err := os.ReadDir(im.Dir)
	if err != nil {
		return u, err
	}
	prefix := copyTempPrefix(im.Path(id))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		path := filepath.Join(im.Dir, e.Name())
		var st unix.Stat_t
		if err := unix.Stat(path, &st); errors.Is(err, unix.ENOENT) {
			continue // done or failed meanwhile
		} else if err != nil {
			return u, &os.PathError{Op: "stat", Path: path, Err: err}
		}
		u.Size += st.Size
		u.Allocated += st.Blocks * 512
		if im.Shares {
			shared, err := SharedBytes(path)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return u, err
			}
			u.Shared += shared
		}
	}
	return u, nil
}

// RemoveStaleTemps removes the temporary files of Create calls that a crash
// interrupted. Call it before serving, when no Create runs.
func (im *Images) RemoveStaleTemps() error { return RemoveStaleTemps(im.Dir) }

// Flush writes out what is dirty of an image (a file of the data
// directory, or the copy of one).
func (im *Images) Flush(image string) error { return flushFile(image) }

// RemoveStaleTemps removes from dir the temporary files of what a crash
// interrupted (an image's creation, a CopyFile). Call it when nothing
// writes to dir. A missing dir is a no-op.
func RemoveStaleTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// Delete removes id's image. A missing image is a no-op.
func (im *Images) Delete(id string) error { return removeSynced(im.Path(id)) }

// List returns the IDs of all images, sorted.
func (im *Images) List() ([]string, error) { return idsIn(im.Dir, imageSuffix) }

// removeSynced removes the file at path and makes its removal durable. A
// missing file is a no-op.
func removeSynced(path string) error {
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// The file is gone, its removal not yet synced.
	// gofail: var devicesFileAfterRemove struct{}
	return syncDir(filepath.Dir(path))
}

// idsIn returns, sorted, the IDs of the regular files of dir named
// <id><suffix>; hidden files (what is being made) are not IDs. A missing
// dir has none.
func idsIn(dir, suffix string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), suffix); ok && e.Type().IsRegular() && !strings.HasPrefix(id, ".") {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Capacity returns the total and available bytes of the filesystem that
// holds Dir.
func (im *Images) Capacity() (total, available int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(im.Dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", im.Dir, err)
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

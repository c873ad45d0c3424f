package devices

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// ErrSymlink is returned when a component of a path is a symlink.
var ErrSymlink = errors.New("path has a symlink component")

// ErrOutsideRoots is returned for a path that lies in no allowed root.
var ErrOutsideRoots = errors.New("path is outside the allowed roots")

// Paths resolves paths below a set of trusted roots without ever following
// a symlink: every component below the root is resolved by openat2 with
// RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS, so a symlink planted in a pod
// directory cannot redirect a mkdir, a removal or a mount check elsewhere.
// The roots themselves come from the plugin's configuration and are trusted.
type Paths struct {
	roots []string
}

// NewPaths returns a resolver confined to roots.
func NewPaths(roots []string) *Paths {
	return &Paths{roots: slices.Clone(roots)}
}

func (p *Paths) split(path string) (root, rel string, err error) {
	root, rel, err = host.Beneath(path, p.roots)
	if err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrOutsideRoots, err)
	}
	return root, rel, nil
}

// open resolves path beneath its root with O_PATH and returns the fd. A
// root itself opens as is: roots are trusted configuration.
func (p *Paths) open(path string, flags uint64) (int, error) {
	return p.openAs(path, unix.O_PATH|flags)
}

// openAs is open with the open flags given (O_CLOEXEC added), for a
// descriptor that ioctls act on, which O_PATH refuses.
func (p *Paths) openAs(path string, flags uint64) (int, error) {
	return p.openIn(nil, path, flags)
}

// rootFds are descriptors of the roots, opened once for many resolutions
// (a pass's mount checks) rather than once for each: see pin.
type rootFds map[string]int

// pin opens every root there is now. A root that cannot be opened is left
// out: resolutions beneath it open it themselves, as without pin.
func (p *Paths) pin() rootFds {
	fds := make(rootFds, len(p.roots))
	for _, r := range p.roots {
		if fd, err := unix.Open(r, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			fds[r] = fd
		}
	}
	return fds
}

// close closes the descriptors.
func (fds rootFds) close() {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// openIn is openAs resolving beneath the root's descriptor in pinned, when
// it holds one.
func (p *Paths) openIn(pinned rootFds, path string, flags uint64) (int, error) {
	if slices.Contains(p.roots, path) {
		fd, err := unix.Open(path, int(flags)|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("opening root %s: %w", path, err)
		}
		return fd, nil
	}
	root, rel, err := p.split(path)
	if err != nil {
		return -1, err
	}
	rootFd, ok := pinned[root]
	if !ok {
		if rootFd, err = unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return -1, fmt.Errorf("opening root %s: %w", root, err)
		}
		defer unix.Close(rootFd)
	}
	how := &unix.OpenHow{
		Flags:   unix.O_CLOEXEC | flags,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(rootFd, rel, how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
			return -1, fmt.Errorf("%w: %s", ErrSymlink, path)
		case errors.Is(err, unix.ENOENT):
			return -1, fmt.Errorf("%s: %w", path, os.ErrNotExist)
		default:
			return -1, fmt.Errorf("resolving %s: %w", path, err)
		}
	}
}

// Stat returns the file mode of path, resolved without symlinks: a symlink
// in any component, the last one included, is ErrSymlink. A missing path
// yields an error matching os.ErrNotExist.
func (p *Paths) Stat(path string) (os.FileMode, error) {
	fd, err := p.open(path, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return os.ModeDir, nil
	case unix.S_IFLNK:
		return os.ModeSymlink, nil
	case unix.S_IFREG:
		return 0, nil
	default:
		return os.ModeIrregular, nil
	}
}

// CheckDir fails unless path is an existing directory reached without
// symlinks.
func (p *Paths) CheckDir(path string) error {
	mode, err := p.Stat(path)
	if err != nil {
		return err
	}
	if mode == os.ModeSymlink {
		return fmt.Errorf("%w: %s", ErrSymlink, path)
	}
	if mode != os.ModeDir {
		return fmt.Errorf("%s is not a directory", path)
	}
	return nil
}

// Mkdir creates the directory path (its parent must exist) with mode
// 0750. An existing directory is a no-op; an existing non-directory is an
// error.
func (p *Paths) Mkdir(path string) error {
	parentFd, err := p.open(filepath.Dir(path), unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(parentFd)
	err = unix.Mkdirat(parentFd, filepath.Base(path), 0o750)
	if errors.Is(err, unix.EEXIST) {
		return p.CheckDir(path)
	}
	if err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	return nil
}

// Remove removes path, an empty directory or a file, reached without
// symlinks, unsealing it first when Seal sealed it. A missing path is a
// no-op; a mount point fails with EBUSY.
func (p *Paths) Remove(path string) error {
	parentFd, err := p.open(filepath.Dir(path), unix.O_DIRECTORY)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(parentFd)
	unseal(parentFd, path)
	base := filepath.Base(path)
	err = unix.Unlinkat(parentFd, base, unix.AT_REMOVEDIR)
	if errors.Is(err, unix.ENOTDIR) {
		err = unix.Unlinkat(parentFd, base, 0)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

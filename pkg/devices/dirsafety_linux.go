package devices

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DirProblem is what makes a component of a directory's path one that a
// user other than root could change or redirect.
type DirProblem string

// The problems CheckTrustedDir reports.
const (
	// DirSymlink: the component is a symlink, which whoever can write its
	// directory, or who made it, may point anywhere.
	DirSymlink DirProblem = "symlink"
	// DirNotDirectory: the component is neither a directory nor a symlink.
	DirNotDirectory DirProblem = "not a directory"
	// DirOwner: the component is not root's; its owner may chmod it.
	DirOwner DirProblem = "owner"
	// DirWritable: the component's group or others may write it (without
	// the sticky bit, or it is the directory itself), and so add, remove
	// or rename what it holds.
	DirWritable DirProblem = "writable"
)

// trustedUID is the only owner a trusted directory and its ancestors may
// have: csi-node runs as root, and any other owner could chmod them.
const trustedUID = 0

// UnsafeDirError is returned by CheckTrustedDir and MakeTrustedDir for a
// directory that a user other than root could change or redirect:
// Component, an absolute path (Dir itself or one of its ancestors), has
// Problem.
type UnsafeDirError struct {
	Dir       string
	Component string
	Problem   DirProblem
	// UID and Mode are the component's owner and permission bits (with
	// the sticky, setuid and setgid bits), as found.
	UID  uint32
	Mode uint32
}

// Error names the directory, the component, what is wrong and the fix.
func (e *UnsafeDirError) Error() string {
	var what, fix string
	switch e.Problem {
	case DirSymlink:
		what, fix = "is a symlink", "pass the real path (readlink -f "+e.Component+"), or make it a directory"
	case DirNotDirectory:
		what, fix = "is not a directory", "make it a directory owned by root"
	case DirOwner:
		what, fix = fmt.Sprintf("is owned by uid %d, not root", e.UID), "run chown root "+e.Component
	default:
		what, fix = fmt.Sprintf("is writable by %s (mode %04o)", writers(e.Mode), e.Mode), "run chmod go-w "+e.Component
	}
	return fmt.Sprintf("directory %s is not safe: %s %s, so a user other than root could change or redirect it; %s",
		e.Dir, e.Component, what, fix)
}

// writers says who besides the owner may write a directory of mode.
func writers(mode uint32) string {
	switch mode & 0o022 {
	case 0o022:
		return "its group and others"
	case 0o020:
		return "its group"
	}
	return "others"
}

// CheckTrustedDir checks that no user but root can change dir or what
// its path leads to, so that root may trust the files it holds: every
// component of dir, from / down, must be a directory, not a symlink, owned
// by root, and not writable by its group or others. An ancestor writable
// by others is accepted only with the sticky bit (as /tmp has): there,
// others may add names of their own but cannot remove or rename the
// root-owned entry on dir's path (unlink(2), rename(2)), so the path still
// leads where root made it lead. An ACL granting write to another user
// shows as group write (its mask), and is refused as such.
//
// It returns an *UnsafeDirError for the first component at fault, an error
// wrapping fs.ErrNotExist when a component is missing, and changes
// nothing. Each component is opened beneath the one checked before it,
// never through a symlink, so what is checked is what the path resolves to.
func CheckTrustedDir(dir string) error { return walkTrusted(dir, false) }

// MakeTrustedDir is CheckTrustedDir, but makes each missing component,
// mode 0700 and owned by the caller (root), once every component above it
// has passed: nothing is made beneath one that fails. If dir exists, it is
// only checked.
func MakeTrustedDir(dir string) error { return walkTrusted(dir, true) }

// walkTrusted opens dir's components one by one from /, each beneath the
// descriptor of the one before, and checks each through its descriptor.
func walkTrusted(dir string, mkdir bool) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return fmt.Errorf("directory %q must be an absolute, clean path", dir)
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("directory %s: opening /: %w", dir, err)
	}
	defer func() { unix.Close(fd) }()
	var names []string
	if dir != "/" {
		names = strings.Split(dir[1:], "/")
	}
	path := "/"
	for i := 0; ; i++ {
		if err := checkComponent(fd, dir, path, i == len(names)); err != nil {
			return err
		}
		if i == len(names) {
			return nil
		}
		path = filepath.Join(path, names[i])
		child, err := openComponent(fd, names[i], mkdir)
		if err != nil {
			return fmt.Errorf("directory %s: opening %s: %w", dir, path, err)
		}
		unix.Close(fd)
		fd = child
	}
}

// openComponent opens name beneath parent without following it if it is
// a symlink (O_PATH|O_NOFOLLOW gives the link itself, which checkComponent
// then refuses), making it first when it is missing and mkdir is set.
func openComponent(parent int, name string, mkdir bool) (int, error) {
	const flags = unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(parent, name, flags, 0)
	if errors.Is(err, unix.ENOENT) && mkdir {
		// EEXIST: made by another since; it is checked like any other.
		if err := unix.Mkdirat(parent, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		fd, err = unix.Openat(parent, name, flags, 0)
	}
	return fd, err
}

// checkComponent checks the component open at fd, path in dir (dir itself
// when last), and returns an *UnsafeDirError if it is not safe.
func checkComponent(fd int, dir, path string, last bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("directory %s: stat %s: %w", dir, path, err)
	}
	unsafe := &UnsafeDirError{Dir: dir, Component: path, UID: st.Uid, Mode: st.Mode & 0o7777}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		unsafe.Problem = DirSymlink
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		unsafe.Problem = DirNotDirectory
	case st.Uid != trustedUID:
		unsafe.Problem = DirOwner
	// dir itself is refused even if sticky: others could still add files
	// to it, such as an image under a name a volume will have.
	case st.Mode&0o022 != 0 && (last || st.Mode&unix.S_ISVTX == 0):
		unsafe.Problem = DirWritable
	default:
		return nil
	}
	return unsafe
}

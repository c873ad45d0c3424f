package devices

import (
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// The kernel names a loop device's backing file (sysfs loop/backing_file)
// by the path it has through the mount the file was opened by, as seen
// from the reader. When that mount is gone from every namespace, as a
// container's hostPath mount is once the container ends, the path is the
// file's path beneath that mount's root only: a csi-node container that
// attached /var/lib/converge/volumes/v.img through its hostPath
// /var/lib/converge leaves a device that the next container reads as
// /volumes/v.img. Such a device is still the volume's, and the plugin that
// restarts must find it, or it would attach the image a second time beside
// the device its staging mount is on. The device and inode numbers the
// device reports (LOOP_GET_STATUS64) tell which file it is.

// ResolveBacking returns the path beneath dir of the file backing l when
// the kernel names that file by a path outside dir: the longest run of
// l's last path components that, joined to dir, is a file with the device
// and inode numbers l reports. A path already beneath dir, or a device
// that is no longer attached, is returned as it is, with false; so is a
// file that is not in dir.
func ResolveBacking(l host.Loop, dir string) (string, bool) {
	dir = filepath.Clean(dir)
	if l.BackingFile == "" || strings.HasPrefix(l.BackingFile, dir+"/") {
		return l.BackingFile, false
	}
	parts := strings.Split(strings.TrimPrefix(l.BackingFile, "/"), "/")
	var dev, ino uint64
	asked := false
	for k := range parts {
		cand := filepath.Join(append([]string{dir}, parts[k:]...)...)
		if !strings.HasPrefix(cand, dir+"/") {
			continue // ".." in the kernel's path: never outside dir
		}
		var st unix.Stat_t
		if err := unix.Lstat(cand, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if !asked {
			asked = true
			var err error
			if dev, ino, err = loopBacking(l.Device); err != nil {
				return l.BackingFile, false
			}
		}
		if st.Dev == dev && st.Ino == ino {
			return cand, true
		}
	}
	return l.BackingFile, false
}

// loopBacking returns the device and inode numbers of the file attached
// to the loop device dev.
func loopBacking(dev string) (devNum, ino uint64, err error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return 0, 0, err
	}
	return info.Device, info.Inode, nil
}

// reroot gives every loop device in loops that backs a file of the data
// directory under another path (see ResolveBacking) that file's path in
// the data directory, and its size.
func (im *Images) reroot(loops []host.Loop) {
	for i, l := range loops {
		path, ok := ResolveBacking(l, im.Dir)
		if !ok {
			continue
		}
		loops[i].BackingFile = path
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err == nil {
			loops[i].BackingSize, loops[i].BackingAllocated = st.Size, st.Blocks*512
		}
	}
}

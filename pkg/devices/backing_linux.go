package devices

import (
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/locks"
)

// The kernel names a loop device's backing file (sysfs loop/backing_file)
// by the path it has through the mount the file was opened by, as seen
// from the reader. That path does not tell whose file it is:
//   - csi-node in a container attaches /var/lib/converge/volumes/v.img
//     through its hostPath /var/lib/converge. Once that container has
//     ended, its mount is gone from every namespace, and the next
//     container reads the path beneath the mount's root only:
//     /volumes/v.img. The device is still the volume's, and the plugin
//     that restarts must find it, or it would attach the image a second
//     time beside the device its staging mount is on.
//   - Nodes that share a kernel (kind's, the e2e suite's) each run
//     csi-node with a hostPath of their own at /var/lib/converge: a
//     device another node's csi-node attached reads, in every container,
//     /var/lib/converge/volumes/<its volume>.img, the path of an image of
//     this data directory. Taken for this node's, it would be released as
//     an orphan under the other node's mounted volume.
// The device and inode numbers the device reports (LOOP_GET_STATUS64) tell
// which file it is: a device is the data directory's only if they are
// those of the file at its path here.

// fileID identifies a file: its filesystem's device number and its inode.
type fileID struct{ dev, ino uint64 }

// loopFiles caches the file each loop device is attached to, by the
// device's attachment (its diskseq), so that a pass asks the kernel only
// about devices attached since the last.
type loopFiles struct {
	// mu guards seen.
	mu   locks.Mutex
	seen map[string]seenFile // by device
}

// seenFile is what one attachment of a device was found attached to.
type seenFile struct {
	seq string
	id  fileID
}

// of returns the file l is attached to; an error when the device is no
// longer attached, or cannot be asked.
func (c *loopFiles) of(l host.Device) (fileID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.seen[l.Device]; ok && l.Seq != "" && s.seq == l.Seq {
		return s.id, nil
	}
	dev, ino, err := loopBacking(l.Device)
	if err != nil {
		return fileID{}, err
	}
	id := fileID{dev, ino}
	if l.Seq != "" {
		if c.seen == nil {
			c.seen = map[string]seenFile{}
		}
		c.seen[l.Device] = seenFile{l.Seq, id}
	}
	return id, nil
}

// forget drops the devices not in loops: detached, or removed.
func (c *loopFiles) forget(loops []host.Device) {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := make(map[string]bool, len(loops))
	for _, l := range loops {
		live[l.Device] = true
	}
	for dev := range c.seen {
		if !live[dev] {
			delete(c.seen, dev)
		}
	}
}

// own returns loops with the devices of dir's files named by their path in
// dir (found by ResolveBacking's rule where the kernel names another), and
// without the devices whose path in dir is not the file they are attached
// to: another mount namespace's file under the same path. Devices of files
// outside dir are left as they are. loops need not be every device: the
// caller forgets those detached (forget) after a listing of all.
func (c *loopFiles) own(loops []host.Device, dir string) []host.Device {
	dir = filepath.Clean(dir)
	out := loops[:0]
	for _, l := range loops {
		if !strings.HasPrefix(l.BackingFile, dir+"/") {
			if path, ok := resolve(l, dir, c.of); ok {
				l.BackingFile = path
				var st unix.Stat_t
				if unix.Stat(path, &st) == nil {
					l.BackingSize, l.BackingAllocated = st.Size, st.Blocks*512
				}
			}
			out = append(out, l)
			continue
		}
		id, err := c.of(l)
		if err != nil {
			continue // detached meanwhile
		}
		var st unix.Stat_t
		switch err := unix.Stat(l.BackingFile, &st); {
		case err == nil && (st.Dev != id.dev || st.Ino != id.ino):
			continue // another namespace's file under this path
		case err != nil && !sameFilesystem(dir, id.dev):
			continue // gone here, and never on this filesystem
		}
		out = append(out, l)
	}
	return out
}

// sameFilesystem reports whether dir lies on the filesystem of device
// number dev: a deleted image (its device reads "<path> (deleted)") can
// only be told by that.
func sameFilesystem(dir string, dev uint64) bool {
	var st unix.Stat_t
	return unix.Stat(dir, &st) == nil && st.Dev == dev
}

// ResolveBacking returns the path beneath dir of the file backing l when
// the kernel names that file by a path outside dir: the longest run of
// l's last path components that, joined to dir, is a file with the device
// and inode numbers l reports. A path already beneath dir, or a device
// that is no longer attached, is returned as it is, with false; so is a
// file that is not in dir.
func ResolveBacking(l host.Device, dir string) (string, bool) {
	dir = filepath.Clean(dir)
	if l.BackingFile == "" || strings.HasPrefix(l.BackingFile, dir+"/") {
		return l.BackingFile, false
	}
	return resolve(l, dir, func(l host.Device) (fileID, error) {
		dev, ino, err := loopBacking(l.Device)
		return fileID{dev, ino}, err
	})
}

// resolve is ResolveBacking, asking of what l is attached to.
func resolve(l host.Device, dir string, of func(host.Device) (fileID, error)) (string, bool) {
	parts := strings.Split(strings.TrimPrefix(l.BackingFile, "/"), "/")
	var id fileID
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
			if id, err = of(l); err != nil {
				return l.BackingFile, false
			}
		}
		if st.Dev == id.dev && st.Ino == id.ino {
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

package runs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
)

// A node of a run that reboots as after a power loss (the e2e suite's
// kubeNode.reboot) loses, beside its processes and their mounts, what the
// machine's kernel held for it: its loop devices (NodeLoops, DetachLoops)
// and its cgroups (ThawCgroups, RemoveCgroups). What a real machine keeps
// on its disks stays: the files behind those loop devices, and the
// filesystems of its pools and data directory, whose own loop devices
// (the node's disks) are the host's and are never the node's to lose.

// NodeStorage says where a node keeps the files its loop devices are
// attached to.
type NodeStorage struct {
	// Dirs are the directories the node's images lie in (its data
	// directory and its pools' root, as the host sees them): a loop
	// device attached to a file in one of them is the node's. "" and "/"
	// are ignored.
	Dirs []string
	// Roots are the directories a backing file's name may be relative
	// to once the mount namespace that attached it is gone: the kernel
	// then names the file from the root of the mount it was opened
	// through (csi-node's hostPath of the state directory, a pool's
	// filesystem). Each name is found in them by the file's device and
	// inode numbers (devices.ResolveBacking).
	Roots []string
	// Filesystems are those of Dirs that are filesystems of their own (a
	// pool's, as LoopFilesystems lists them): a loop device attached to
	// any file on one of them is the node's, even a file deleted since,
	// which no name finds.
	Filesystems []string
}

// loopFile is an attached loop device as pickLoops sees it.
type loopFile struct {
	device string // its node, /dev/loopN
	file   string // the file it is attached to, by its path here when found
	fs     uint64 // the device number of the filesystem file is on
	// holds is the loop device that file is, when the file is a device
	// (the kubelet holds a raw block volume's device with a loop device of
	// its own), or "major:minor" for a device that is not a listed loop
	// device; "" for a regular file.
	holds string
}

// NodeLoops maps each attached loop device of the node that s describes
// to its backing file, and each loop device that holds one of those (at
// any depth) to "holds <device>". A node with none is an empty map.
func NodeLoops(s NodeStorage) map[string]string {
	var fss []uint64
	for _, d := range s.Filesystems {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil {
			fss = append(fss, st.Dev)
		}
	}
	return pickLoops(loopFiles(listLoops(), s), s.Dirs, fss)
}

// loopFiles reads of each of loops what pickLoops needs: its backing
// file found in s, the filesystem that file is on, and the device the
// file is, if it is one. A device that goes meanwhile is left out.
func loopFiles(loops []host.Device, s NodeStorage) []loopFile {
	byNum := map[host.DevNum]string{}
	for _, l := range loops {
		byNum[l.Dev] = l.Device
	}
	var out []loopFile
	for _, l := range loops {
		info, err := loopStatus(l.Device)
		if err != nil {
			continue // detached meanwhile
		}
		lf := loopFile{device: l.Device, file: resolveIn(l, s), fs: info.Device}
		if info.Rdevice != 0 {
			num := host.DevNum{Major: unix.Major(info.Rdevice), Minor: unix.Minor(info.Rdevice)}
			if lf.holds = byNum[num]; lf.holds == "" {
				lf.holds = fmt.Sprintf("%d:%d", num.Major, num.Minor)
			}
		}
		out = append(out, lf)
	}
	return out
}

// resolveIn is l's backing file by its path here: the kernel's name when
// it lies in one of s.Dirs, else the file found in one of s.Roots, else
// the kernel's name.
func resolveIn(l host.Device, s NodeStorage) string {
	for _, d := range s.Dirs {
		if inDir(l.BackingFile, d) {
			return l.BackingFile
		}
	}
	for _, r := range s.Roots {
		if path, ok := devices.ResolveBacking(l, r); ok {
			return path
		}
	}
	return l.BackingFile
}

// loopStatus is the kernel's status of the loop device dev: the device
// and inode numbers of its backing file, and that file's own device
// number when it is a device.
func loopStatus(dev string) (*unix.LoopInfo64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return unix.IoctlLoopGetStatus64(int(f.Fd()))
}

// pickLoops picks of loops those attached to a regular file that lies in
// one of dirs or on one of the filesystems fss (device numbers), each
// mapped to its file, and then those that hold a picked one, at any
// depth, each mapped to "holds <device>". A loop device attached to a
// device is picked only as a holder: the node's disks (the loop devices
// of its pools' filesystems) lie outside dirs, and a loop device holding
// one is not the node's either.
func pickLoops(loops []loopFile, dirs []string, fss []uint64) map[string]string {
	out := map[string]string{}
	for _, l := range loops {
		if l.holds != "" {
			continue
		}
		in := slices.ContainsFunc(dirs, func(d string) bool { return inDir(l.file, d) })
		if in || slices.Contains(fss, l.fs) {
			out[l.device] = l.file
		}
	}
	for more := true; more; {
		more = false
		for _, l := range loops {
			_, picked := out[l.device]
			if _, held := out[l.holds]; !picked && l.holds != "" && held {
				out[l.device] = "holds " + l.holds
				more = true
			}
		}
	}
	return out
}

// inDir says whether path lies below dir; never for a dir of "" or "/",
// which would take every path.
func inDir(path, dir string) bool {
	dir = strings.TrimSuffix(dir, "/")
	return dir != "" && strings.HasPrefix(path, dir+"/")
}

// DetachLoops detaches the loop devices loops lists (device to backing
// file, as NodeLoops lists them), holders first, and waits up to timeout
// until none is still attached to the file it was attached to when
// DetachLoops was called: a device that a mount still holds (one of a
// mount namespace that is going) goes at its last close. A device
// attached since to another file is left alone. The error names each
// device still attached then. No loops is a no-op.
func DetachLoops(loops map[string]string, timeout time.Duration) error {
	var notes []string
	detachLoops(loops, identities(loops), timeout, func(format string, args ...any) {
		notes = append(notes, fmt.Sprintf(format, args...))
	})
	if len(notes) > 0 {
		return errors.New(strings.Join(notes, "; "))
	}
	return nil
}

// nodeCgroups are the cgroups at the cgroup root root of a node's kubelet
// (CgroupRoot), one in each hierarchy that has it; none for a root that is
// not a run's, which would name cgroups of the machine's.
func nodeCgroups(root string) []string {
	name, ok := strings.CutPrefix(root, "/")
	if !ok || !strings.HasPrefix(name, prefix) || strings.Contains(name, "/") || strings.Contains(name, "..") {
		return nil
	}
	var out []string
	for _, h := range hierarchies() {
		if cg := filepath.Join(h, name); exists(cg) {
			out = append(out, cg)
		}
	}
	return out
}

// FreezeCgroups stops every process at or under the node's cgroup root
// root (CgroupRoot), its pods' (csi-node's and their writers'), as a power
// loss stops them, and returns once none runs; timeout bounds the wait,
// and unblock (when not nil) is called every second of it, to end what a
// process may wait for that only a process stopped already would end. A
// root that is not a run's is an error; one whose processes do not all
// stop within timeout is ErrNotStopped, and is thawed again (the error
// names any cgroup that stayed frozen). ThawCgroups lets them go on.
func FreezeCgroups(root string, timeout time.Duration, unblock func()) error {
	return freeze(nodeCgroups(root), timeout, unblock)
}

// ThawCgroups thaws every frozen cgroup at or under the node's cgroup
// root root (CgroupRoot), so that its processes can die: a frozen process
// outlives SIGKILL and its PID namespace's end. It returns the cgroups
// still frozen. A root with none frozen, or that is not a run's, is a
// no-op.
func ThawCgroups(root string) []string {
	return thaw(nodeCgroups(root))
}

// RemoveCgroups removes the cgroups at or under the node's cgroup root
// root (CgroupRoot), root included, in every hierarchy, once their
// processes have died, as a machine that starts again has none of them;
// the kubelet must find its root made again before it starts. It returns
// what it could not remove. A root that is gone, or that is not a run's,
// is a no-op.
func RemoveCgroups(root string) []string {
	var notes []string
	removeCgroups(nodeCgroups(root), func(format string, args ...any) {
		notes = append(notes, fmt.Sprintf(format, args...))
	})
	return notes
}

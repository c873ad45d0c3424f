package devices

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FilesystemOf returns the number of the device whose filesystem holds
// dir: two directories of one filesystem have the same.
func FilesystemOf(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, err
	}
	return st.Dev, nil
}

// FilesystemHolding is FilesystemOf for a path that may not exist yet:
// the filesystem of its nearest existing ancestor, on which it would be
// made (a kubelet directory that the kubelet has not made yet).
func FilesystemHolding(path string) (uint64, error) {
	for {
		dev, err := FilesystemOf(path)
		if !errors.Is(err, os.ErrNotExist) || path == filepath.Dir(path) {
			if err != nil {
				return 0, fmt.Errorf("stat %s: %w", path, err)
			}
			return dev, nil
		}
		path = filepath.Dir(path)
	}
}

// Filesystem magic numbers (statfs f_type) of what a pool is likely on.
var fsMagics = map[int64]string{
	unix.EXT4_SUPER_MAGIC:      "ext4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlay",
}

// ProbeFilesystem finds out what dir's filesystem is (its type, from
// statfs; "0x<magic>" for one not known here) and whether it punches holes
// in a file (a real fallocate(PUNCH_HOLE) on a file of its own, which a
// thin volume's discards need to give space back).
func ProbeFilesystem(dir string) (fsType string, punchesHoles bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	fsType, ok := fsMagics[int64(st.Type)]
	if !ok {
		fsType = fmt.Sprintf("0x%x", st.Type)
	}
	f, err := os.CreateTemp(dir, tempPrefix+"probe-")
	if err != nil {
		return fsType, false, fmt.Errorf("probing whether %s punches holes: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(make([]byte, 8192)); err != nil {
		return fsType, false, fmt.Errorf("probing whether %s punches holes: %w", dir, err)
	}
	switch err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); {
	case err == nil:
		return fsType, true, nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return fsType, false, nil
	default:
		return fsType, false, fmt.Errorf("probing whether %s punches holes: %w", dir, err)
	}
}

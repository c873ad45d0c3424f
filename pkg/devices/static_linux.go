package devices

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// StaticDevices resolves the existing block devices of static volumes,
// named by stable paths (such as /dev/disk/by-id entries) inside allowed
// prefixes.
type StaticDevices struct {
	// Prefixes are the directories a device path must lie in.
	Prefixes []string
	// SysDevBlock is /sys/dev/block, where identities are read.
	SysDevBlock string
}

// Resolve follows the stable path (symlinks are what such paths are made
// of) to a block device node under /dev. A missing path is an error matching
// os.ErrNotExist; a path outside the prefixes is ErrOutsideRoots; anything
// but a block device node at the end is an error. The device is returned
// as a host.Device whose BackingFile is empty and whose size does not change
// on its own.
func (s StaticDevices) Resolve(path string) (host.Device, error) {
	if _, _, err := host.Beneath(path, s.Prefixes); err != nil {
		return host.Device{}, fmt.Errorf("%w: %v", ErrOutsideRoots, err)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return host.Device{}, fmt.Errorf("resolving %s: %w", path, err)
	}
	if !strings.HasPrefix(real, "/dev/") {
		return host.Device{}, fmt.Errorf("%s resolves to %s, which is not under /dev", path, real)
	}
	var st unix.Stat_t
	if err := unix.Stat(real, &st); err != nil {
		return host.Device{}, fmt.Errorf("stat %s: %w", real, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return host.Device{}, fmt.Errorf("%s resolves to %s, which is not a block device", path, real)
	}
	dev := host.DevNum{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}
	sectors, err := os.ReadFile(filepath.Join(s.sysDir(dev), "size"))
	if err != nil {
		return host.Device{}, fmt.Errorf("reading the size of %s: %w", real, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(sectors)), 10, 64)
	if err != nil {
		return host.Device{}, fmt.Errorf("reading the size of %s: %w", real, err)
	}
	return host.Device{Device: real, Dev: dev, Size: n * 512, BackingSize: n * 512}, nil
}

func (s StaticDevices) sysDir(dev host.DevNum) string {
	return filepath.Join(s.SysDevBlock, fmt.Sprintf("%d:%d", dev.Major, dev.Minor))
}

// Identity returns what identifies the device whatever path it appears
// under: its WWID or serial number, or for a loop device its backing file.
// It is "" when the device offers none.
func (s StaticDevices) Identity(l host.Device) (string, error) {
	dir := s.sysDir(l.Dev)
	for _, c := range []struct{ file, kind string }{
		{"wwid", "wwid"}, {"device/wwid", "wwid"}, {"device/serial", "serial"}, {"serial", "serial"}, {"loop/backing_file", "loop"},
	} {
		b, err := os.ReadFile(filepath.Join(dir, c.file))
		if err != nil {
			continue
		}
		if v := strings.TrimSpace(string(b)); v != "" {
			return c.kind + ":" + v, nil
		}
	}
	return "", nil
}

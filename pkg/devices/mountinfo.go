package devices

import (
	"slices"
	"strconv"
	"strings"

	"k8s.io/mount-utils"

	"github.com/converge-csi/converge/pkg/host"
)

// ReadMounts parses a mountinfo file (normally /proc/self/mountinfo) once.
func ReadMounts(path string) ([]host.Mount, error) {
	infos, err := mount.ParseMountInfo(path)
	if err != nil {
		return nil, err
	}
	out := make([]host.Mount, 0, len(infos))
	for _, mi := range infos {
		out = append(out, host.Mount{
			ID:       mi.ID,
			Path:     unescapeOctal(mi.MountPoint),
			Dev:      host.DevNum{Major: uint32(mi.Major), Minor: uint32(mi.Minor)},
			Root:     unescapeOctal(mi.Root),
			Source:   unescapeOctal(mi.Source),
			FsType:   mi.FsType,
			ReadOnly: slices.Contains(mi.MountOptions, "ro"),
			// Per-superblock state: "ro" (or "emergency_ro" since Linux
			// 6.x) after errors=remount-ro fired, "shutdown" (ext4) once
			// every I/O fails.
			SuperReadOnly: slices.Contains(mi.SuperOptions, "ro") || slices.Contains(mi.SuperOptions, "emergency_ro"),
			Shutdown:      slices.Contains(mi.SuperOptions, "shutdown"),
		})
	}
	return out, nil
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline and
// backslash in mountinfo fields.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

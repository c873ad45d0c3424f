package contract

import (
	"fmt"
	"slices"
	"strings"
)

// mountFlagPolicy lists the mount options a request may carry. Options with
// a value name it "key=". Everything else is refused: in particular bind,
// rbind, remount, move, loop and helper options, and anything that names
// another device or path. See SECURITY.md and docs/architecture.md's "Input policy".
var mountFlagPolicy = map[string]struct{}{
	"ro": {}, "rw": {}, "sync": {}, "async": {}, "dirsync": {},
	"noexec": {}, "exec": {}, "nosuid": {}, "suid": {}, "nodev": {}, "dev": {},
	"noatime": {}, "atime": {}, "relatime": {}, "norelatime": {}, "strictatime": {},
	"nodiratime": {}, "diratime": {}, "lazytime": {}, "nolazytime": {},
	"discard": {}, "nodiscard": {}, "acl": {}, "noacl": {},
	"user_xattr": {}, "nouser_xattr": {}, "barrier": {}, "nobarrier": {},
	"nouuid": {}, "inode64": {}, "largeio": {}, "nolargeio": {},
	"usrquota": {}, "grpquota": {}, "prjquota": {}, "uquota": {}, "gquota": {}, "pquota": {},
	"errors=": {}, "data=": {}, "commit=": {}, "allocsize=": {}, "logbufs=": {},
	"context=": {}, "fscontext=": {}, "defcontext=": {}, "rootcontext=": {},
}

// AllowedMountFlags returns the mount flag policy's entries, sorted; an
// option with a value is named "key=".
func AllowedMountFlags() []string {
	out := make([]string, 0, len(mountFlagPolicy))
	for f := range mountFlagPolicy {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

// Bounds of the mount flags of one request: far above any real use, low
// enough that a request cannot make the plugin build huge mount commands.
const (
	maxMountFlags   = 64
	maxMountFlagLen = 256
)

// CheckMountFlags enforces the mount flag policy.
func CheckMountFlags(flags []string) error {
	if len(flags) > maxMountFlags {
		return fmt.Errorf("%d mount flags, at most %d", len(flags), maxMountFlags)
	}
	for _, f := range flags {
		if f == "" {
			return fmt.Errorf("empty mount flag")
		}
		if len(f) > maxMountFlagLen {
			return fmt.Errorf("mount flag of %d bytes, at most %d", len(f), maxMountFlagLen)
		}
		if strings.ContainsAny(f, "\x00\n\r\t ") {
			return fmt.Errorf("mount flag %q holds a control or space character", f)
		}
		key, value, hasValue := strings.Cut(f, "=")
		if hasValue {
			key += "="
		}
		if _, ok := mountFlagPolicy[key]; !ok {
			return fmt.Errorf("mount flag %q is not allowed", f)
		}
		if strings.HasSuffix(key, "context=") {
			// An SELinux label may hold commas (categories) inside quotes.
			quoted := len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' &&
				!strings.Contains(value[1:len(value)-1], `"`)
			if strings.ContainsAny(value, ",\"") && !quoted {
				return fmt.Errorf("mount flag %q: a label with commas must be quoted", f)
			}
			continue
		}
		if strings.ContainsAny(value, "/,\"") {
			return fmt.Errorf("mount flag %q must not name a path or hold a comma", f)
		}
	}
	return nil
}

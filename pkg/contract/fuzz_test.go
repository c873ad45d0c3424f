package contract

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzCheckMountFlags checks the mount flag policy: an accepted flag is on
// the allow-list, holds no separator a mount command would split it at
// (outside a quoted SELinux label), and names no path.
func FuzzCheckMountFlags(f *testing.F) {
	for _, s := range []string{"ro", "noatime", "bind", "ro,bind", "data=/dev/sda", "errors=remount-ro", `context="a:b:c:s0:c1,c2"`,
		`context="a"b"`, "context=a,b", "noatime\nbind", "x-mount.mkdir", "loop", "helper=x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, flag string) {
		if CheckMountFlags([]string{flag}) != nil {
			return
		}
		key, value, _ := strings.Cut(flag, "=")
		if strings.ContainsAny(flag, "\x00\n\r\t ") {
			t.Fatalf("accepted %q with a control character or space", flag)
		}
		if strings.HasSuffix(key, "context") {
			if strings.Contains(value, ",") && !(strings.HasPrefix(value, `"`) && strings.HasSuffix(value, `"`) && strings.Count(value, `"`) == 2) {
				t.Fatalf("accepted %q: comma outside a quoted label", flag)
			}
			return
		}
		if strings.ContainsAny(flag, ",/\"") {
			t.Fatalf("accepted %q: separator or path", flag)
		}
		for _, bad := range []string{"bind", "rbind", "remount", "move", "loop", "helper", "x-"} {
			if key == bad || strings.HasPrefix(key, "x-") {
				t.Fatalf("accepted %q", flag)
			}
		}
	})
}

// FuzzCheckMkfsOptions checks the mkfs option policy: whatever it accepts
// is pairs of an allowed flag and a value that names no path and holds no
// shell or separator character.
func FuzzCheckMkfsOptions(f *testing.F) {
	f.Add("ext4", "-b 4096 -i 8192")
	f.Add("xfs", "-m reflink=1")
	f.Add("ext4", "-J device=/dev/sda")
	f.Add("btrfs", "-n 16384 -F x")
	f.Fuzz(func(t *testing.T, fsType, value string) {
		args, err := CheckMkfsOptions(fsType, value)
		if err != nil {
			return
		}
		if len(args)%2 != 0 {
			t.Fatalf("%q: odd arguments %q", value, args)
		}
		if fsType == "" {
			fsType = "ext4"
		}
		for i := 0; i < len(args); i += 2 {
			if !mkfsPolicy[fsType][args[i]] {
				t.Fatalf("%q: flag %q accepted for %s", value, args[i], fsType)
			}
			if strings.ContainsAny(args[i+1], "/ ;$`|&<>\\\"'\x00\n") || strings.HasPrefix(args[i+1], "-") {
				t.Fatalf("%q: value %q accepted", value, args[i+1])
			}
		}
	})
}

// FuzzValidID checks that an accepted ID can only name a plain file in the
// data directory.
func FuzzValidID(f *testing.F) {
	for _, s := range []string{"vol-1", "", ".", "..", "../x", "a/b", "a\x00", strings.Repeat("a", 129), "pvc-1234.img", "-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ValidID(id) != nil {
			return
		}
		if len(id) == 0 || len(id) > MaxIDLength || strings.ContainsAny(id, "/\x00") || id[0] == '.' {
			t.Fatalf("accepted %q", id)
		}
		if p := filepath.Join("/data", id+".img"); filepath.Dir(p) != "/data" {
			t.Fatalf("ID %q leaves the data directory: %s", id, p)
		}
	})
}

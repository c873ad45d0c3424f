package devices

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"

	"github.com/converge-csi/converge/pkg/host"
)

// FuzzUnescapeOctal checks that the mountinfo unescaping inverts the
// kernel's escaping of space, tab, newline and backslash.
func FuzzUnescapeOctal(f *testing.F) {
	for _, s := range []string{"/a b", "/a\tb\nc\\d", `/a\040b`, "/plain", "\\"} {
		f.Add(s)
	}
	escape := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			if c := s[i]; strings.IndexByte(" \t\n\\", c) >= 0 {
				fmt.Fprintf(&b, "\\%03o", c)
			} else {
				b.WriteByte(c)
			}
		}
		return b.String()
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got := unescapeOctal(escape(s)); got != s {
			t.Fatalf("unescape(escape(%q)) = %q", s, got)
		}
	})
}

// FuzzReadMounts feeds arbitrary mountinfo contents to the parser and to
// mount-utils' ParseMountInfo, which it replaces in every pass: both must
// refuse the same contents, and what both parse must be the same mounts
// (no panic, never more mounts than lines).
func FuzzReadMounts(f *testing.F) {
	f.Add("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n")
	f.Add("42 27 7:0 / /tmp/a\\040b rw,relatime - ext4 /dev/loop0 rw,shutdown\n")
	f.Add("43 27 7:1 / /t ro shared:3 master:2 - xfs /dev/loop1 emergency_ro,context=\"a,ro\"\n")
	f.Add("1 2 3:4 / / rw - - - -\n")
	f.Add("1 2 3:4:5 / / rw - - - -\n")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, content string) {
		p := filepath.Join(t.TempDir(), "mountinfo")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		mounts, err := ReadMounts(p)
		infos, utilErr := mount.ParseMountInfo(p)
		if (err == nil) != (utilErr == nil) {
			t.Fatalf("ReadMounts: %v; mount-utils: %v", err, utilErr)
		}
		if err != nil {
			return
		}
		if lines := strings.Count(content, "\n") + 1; len(mounts) > lines {
			t.Fatalf("%d mounts from %d lines", len(mounts), lines)
		}
		want := make([]host.Mount, 0, len(infos))
		for _, mi := range infos {
			want = append(want, host.Mount{
				ID:            mi.ID,
				Path:          unescapeOctal(mi.MountPoint),
				Dev:           host.DevNum{Major: uint32(mi.Major), Minor: uint32(mi.Minor)},
				Root:          unescapeOctal(mi.Root),
				Source:        unescapeOctal(mi.Source),
				FsType:        mi.FsType,
				ReadOnly:      slices.Contains(mi.MountOptions, "ro"),
				SuperReadOnly: slices.Contains(mi.SuperOptions, "ro") || slices.Contains(mi.SuperOptions, "emergency_ro"),
				Shutdown:      slices.Contains(mi.SuperOptions, "shutdown"),
			})
		}
		if !reflect.DeepEqual(mounts, want) {
			t.Fatalf("got %+v, mount-utils parses %+v", mounts, want)
		}
	})
}

// FuzzPathsOpen resolves arbitrary relative paths beneath a root that holds
// a symlink to outside and a symlink loop: whatever resolves must be the
// root or inside it, never outside, and never through a symlink.
func FuzzPathsOpen(f *testing.F) {
	base := f.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root + "/a/b", outside + "/secret"} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink(outside, root+"/a/out"); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("../a", root+"/a/b/up"); err != nil {
		f.Fatal(err)
	}
	p := NewPaths([]string{root})
	for _, s := range []string{"a", "a/b", "a/out", "a/out/secret", "a/b/up/b", "a/../..", "a/b/../../../outside"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		fd, err := p.open(root+"/"+rel, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		got, err := os.Readlink(fdPath(fd))
		if err != nil {
			t.Fatal(err)
		}
		if got != root && !strings.HasPrefix(got, root+"/") {
			t.Fatalf("%q resolved to %s, outside %s", rel, got, root)
		}
		if strings.Contains(got, "outside") {
			t.Fatalf("%q resolved through a symlink to %s", rel, got)
		}
	})
}

// FuzzParseV1Throttle feeds arbitrary contents to the parser of cgroup
// v1's throttle files: it must not panic, and the rules it reads, written
// back as the kernel prints them, must read the same.
func FuzzParseV1Throttle(f *testing.F) {
	for _, s := range []string{"", "7:3 200\n", "8:0 1048576\n7:3 1\n", "7:3 0", "7:3 max\n", "7:3 200\n7:3 1\n", "7:", " \n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		rules, err := parseV1Throttle(content)
		if err != nil {
			return
		}
		var b strings.Builder
		for dev, v := range rules {
			b.WriteString(formatV1Throttle(dev, v) + "\n")
		}
		again, err := parseV1Throttle(b.String())
		if err != nil || !maps.Equal(again, rules) {
			t.Fatalf("%q read as %v; written back as %q, read as %v, %v", content, rules, b.String(), again, err)
		}
	})
}

// FuzzParseIOMax feeds arbitrary contents to the parser of cgroup v2's
// io.max: it must not panic, and the rules it reads, written back as
// SetThrottle writes them, must read the same.
func FuzzParseIOMax(f *testing.F) {
	for _, s := range []string{"", "7:3 rbps=max wbps=1048576 riops=200 wiops=max\n", "7:3 riops=1\n8:0 wbps=2",
		"7:3 riops=0\n", "7:3 riops=2 riops=3\n", "7:3 idle=1\n", "7:3\n", "7:3 rbps=18446744073709551615\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		rules, err := parseIOMax(content)
		if err != nil {
			return
		}
		var b strings.Builder
		for dev, l := range rules {
			b.WriteString(formatIOMax(dev, l) + "\n")
		}
		again, err := parseIOMax(b.String())
		if err != nil || !maps.Equal(again, rules) {
			t.Fatalf("%q read as %v; written back as %q, read as %v, %v", content, rules, b.String(), again, err)
		}
	})
}

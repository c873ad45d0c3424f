package state

import (
	"path/filepath"
	"strings"
	"testing"
)

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

// FuzzBeneath checks that an accepted path lies strictly inside the root it
// names, lexically: no dot-dot, no NUL, clean and short enough to resolve.
func FuzzBeneath(f *testing.F) {
	roots := []string{"/var/lib/kubelet", "/var/lib/kubelet/plugins", "/tmp/pods"}
	for _, s := range []string{"/var/lib/kubelet/pods/x/mount", "/var/lib/kubelet", "/var/lib/kubelet/../etc", "/var/lib/kubelet-evil/x",
		"/tmp/pods/./x", "/tmp/pods//x", "relative", "/var/lib/kubelet/x\x00/y", "/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		root, rel, err := Beneath(path, roots)
		if err != nil {
			return
		}
		if filepath.Join(root, rel) != path || rel == "" || filepath.IsAbs(rel) {
			t.Fatalf("%q: root %q rel %q do not make the path", path, root, rel)
		}
		for _, c := range strings.Split(rel, "/") {
			if c == ".." || c == "." || c == "" {
				t.Fatalf("%q: component %q in %q", path, c, rel)
			}
		}
		if strings.ContainsRune(path, 0) || len(path) >= MaxPathLen {
			t.Fatalf("accepted %q", path)
		}
	})
}

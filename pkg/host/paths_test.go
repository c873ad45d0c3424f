package host

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestBeneath(t *testing.T) {
	roots := []string{"/var/lib/kubelet", "/tmp/x"}
	tests := []struct {
		path string
		ok   bool
	}{
		{"/var/lib/kubelet/pods/a", true}, {"/tmp/x/y", true},
		{"/var/lib/kubelet", false}, {"/var/lib/kubeletx/a", false}, {"relative", false},
		{"/var/lib/kubelet/../etc", false}, {"/var/lib/kubelet/a/", false}, {"/etc/passwd", false},
	}
	for _, tc := range tests {
		if _, _, err := Beneath(tc.path, roots); (err == nil) != tc.ok {
			t.Errorf("Beneath(%q): got %v, want ok=%v", tc.path, err, tc.ok)
		}
	}
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

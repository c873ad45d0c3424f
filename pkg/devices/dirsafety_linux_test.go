package devices

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// trustedTempDir returns t.TempDir() for the checks, and skips the test
// when it cannot chown (not root). The temporary directory must be root's
// alone itself (under /tmp, which is sticky: see CheckTrustedDir), or
// every case fails, naming the component that is not.
func trustedTempDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown, and directories owned by root")
	}
	return t.TempDir()
}

func TestCheckTrustedDir(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup makes base/a/pool, or what stands in its place, and
		// returns the component the check must blame ("" for none).
		setup   func(t *testing.T, base string) string
		problem DirProblem
	}{
		{name: "good", setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			return ""
		}},
		{name: "good under a sticky world-writable ancestor", setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o750)
			mustChmod(t, filepath.Join(base, "a"), 0o1777)
			return ""
		}},
		{name: "symlinked ancestor", problem: DirSymlink, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "real", "pool"), 0o700)
			mustSymlink(t, filepath.Join(base, "real"), filepath.Join(base, "a"))
			return filepath.Join(base, "a")
		}},
		{name: "symlinked pool", problem: DirSymlink, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "real"), 0o700)
			mustSymlink(t, "real", filepath.Join(base, "a", "pool"))
			return filepath.Join(base, "a", "pool")
		}},
		{name: "pool not root's", problem: DirOwner, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			mustChown(t, filepath.Join(base, "a", "pool"), 65534)
			return filepath.Join(base, "a", "pool")
		}},
		{name: "ancestor not root's", problem: DirOwner, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			mustChown(t, filepath.Join(base, "a"), 65534)
			return filepath.Join(base, "a")
		}},
		{name: "pool group-writable", problem: DirWritable, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			mustChmod(t, filepath.Join(base, "a", "pool"), 0o770)
			return filepath.Join(base, "a", "pool")
		}},
		{name: "pool world-writable", problem: DirWritable, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			mustChmod(t, filepath.Join(base, "a", "pool"), 0o707)
			return filepath.Join(base, "a", "pool")
		}},
		{name: "pool sticky and world-writable", problem: DirWritable, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			mustChmod(t, filepath.Join(base, "a", "pool"), 0o1777)
			return filepath.Join(base, "a", "pool")
		}},
		{name: "ancestor group-writable", problem: DirWritable, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			mustChmod(t, filepath.Join(base, "a"), 0o775)
			return filepath.Join(base, "a")
		}},
		{name: "ancestor world-writable", problem: DirWritable, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a", "pool"), 0o700)
			mustChmod(t, filepath.Join(base, "a"), 0o777)
			return filepath.Join(base, "a")
		}},
		{name: "pool a file", problem: DirNotDirectory, setup: func(t *testing.T, base string) string {
			mustMkdir(t, filepath.Join(base, "a"), 0o700)
			if err := os.WriteFile(filepath.Join(base, "a", "pool"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(base, "a", "pool")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := trustedTempDir(t)
			blame := tc.setup(t, base)
			dir := filepath.Join(base, "a", "pool")
			err := CheckTrustedDir(dir)
			if blame == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var unsafe *UnsafeDirError
			if !errors.As(err, &unsafe) {
				t.Fatalf("got %v, want an *UnsafeDirError", err)
			}
			if unsafe.Dir != dir || unsafe.Component != blame || unsafe.Problem != tc.problem {
				t.Errorf("got dir %s, component %s, problem %q; want %s, %s, %q", unsafe.Dir, unsafe.Component, unsafe.Problem, dir, blame, tc.problem)
			}
			if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, blame) {
				t.Errorf("got message %q, want one naming %s and %s", msg, dir, blame)
			}
		})
	}
}

// TestUnsafeDirErrorFix checks that each problem's message says how to
// fix it.
func TestUnsafeDirErrorFix(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  UnsafeDirError
		want []string
	}{
		{"symlink", UnsafeDirError{Dir: "/p/q", Component: "/p", Problem: DirSymlink}, []string{"/p/q is not safe", "/p is a symlink", "readlink -f /p"}},
		{"owner", UnsafeDirError{Dir: "/p/q", Component: "/p/q", Problem: DirOwner, UID: 65534}, []string{"uid 65534", "chown root /p/q"}},
		{"group-writable", UnsafeDirError{Dir: "/p/q", Component: "/p", Problem: DirWritable, Mode: 0o775}, []string{"its group (mode 0775)", "chmod go-w /p"}},
		{"all-writable", UnsafeDirError{Dir: "/p/q", Component: "/p", Problem: DirWritable, Mode: 0o777}, []string{"its group and others (mode 0777)"}},
		{"others-writable", UnsafeDirError{Dir: "/p/q", Component: "/p", Problem: DirWritable, Mode: 0o1707}, []string{"others (mode 1707)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := tc.err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("got %q, want it to contain %q", msg, w)
				}
			}
		})
	}
}

func TestCheckTrustedDirMissing(t *testing.T) {
	base := trustedTempDir(t)
	dir := filepath.Join(base, "absent", "pool")
	if err := CheckTrustedDir(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("got %v, want fs.ErrNotExist", err)
	}
	if _, err := os.Stat(filepath.Join(base, "absent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CheckTrustedDir made %s: %v", filepath.Join(base, "absent"), err)
	}
	if err := CheckTrustedDir("relative/pool"); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("a relative path: got %v, want an error naming absolute", err)
	}
}

func TestMakeTrustedDir(t *testing.T) {
	base := trustedTempDir(t)
	dir := filepath.Join(base, "state", "volumes")
	if err := MakeTrustedDir(dir); err != nil {
		t.Fatalf("got %v, want nil", err)
	}
	for _, d := range []string{filepath.Join(base, "state"), dir} {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: got %v, %v; want a directory of mode 0700", d, fi, err)
		}
	}
	if err := MakeTrustedDir(dir); err != nil {
		t.Errorf("again: got %v, want nil", err)
	}

	// Nothing is made beneath a component that fails.
	open := filepath.Join(base, "open")
	mustMkdir(t, open, 0o700)
	mustChmod(t, open, 0o777)
	err := MakeTrustedDir(filepath.Join(open, "volumes"))
	var unsafe *UnsafeDirError
	if !errors.As(err, &unsafe) || unsafe.Component != open {
		t.Errorf("got %v, want an *UnsafeDirError for %s", err, open)
	}
	if _, err := os.Lstat(filepath.Join(open, "volumes")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("made beneath a world-writable directory: %v", err)
	}
}

func mustMkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
}

// mustChmod sets mode exactly, the umask aside.
func mustChmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	m := mode.Perm()
	if mode&0o1000 != 0 {
		m |= os.ModeSticky
	}
	if err := os.Chmod(path, m); err != nil {
		t.Fatal(err)
	}
}

func mustChown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Chown(path, uid, -1); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

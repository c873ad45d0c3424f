package devices

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// mountinfoLine is one mountinfo line of a tmpfs at path.
func mountinfoLine(id int, path string) string {
	return fmt.Sprintf("%d 1 0:%d / %s rw - tmpfs tmpfs rw\n", 100+id, 40+id, path)
}

// A regular file never signals POLLPRI, so only the age decides when a
// reused table is parsed again: the clock is the test's.
func TestMountTableReusedUntilMaxAge(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mountinfo")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(1000, 0)
	o := &Observer{MountInfo: file, MountTableMaxAge: 5 * time.Second, Now: func() time.Time { return now }}
	defer o.Close()
	paths := func() []string {
		t.Helper()
		ms, err := o.mountTable()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.Path)
		}
		return out
	}

	write(mountinfoLine(1, "/a"))
	if got := paths(); len(got) != 1 || got[0] != "/a" {
		t.Fatalf("first parse: got %v, want [/a]", got)
	}
	write(mountinfoLine(1, "/a") + mountinfoLine(2, "/b"))
	now = now.Add(4 * time.Second)
	if got := paths(); len(got) != 1 {
		t.Fatalf("within the age: got %v, want the reused [/a]", got)
	}
	now = now.Add(time.Second)
	if got := paths(); len(got) != 2 {
		t.Fatalf("at the age: got %v, want [/a /b] parsed anew", got)
	}

	// A caller changing what it got does not change the reused table.
	ms, _ := o.mountTable()
	ms[0].Path = "/changed"
	if got := paths(); got[0] != "/a" {
		t.Fatalf("the reused table was changed through a returned copy: %v", got)
	}

	// Zero age parses on every call.
	o.MountTableMaxAge = 0
	write(mountinfoLine(3, "/c"))
	if got := paths(); len(got) != 1 || got[0] != "/c" {
		t.Fatalf("without an age: got %v, want [/c]", got)
	}
}

// On the real mount table, a mount or unmount is seen at once however long
// the reuse may last: the kernel reports it on the polled descriptor.
func TestMountTableSeesChangesAtOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	o := &Observer{MountInfo: "/proc/self/mountinfo", MountTableMaxAge: time.Hour}
	defer o.Close()
	dir := t.TempDir()
	mounted := func() bool {
		t.Helper()
		ms, err := o.mountTable()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Path == dir {
				return true
			}
		}
		return false
	}
	if mounted() {
		t.Fatalf("%s mounted before the test mounted it", dir)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	if !mounted() {
		t.Fatalf("the mount of %s was not seen: the table was reused", dir)
	}
	if !mounted() {
		t.Fatalf("the mount of %s was lost on reuse", dir)
	}
	if err := syscall.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if mounted() {
		t.Fatalf("the unmount of %s was not seen: the table was reused", dir)
	}
}

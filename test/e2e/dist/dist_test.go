package dist

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Verify passes the sums writeSums wrote and fails a file changed since,
// a file missing, a line that names a path, and an empty list.
func TestVerify(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a.tgz", "b.oci.tar"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSums(dir, []string{"a.tgz", "b.oci.tar"}); err != nil {
		t.Fatal(err)
	}
	if err := Verify(dir); err != nil {
		t.Fatalf("the sums just written: %v", err)
	}
	sums, _ := os.ReadFile(filepath.Join(dir, Sums))
	cases := map[string]func(){
		"changed": func() { os.WriteFile(filepath.Join(dir, "a.tgz"), []byte("A"), 0o644) },
		"missing": func() { os.Remove(filepath.Join(dir, "b.oci.tar")) },
		"path": func() {
			os.WriteFile(filepath.Join(dir, Sums), []byte(strings.Replace(string(sums), "  a.tgz", "  ../a.tgz", 1)), 0o644)
		},
		"empty": func() { os.WriteFile(filepath.Join(dir, Sums), nil, 0o644) },
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			for _, n := range []string{"a.tgz", "b.oci.tar"} {
				os.WriteFile(filepath.Join(dir, n), []byte(n), 0o644)
			}
			os.WriteFile(filepath.Join(dir, Sums), sums, 0o644)
			spoil()
			if err := Verify(dir); err == nil {
				t.Error("Verify passed")
			} else {
				t.Log(err)
			}
		})
	}
}

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

// FuzzScanLog reads arbitrary bytes as a log (what a crash, a bad disk or
// a stale file can leave): it never panics nor reads past the data, and
// what it returns is a chain of intact records numbered one after another,
// which encode back to the bytes they were read from.
func FuzzScanLog(f *testing.F) {
	two := append(encodeRecord(7, "v", []byte(`{"id":"v"}`)), encodeRecord(8, "w", nil)...)
	f.Add(two)
	f.Add(append(two, encodeRecord(3, "old", []byte("{}"))...))
	f.Add(two[:len(two)-1])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, end := scanLog(data)
		if end < 0 || end > int64(len(data)) {
			t.Fatalf("chain ends at %d of %d bytes", end, len(data))
		}
		var off int64
		for i, r := range recs {
			if r.seq == 0 || i > 0 && r.seq != recs[i-1].seq+1 {
				t.Fatalf("record %d numbered %d after %d", i, r.seq, recs[max(i-1, 0)].seq)
			}
			b := encodeRecord(r.seq, r.id, r.value)
			if string(data[off:off+int64(len(b))]) != string(b) {
				t.Fatalf("record %d does not encode back to its bytes", i)
			}
			off += int64(len(b))
		}
		if off != end {
			t.Fatalf("records span %d bytes, chain ends at %d", off, end)
		}
	})
}

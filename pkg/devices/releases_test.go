package devices

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReleaseSnapshotFixtures reads, with the current code, the snapshot
// files each release made: the release fixtures
// (pkg/state/testdata/releases/<tag>/manifest.json, made by
// hack/store-fixtures.sh with that release's csi-node) list each
// snapshot's size and the extended attributes its file carried. A sparse
// file of that size with those attributes must read as a snapshot of the
// volume it was taken of, with the filesystem and the access it was taken
// with, and when.
func TestReleaseSnapshotFixtures(t *testing.T) {
	manifests, err := filepath.Glob(filepath.Join("..", "state", "testdata", "releases", "v*", "manifest.json"))
	if err != nil || len(manifests) == 0 {
		t.Fatalf("no release fixtures in pkg/state/testdata/releases (%v)", err)
	}
	for _, path := range manifests {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Release   string `json:"release"`
			Snapshots []struct {
				ID, Source, FsType, Access string
				Size                       int64
				Xattrs                     map[string]string
			} `json:"snapshots"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(m.Snapshots) == 0 {
			t.Fatalf("%s: no snapshots", path)
		}
		for _, want := range m.Snapshots {
			t.Run(m.Release+"/"+want.ID, func(t *testing.T) {
				s := &Snapshots{Dir: t.TempDir()}
				file := s.Path(want.ID)
				if err := os.WriteFile(file, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(file, want.Size); err != nil {
					t.Fatal(err)
				}
				for name, value := range want.Xattrs {
					if err := unix.Setxattr(file, name, []byte(value), 0); err != nil {
						if errors.Is(err, unix.ENOTSUP) {
							t.Skipf("%s has no user extended attributes", s.Dir)
						}
						t.Fatal(err)
					}
				}
				got, err := s.Get(want.ID)
				if err != nil {
					t.Fatalf("reading the snapshot %s made: %v", m.Release, err)
				}
				if got.ID != want.ID || got.Source != want.Source || got.FsType != want.FsType || got.Access != want.Access || got.Size != want.Size {
					t.Errorf("got %+v, want a snapshot of %s (filesystem %q, access %q) of %d bytes", got, want.Source, want.FsType, want.Access, want.Size)
				}
				if created := got.Created; created.IsZero() || created.Location() != time.UTC {
					t.Errorf("created %v, want the time it was taken", created)
				}
				listed, err := s.List()
				if err != nil || len(listed) != 1 || listed[0].ID != want.ID {
					t.Errorf("listed %+v, %v; want the snapshot", listed, err)
				}
			})
		}
	}
}

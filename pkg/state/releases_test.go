package state

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// fixtureManifest is what a release's csi-node was asked to hold when it
// wrote the store fixtures of testdata/releases/<tag>/ (written by
// test/releases, run by hack/store-fixtures.sh).
type fixtureManifest struct {
	Release string `json:"release"`
	States  []struct {
		Dir     string `json:"dir"`
		Replays bool   `json:"replays"`
	} `json:"states"`
	Volumes []struct {
		ID           string `json:"id"`
		Name         string `json:"name"`
		Pool         string `json:"pool"`
		Provisioning string `json:"provisioning"`
		Access       string `json:"access"`
		Formatted    string `json:"formatted"`
		FsSize       int64  `json:"fsSize"`
		Stage        *struct {
			Path       string `json:"path"`
			Access     string `json:"access"`
			AccessMode string `json:"accessMode"`
		} `json:"stage"`
		Targets          []string `json:"targets"`
		PendingSnapshots []string `json:"pendingSnapshots"`
		ExpandBytes      int64    `json:"expandBytes"`
	} `json:"volumes"`
}

// releaseFixtures returns the directories of testdata/releases, one per
// release, and fails t if there are none.
func releaseFixtures(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join("testdata", "releases", "v*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no release fixtures in testdata/releases (%v)", err)
	}
	return dirs
}

// unpackStore writes the gzipped store of fixture directory dir into a
// fresh directory and returns the path of its state.db: Open writes to
// what it opens, and the fixtures must stay as the release left them.
func unpackStore(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	for _, name := range []string{"state.db", "state.db-wal"} {
		f, err := os.Open(filepath.Join(dir, name+".gz"))
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", f.Name(), err)
		}
		raw, err := io.ReadAll(zr)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", f.Name(), err)
		}
		if err := os.WriteFile(filepath.Join(out, name), raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(out, "state.db")
}

// TestReleaseFixtures opens the store that each release's csi-node left
// (testdata/releases/<tag>/, made by hack/store-fixtures.sh: once after a
// SIGKILL, its log not yet checkpointed into bbolt, once after a clean
// stop) with the current code, and checks that it reads every volume as
// it was asked for: its name, pool, provisioning and access, its
// filesystem and size, its staging with the mount the plugin made, every
// target it is published at, the snapshots asked of it and not yet
// taken, and its expansion. It then closes the store
// and opens it again, as an upgraded node's next restart does, and checks
// the same. The release hack/previous-release names must have fixtures.
func TestReleaseFixtures(t *testing.T) {
	dirs := releaseFixtures(t)
	if prev := previousRelease(t); !slices.Contains(dirs, filepath.Join("testdata", "releases", prev)) {
		t.Errorf("hack/previous-release names %s, which has no store fixtures in testdata/releases: run hack/store-fixtures.sh (docs/releasing.md)", prev)
	}
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		var m fixtureManifest
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		if m.Release != filepath.Base(dir) || len(m.States) == 0 || len(m.Volumes) == 0 {
			t.Fatalf("%s: manifest of release %q with %d states and %d volumes; want its own release, states and volumes", dir, m.Release, len(m.States), len(m.Volumes))
		}
		for _, st := range m.States {
			t.Run(m.Release+"/"+st.Dir, func(t *testing.T) {
				path := unpackStore(t, filepath.Join(dir, st.Dir))
				s, err := OpenWith(path, Options{Release: "v0.0.0-test"})
				if err != nil {
					t.Fatalf("opening the store %s left: %v", m.Release, err)
				}
				if got := s.Replayed(); (got > 0) != st.Replays {
					t.Errorf("replayed %d log records; want some: %v", got, st.Replays)
				}
				checkFixture(t, m, s.List())
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s, err = Open(path)
				if err != nil {
					t.Fatalf("opening it again after the current code closed it: %v", err)
				}
				defer s.Close()
				if got := s.Replayed(); got != 0 {
					t.Errorf("replayed %d records after a clean close, want 0", got)
				}
				checkFixture(t, m, s.List())
			})
		}
	}
}

// checkFixture compares the records read with the volumes of m.
func checkFixture(t *testing.T, m fixtureManifest, got []*Volume) {
	t.Helper()
	var ids []string
	for _, v := range got {
		ids = append(ids, v.ID)
	}
	var want []string
	for _, w := range m.Volumes {
		want = append(want, w.ID)
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("volumes %v, want %v", ids, want)
	}
	for i, w := range m.Volumes {
		v := got[i]
		if v.Name != w.Name || v.Pool != w.Pool || string(v.Provisioning) != w.Provisioning || string(v.Access) != w.Access {
			t.Errorf("%s: name %q, pool %q, provisioning %q, access %q; want %q, %q, %q, %q", w.ID,
				v.Name, v.Pool, v.Provisioning, v.Access, w.Name, w.Pool, w.Provisioning, w.Access)
		}
		if v.Formatted != w.Formatted || v.FsSize != w.FsSize {
			t.Errorf("%s: formatted %q of %d bytes, want %q of %d", w.ID, v.Formatted, v.FsSize, w.Formatted, w.FsSize)
		}
		if v.Generation <= 0 || v.Changed.IsZero() || v.Removing || v.Frozen != "" {
			t.Errorf("%s: generation %d, changed %v, removing %v, frozen %q; want a live record", w.ID, v.Generation, v.Changed, v.Removing, v.Frozen)
		}
		switch {
		case w.Stage == nil && v.Stage != nil:
			t.Errorf("%s: staged at %s, want not staged", w.ID, v.Stage.Path)
		case w.Stage != nil && v.Stage == nil:
			t.Errorf("%s: not staged, want staged at %s", w.ID, w.Stage.Path)
		case w.Stage != nil:
			st := v.Stage
			if st.Path != w.Stage.Path || string(st.Access) != w.Stage.Access || st.AccessMode != w.Stage.AccessMode || st.Deleting || st.Generation <= 0 {
				t.Errorf("%s: stage %+v, want %+v, live", w.ID, st, *w.Stage)
			}
			// The plugin's own staging mount is how it finds the
			// filesystem again; a raw block stage mounts nothing.
			if (st.MountID != 0) != (st.Access == AccessMount) {
				t.Errorf("%s: staging mount ID %d for a %s stage", w.ID, st.MountID, st.Access)
			}
		}
		if targets := v.Targets(); !slices.Equal(targets, w.Targets) {
			t.Errorf("%s: published at %v, want %v", w.ID, targets, w.Targets)
		}
		for target, p := range v.Publishes {
			if w.Stage == nil || string(p.Access) != w.Stage.Access || p.AccessMode != w.Stage.AccessMode || p.MountID == 0 || p.Deleting || p.Generation <= 0 {
				t.Errorf("%s: publish at %s %+v; want its stage's access, a mount ID, live", w.ID, target, *p)
			}
		}
		if ids := v.SnapshotIDs(); !slices.Equal(ids, w.PendingSnapshots) && len(ids)+len(w.PendingSnapshots) > 0 {
			t.Errorf("%s: snapshots asked for %v, want %v", w.ID, ids, w.PendingSnapshots)
		}
		for id, intent := range v.Snapshots {
			if intent.Generation <= 0 {
				t.Errorf("%s: snapshot %s asked at generation %d", w.ID, id, intent.Generation)
			}
		}
		switch {
		case w.ExpandBytes == 0 && v.Expand != nil:
			t.Errorf("%s: expansion to %d, want none", w.ID, v.Expand.Bytes)
		case w.ExpandBytes != 0 && (v.Expand == nil || v.Expand.Bytes != w.ExpandBytes || v.Expand.Generation <= 0):
			t.Errorf("%s: expansion %+v, want to %d bytes", w.ID, v.Expand, w.ExpandBytes)
		}
	}
}

// previousRelease returns the tag hack/previous-release names.
func previousRelease(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "hack", "previous-release"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			return strings.Fields(line)[0]
		}
	}
	t.Fatal("hack/previous-release names no release")
	return ""
}

// setMeta writes meta keys of the closed store at path.
func setMeta(t *testing.T, path string, kv map[string]string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		for k, v := range kv {
			if err := tx.Bucket(bucketMeta).Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestNewerSchemaRefused rolls a store back: the newest release's store,
// opened and closed by a future release that changed the schema, is
// refused with ErrNewerSchema and an error that names the store, the
// release that wrote it and what to run, and the store is left as it
// was, byte for byte. A store whose writer is unknown is refused too,
// naming the schema. The current code records its own release as the
// writer.
func TestNewerSchemaRefused(t *testing.T) {
	dirs := releaseFixtures(t)
	newest := dirs[len(dirs)-1]
	path := unpackStore(t, filepath.Join(newest, "stopped"))
	s, err := OpenWith(path, Options{Release: "v0.2.0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bolt.Tx) error {
		if got := string(tx.Bucket(bucketMeta).Get(keyWriter)); got != "v0.2.0" {
			t.Errorf("writer recorded %q, want v0.2.0", got)
		}
		return nil
	})
	db.Close()

	for _, tc := range []struct {
		name, writer string
		want         []string
	}{
		{name: "writer recorded", writer: "v0.9.1", want: []string{"schema 3", "written by converge v0.9.1", "run v0.9.1 or a later release", "converge v0.2.0 reads"}},
		{name: "writer unknown", want: []string{"schema 3", "written by a release newer than this one", "run the release that wrote it or a later release"}},
		// The store's file is not trusted with what an operator is
		// told to run, nor with what reaches a terminal.
		{name: "writer not a release", writer: "v9.9.9\n\x1b[2Jrun rm -rf /", want: []string{"schema 3", "written by a release newer than this one"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setMeta(t, path, map[string]string{string(keySchema): "3", string(keyWriter): tc.writer})
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := OpenWith(path, Options{Release: "v0.2.0"})
			if err == nil {
				s.Close()
				t.Fatal("opened a store of schema 3")
			}
			if !errors.Is(err, ErrNewerSchema) {
				t.Errorf("got %v, want ErrNewerSchema", err)
			}
			for _, w := range append(tc.want, path, "docs/releasing.md") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal %q does not say %q", err, w)
				}
			}
			if strings.ContainsAny(err.Error(), "\n\x1b") {
				t.Errorf("the refusal %q carries control characters from the store", err)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Error("the refused store was changed")
			}
		})
	}
}

package fault

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/test/testenv"
)

// writeWithin writes and syncs a file in dir, and fails the test if that
// does not finish within bound: a filesystem left frozen would hang it.
func writeWithin(t *testing.T, dir string, bound time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- writeSynced(filepath.Join(dir, "after-restart"), "written") }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("writing after the restart: %v", err)
		}
	case <-time.After(bound):
		t.Fatalf("a write to %s hangs %v after the restart: the filesystem was left frozen", dir, bound)
	}
}

// TestKillDuringSnapshot kills the plugin at several moments of taking a
// snapshot of a published volume with data on it (while it writes the
// volume out, holds it frozen or copies it) and restarts it: the volume's
// filesystem is never left frozen, no half-made snapshot is listed or left
// in the snapshot directory, the source's data is intact, and asking for
// the snapshot again gives a whole one that restores the data.
func TestKillDuringSnapshot(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	v := setUp(t, p, "snapsrc")
	// Data enough that the copy takes a while: the kills land in it.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	if err := writeSynced(filepath.Join(v.target, "big"), string(big)); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(p.DataDir, "snapshots")
	for i, delay := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond} {
		name := fmt.Sprintf("snap-%d", i)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p.Controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
		}()
		time.Sleep(delay)
		p.Kill()
		p.Start() // ready only once what the crash left is finished or rolled back
		writeWithin(t, v.target, 10*time.Second)
		readBack(t, v)
		if got, err := os.ReadFile(filepath.Join(v.target, "big")); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("kill after %v: the source's data changed (%v)", delay, err)
		}
		noTemps(t, fmt.Sprintf("kill after %v", delay), snapDir)
		resp, err := p.Controller().ListSnapshots(context.Background(), &csi.ListSnapshotsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.GetEntries() {
			if s := e.GetSnapshot(); !s.GetReadyToUse() || s.GetSizeBytes() != volumeSize {
				t.Errorf("kill after %v: listed %+v, want only whole snapshots", delay, s)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		again, err := p.Controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
		cancel()
		if err != nil {
			t.Fatalf("kill after %v: asking for %s again: %v", delay, name, err)
		}
		if i == 0 {
			restored := restoreAndRead(t, p, again.GetSnapshot().GetSnapshotId())
			if !bytes.Equal(restored, big) {
				t.Errorf("the snapshot taken again does not restore the source's data")
			}
		}
	}
	resp, err := p.Controller().ListSnapshots(context.Background(), &csi.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range resp.GetEntries() {
		if _, err := p.Controller().DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: e.GetSnapshot().GetSnapshotId()}); err != nil {
			t.Fatal(err)
		}
	}
	tearDown(t, p, v)
}

// restoreAndRead restores snapshot id to a new volume, publishes it, reads
// its file "big" and tears it down again.
func restoreAndRead(t *testing.T, p *testenv.Plugin, id string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Controller().CreateVolume(ctx, createFrom("restored", fromSnapshot(id), 0, nil)); err != nil {
		t.Fatalf("restoring %s: %v", id, err)
	}
	return publishAndRead(t, p, "restored")
}

func fromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func fromVolume(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// createFrom asks for volume name made from source, of at least size bytes.
func createFrom(name string, source *csi.VolumeContentSource, size int64, params map[string]string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:                name,
		CapacityRange:       &csi.CapacityRange{RequiredBytes: size},
		Parameters:          params,
		VolumeCapabilities:  []*csi.VolumeCapability{rwo},
		VolumeContentSource: source,
	}
}

// publishAndRead stages and publishes the volume created under name, reads
// its file "big", and tears it down and deletes it.
func publishAndRead(t *testing.T, p *testenv.Plugin, name string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := &env{t: t, p: p}
	r := &vol{name: name, id: vid(name), staging: filepath.Join(p.Root, "staging", name), target: filepath.Join(p.Root, "pods", name, "mount"), want: published}
	for _, d := range []string{r.staging, filepath.Dir(r.target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.drive(ctx, r, created); err != nil {
		t.Fatalf("publishing %s: %v", name, err)
	}
	got, err := os.ReadFile(filepath.Join(r.target, "big"))
	if err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	r.want = absent
	e.replay(r)
	return got
}

// temps returns the temporary files (copies under way) in dir.
func temps(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names
}

// noTemps fails t for a temporary file (a copy under way) left in dir.
func noTemps(t *testing.T, when, dir string) {
	t.Helper()
	if left := temps(dir); len(left) > 0 {
		t.Errorf("%s: %v left in %s", when, left, dir)
	}
}

// TestKillDuringRestore kills the plugin at several moments of making a
// volume from a snapshot (thick and thin, larger than the snapshot) and of
// cloning a published volume, and restarts it: the new volume's image is
// absent or whole (its size, its blocks when thick), no copy is left half
// made, the clone's own snapshot is never listed and none is left, the
// source stays writable and intact, and asking again makes a volume that
// holds the source's data.
func TestKillDuringRestore(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	v := setUp(t, p, "restsrc")
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB: the copy takes a while
	if err := writeSynced(filepath.Join(v.target, "big"), string(big)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	snap, err := p.Controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "restsnap", SourceVolumeId: v.id})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	snapDir := filepath.Join(p.DataDir, "snapshots")
	thin := map[string]string{"converge.csi.dev/provisioning": "thin"}
	for i, delay := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond} {
		name := fmt.Sprintf("made-%d", i)
		var req *csi.CreateVolumeRequest
		var params map[string]string
		thick := i%3 != 1
		if !thick {
			params = thin
		}
		kind := "restore"
		if i%3 == 2 {
			kind = "clone"
			req = createFrom(name, fromVolume(v.id), 2*volumeSize, params)
		} else {
			req = createFrom(name, fromSnapshot(snapID), 2*volumeSize, params)
		}
		when := fmt.Sprintf("%s (%s, thick %v), kill after %v", name, kind, thick, delay)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p.Controller().CreateVolume(ctx, req)
		}()
		time.Sleep(delay)
		copying := append(temps(p.DataDir), temps(snapDir)...)
		p.Kill()
		t.Logf("%s: copies under way just before the kill: %v", when, copying)
		p.Start() // ready only once what the crash left is finished or rolled back
		writeWithin(t, v.target, 10*time.Second)
		readBack(t, v)
		noTemps(t, when, p.DataDir)
		noTemps(t, when, snapDir)
		image := filepath.Join(p.DataDir, vid(name)+".img")
		var st unix.Stat_t
		switch err := unix.Stat(image, &st); {
		case errors.Is(err, unix.ENOENT):
			t.Logf("%s: no image after the restart", when)
		case err == nil:
			t.Logf("%s: a whole image after the restart", when)
			if st.Size != 2*volumeSize || thick && st.Blocks*512 < st.Size {
				t.Errorf("%s: the image has %d bytes, %d allocated; want %d, all allocated when thick (%v)", when, st.Size, st.Blocks*512, 2*volumeSize, thick)
			}
		default:
			t.Fatal(err)
		}
		list, err := p.Controller().ListSnapshots(context.Background(), &csi.ListSnapshotsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(list.GetEntries()); n != 1 || list.GetEntries()[0].GetSnapshot().GetSnapshotId() != snapID {
			t.Errorf("%s: listed %v, want %s alone", when, list.GetEntries(), snapID)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = p.Controller().CreateVolume(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("%s: asking again: %v", when, err)
		}
		if got := publishAndRead(t, p, name); !bytes.Equal(got, big) {
			t.Errorf("%s: the volume made does not hold the source's data", when)
		}
		if files := filesIn(t, snapDir); len(files) != 1 {
			t.Errorf("%s: the snapshot directory holds %v, want the one snapshot", when, files)
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatal(err)
	}
	tearDown(t, p, v)
}

func filesIn(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestKillDuringGroupSnapshot kills the plugin at several moments of
// taking a group snapshot of two published volumes with data on them
// (while it writes them out, holds them frozen or copies them) and
// restarts it: neither filesystem is left frozen, the group is whole or
// absent (never one member without the other), nothing half made is left
// in the snapshot directory, and asking for the group again gives it
// whole.
func TestKillDuringGroupSnapshot(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	vols := []*vol{setUp(t, p, "grpa"), setUp(t, p, "grpb")}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB each: the kills land in the copies
	for _, v := range vols {
		if err := writeSynced(filepath.Join(v.target, "big"), string(big)); err != nil {
			t.Fatal(err)
		}
	}
	snapDir := filepath.Join(p.DataDir, "snapshots")
	sources := []string{vols[0].id, vols[1].id}
	for i, delay := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond} {
		name := fmt.Sprintf("group-%d", i)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p.Groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: sources})
		}()
		time.Sleep(delay)
		p.Kill()
		p.Start()
		for _, v := range vols {
			writeWithin(t, v.target, 10*time.Second)
			readBack(t, v)
		}
		noTemps(t, fmt.Sprintf("kill after %v", delay), snapDir)
		resp, err := p.Controller().ListSnapshots(context.Background(), &csi.ListSnapshotsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		members := 0
		for _, e := range resp.GetEntries() {
			if e.GetSnapshot().GetGroupSnapshotId() == vid(name) {
				members++
			}
		}
		if members != 0 && members != 2 {
			t.Errorf("kill after %v: %d of the group's 2 members listed, want all or none", delay, members)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		again, err := p.Groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: sources})
		cancel()
		if err != nil {
			t.Fatalf("kill after %v: asking for %s again: %v", delay, name, err)
		}
		if g := again.GetGroupSnapshot(); !g.GetReadyToUse() || len(g.GetSnapshots()) != 2 {
			t.Errorf("kill after %v: the group asked again is %v, want whole and ready", delay, g)
		}
		if i == 0 {
			for _, s := range again.GetGroupSnapshot().GetSnapshots() {
				if restored := restoreAndRead(t, p, s.GetSnapshotId()); !bytes.Equal(restored, big) {
					t.Errorf("member %s does not restore its volume's data", s.GetSnapshotId())
				}
			}
		}
		if _, err := p.Groups().DeleteVolumeGroupSnapshot(context.Background(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: vid(name)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range vols {
		tearDown(t, p, v)
	}
}

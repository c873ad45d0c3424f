package fault

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

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
		entries, _ := os.ReadDir(snapDir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("kill after %v: %s left in the snapshot directory", delay, e.Name())
			}
		}
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
	_, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:                "restored",
		VolumeCapabilities:  []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}},
	})
	if err != nil {
		t.Fatalf("restoring %s: %v", id, err)
	}
	e := &env{t: t, p: p}
	r := &vol{id: "restored", staging: filepath.Join(p.Root, "staging", "restored"), target: filepath.Join(p.Root, "pods", "restored", "mount"), want: published}
	for _, d := range []string{r.staging, filepath.Dir(r.target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.drive(ctx, r, created); err != nil {
		t.Fatalf("publishing the restored volume: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(r.target, "big"))
	if err != nil {
		t.Fatalf("reading the restored volume: %v", err)
	}
	r.want = absent
	e.replay(r)
	return got
}

package integration

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// snapshotOf takes snapshot name of volume id and fails the test unless it
// is ready.
func snapshotOf(t *testing.T, p *testenv.Plugin, name, id string) *csi.Snapshot {
	t.Helper()
	resp, err := p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id})
	must(t, "CreateSnapshot "+name, err)
	s := resp.GetSnapshot()
	if !s.GetReadyToUse() || s.GetSourceVolumeId() != id || s.GetSizeBytes() != volSize {
		t.Fatalf("snapshot %s: got %+v, want ready, of %s, %d bytes", name, s, id, volSize)
	}
	return s
}

// restoreFrom creates volume id from snapshot snapID.
func restoreFrom(t *testing.T, p *testenv.Plugin, id, snapID string, size int64) error {
	_, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name:                id,
		CapacityRange:       &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities:  []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}},
	})
	return err
}

// TestSnapshotAndRestore takes a snapshot of a published volume while a
// pod would write to it, writes more, clones the volume, and restores the
// snapshot to a new
// volume, larger than the snapshot, once the source volume is gone: the
// restored volume holds exactly what was written before the snapshot, and
// its filesystem fills its size. On the way: the snapshot lists by ID and
// by source, a second request of the same name answers the same
// snapshot, another volume cannot take that name, a restore limited below
// it, of a snapshot of another node or as another filesystem is refused,
// and the deleted snapshot is gone.
func TestSnapshotAndRestore(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	_, _, target := upPublished(t, p, "snap-src")
	must(t, "write before", os.WriteFile(filepath.Join(target, "before"), []byte("before the snapshot"), 0o600))

	s := snapshotOf(t, p, "snap-1", vid("snap-src"))
	if again := snapshotOf(t, p, "snap-1", vid("snap-src")); again.GetSnapshotId() != s.GetSnapshotId() {
		t.Errorf("the same request answered snapshot %s, then %s", s.GetSnapshotId(), again.GetSnapshotId())
	}
	must(t, "write after", os.WriteFile(filepath.Join(target, "after"), []byte("after the snapshot"), 0o600))
	must(t, "write after, durably", syncFile(filepath.Join(target, "after")))

	create(t, p, "snap-other")
	_, err := p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: vid("snap-other")})
	wantCode(t, "the same name of another volume", err, codes.AlreadyExists)
	_, err = p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "snap-2", SourceVolumeId: "no-such-volume"})
	wantCode(t, "a snapshot of no volume", err, codes.NotFound)

	for _, req := range []*csi.ListSnapshotsRequest{{SnapshotId: s.GetSnapshotId()}, {SourceVolumeId: vid("snap-src")}, {}} {
		resp, err := p.Controller().ListSnapshots(ctx(t), req)
		must(t, "ListSnapshots", err)
		if len(resp.GetEntries()) != 1 || resp.GetEntries()[0].GetSnapshot().GetSnapshotId() != s.GetSnapshotId() {
			t.Errorf("ListSnapshots(%v): got %v, want only %s", req, resp.GetEntries(), s.GetSnapshotId())
		}
	}

	// A clone of the published volume holds what it holds now; the
	// snapshot the clone was made from is gone and never listed.
	_, err = p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "snap-clone", CapacityRange: &csi.CapacityRange{RequiredBytes: volSize}, VolumeCapabilities: []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vid("snap-src")}}},
	})
	must(t, "clone", err)
	_, clone := upPublishedExisting(t, p, vid("snap-clone"))
	for _, f := range []string{"before", "after"} {
		if _, err := os.Stat(filepath.Join(clone, f)); err != nil {
			t.Errorf("the clone lacks %s: %v", f, err)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(p.DataDir, "snapshots")); len(entries) != 1 {
		t.Errorf("snapshot directory after the clone: %v, want only %s", entries, s.GetSnapshotId())
	}
	downAndDelete(t, p, vid("snap-clone"))
	_, err = p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "snap-clone-none", CapacityRange: &csi.CapacityRange{RequiredBytes: volSize}, VolumeCapabilities: []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "no-such-volume"}}},
	})
	wantCode(t, "a clone of no volume", err, codes.NotFound)
	_, err = p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "snap-clone-far", CapacityRange: &csi.CapacityRange{RequiredBytes: volSize}, VolumeCapabilities: []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{
			VolumeId: strings.Replace(vid("snap-src"), "_"+testenv.NodeID, "_other-node", 1)}}},
	})
	wantCode(t, "a clone of another node's volume", err, codes.ResourceExhausted)
	if err != nil && !strings.Contains(err.Error(), "other-node") {
		t.Errorf("the refusal does not name the volume's node: %v", err)
	}

	// The source goes; its snapshot stays.
	downAndDelete(t, p, vid("snap-src"))
	// A restore asked smaller than the snapshot is given the snapshot's
	// size, unless its limit is smaller.
	_, err = p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "snap-small", CapacityRange: &csi.CapacityRange{RequiredBytes: volSize / 2, LimitBytes: volSize / 2}, VolumeCapabilities: []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.GetSnapshotId()}}},
	})
	wantCode(t, "a restore limited below the snapshot", err, codes.OutOfRange)
	elsewhere := strings.Replace(s.GetSnapshotId(), "_test-node", "_other-node", 1)
	err = restoreFrom(t, p, "snap-far", elsewhere, volSize)
	wantCode(t, "a restore of another node's snapshot", err, codes.ResourceExhausted)
	if err != nil && !strings.Contains(err.Error(), "other-node") {
		t.Errorf("the refusal does not name the snapshot's node: %v", err)
	}

	_, err = p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "snap-xfs", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * volSize},
		VolumeCapabilities:  []*csi.VolumeCapability{mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.GetSnapshotId()}}},
	})
	wantCode(t, "a restore of an ext4 snapshot as xfs", err, codes.InvalidArgument)
	must(t, "restore", restoreFrom(t, p, "snap-restored", s.GetSnapshotId(), 2*volSize))
	_, restored := upPublishedExisting(t, p, vid("snap-restored"))
	if got, err := os.ReadFile(filepath.Join(restored, "before")); err != nil || string(got) != "before the snapshot" {
		t.Errorf("restored file: got %q, %v; want what was written before the snapshot", got, err)
	}
	if _, err := os.Stat(filepath.Join(restored, "after")); !os.IsNotExist(err) {
		t.Errorf("a file written after the snapshot is in the restored volume: %v", err)
	}
	if got := fsBytes(t, restored); got <= volSize {
		t.Errorf("the restored filesystem holds %d bytes; want it grown past the snapshot's %d bytes to its %d-byte volume", got, volSize, 2*volSize)
	}
	downAndDelete(t, p, vid("snap-restored"))

	for range 2 {
		_, err = p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshotId()})
		must(t, "DeleteSnapshot", err)
	}
	resp, err := p.Controller().ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{})
	must(t, "ListSnapshots", err)
	if len(resp.GetEntries()) != 0 {
		t.Errorf("snapshots after the deletion: %v", resp.GetEntries())
	}
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: vid("snap-other")})
	must(t, "delete snap-other", err)
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// TestReflinkSnapshotKeepsThickPromise takes a snapshot of a published
// thick volume with 64 MiB written, where the data directory shares blocks
// (xfs with reflinks): the snapshot costs no space at once, but the
// volume's written blocks are now shared and a write there takes a new
// one, so the node stops promising that space to new volumes (blocks
// allocated but never written stay the volume's own: xfs shares only
// written extents); once the snapshot is deleted it promises it again. The
// volume can still be written in full.
func TestReflinkSnapshotKeepsThickPromise(t *testing.T) {
	p := testenv.New(t)
	smallDataDirOf(t, p, 512*mib, "xfs", "-q", "-f", "-m", "reflink=1")
	p.Start()
	if !strings.Contains(p.Log(), `copy="reflink"`) {
		t.Fatal("the plugin did not find that the data directory shares blocks")
	}
	must(t, "create", createProvisioned(p, t, "thick-src", "thick", 128*mib))
	_, target := upPublishedExisting(t, p, vid("thick-src"))
	f, err := os.Create(filepath.Join(target, "written"))
	must(t, "create written", err)
	for range 64 {
		if _, err := f.Write(bytes.Repeat([]byte{1}, mib)); err != nil {
			t.Fatal(err)
		}
	}
	must(t, "sync written", f.Sync())
	f.Close()
	before := capacityFor(t, p, "thick")

	s := snapshotOf128(t, p, "snap-thick", vid("thick-src"))
	after := capacityFor(t, p, "thick")
	if drop := before - after; drop < 64*mib {
		t.Errorf("thick capacity went from %d to %d MiB after the snapshot: want it lower by at least the 64 MiB written, which the volume's writes may now take anew", before/mib, after/mib)
	}
	wantCode(t, "a thick volume of the space the snapshot's sharing owes", createProvisioned(p, t, "thick-late", "thick", before), codes.ResourceExhausted)

	// Every block of the volume can be written: what it was promised.
	f, err = os.OpenFile(filepath.Join(target, "written"), os.O_WRONLY, 0)
	must(t, "create fill", err)
	chunk := make([]byte, mib)
	for range 110 {
		if _, err := f.Write(chunk); err != nil {
			t.Fatalf("writing the thick volume after its snapshot: %v", err)
		}
	}
	must(t, "sync fill", f.Sync())
	f.Close()

	// The writes copied the shared blocks: the snapshot alone holds the
	// old ones, which its deletion gives back.
	written := capacityFor(t, p, "thick")
	_, err = p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshotId()})
	must(t, "DeleteSnapshot", err)
	// xfs frees an unlinked file's blocks in the background.
	poll.Until(t, 20*time.Second, 100*time.Millisecond, "thick capacity after the snapshot's deletion", func() error {
		if got := capacityFor(t, p, "thick"); got < written+48*mib {
			return fmt.Errorf("%d MiB, want the about 64 MiB only the snapshot held back on the %d MiB of before it", got/mib, written/mib)
		}
		return nil
	})
	downAndDelete(t, p, vid("thick-src"))
}

// snapshotOf128 takes snapshot name of a 128 MiB volume id.
func snapshotOf128(t *testing.T, p *testenv.Plugin, name, id string) *csi.Snapshot {
	t.Helper()
	resp, err := p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id})
	must(t, "CreateSnapshot "+name, err)
	if s := resp.GetSnapshot(); !s.GetReadyToUse() || s.GetSizeBytes() != 128*mib {
		t.Fatalf("snapshot %s: got %+v, want ready, 128 MiB", name, s)
	}
	return resp.GetSnapshot()
}

// TestReflinkThinVolumesKeepTheGuard writes a thin volume where the data
// directory shares blocks (xfs with reflinks, guard 20%), snapshots it and
// restores the snapshot into thin volumes until one is refused. A restore
// shares every block with the snapshot at first, yet each of its writes
// takes a new block: each thin volume is promised its whole size (ratio
// 1), so the volumes promised fit above the guard, and when every one of
// them is written anew in full, the guard is still free. A snapshot of a
// volume whose blocks are its own then is refused unless the space its
// writes would copy is there.
func TestReflinkThinVolumesKeepTheGuard(t *testing.T) {
	p := testenv.New(t, "--pool-guard", "20%")
	smallDataDirOf(t, p, 512*mib, "xfs", "-q", "-f", "-m", "reflink=1")
	p.Start()
	if !strings.Contains(p.Log(), `copy="reflink"`) {
		t.Fatal("the plugin did not find that the data directory shares blocks")
	}
	total, _ := spaceOf(t, p.DataDir)
	guard := guardOf(total, 20)
	thin := map[string]string{provisioningKey: "thin"}
	src, err := createAs(t, p, "thin-src", rwo, thin, nil)
	must(t, "create thin-src", err)
	_, target := upPublishedExisting(t, p, src)
	fill(t, target, "data", 48*mib)
	snap := snapshotOf(t, p, "thin-snap", src).GetSnapshotId()

	ids := []string{src}
	for i := 0; ; i++ {
		id, err := createAs(t, p, fmt.Sprintf("thin-restore-%d", i), rwo, thin, snapshotSource(snap))
		if err != nil {
			wantCode(t, "a thin restore past the guard", err, codes.ResourceExhausted)
			break
		}
		ids = append(ids, id)
		if i > 8 {
			t.Fatalf("no refusal after %d thin restores of %d MiB on a %d MiB data directory", i+1, volSize/mib, total/mib)
		}
	}
	_, free := spaceOf(t, p.DataDir)
	t.Logf("%d thin restores of %d MiB made; %d MiB free, guard %d MiB", len(ids)-1, volSize/mib, free/mib, guard/mib)
	if promised := int64(len(ids)) * volSize; promised > free-guard {
		t.Errorf("%d thin volumes of %d MiB promised at a ratio of 1, %d MiB free above the guard: each may write its whole size anew", len(ids), volSize/mib, (free-guard)/mib)
	}

	// Every volume writes every block anew: the files it holds in place,
	// then the rest of its filesystem.
	for _, id := range ids {
		target := filepath.Join(p.Root, "pod-"+id, "mount")
		if id != src {
			_, target = upPublishedExisting(t, p, id)
		}
		rewriteAll(t, id, target)
		_, free := spaceOf(t, p.DataDir)
		t.Logf("%s written anew: %d MiB free", id, free/mib)
		if free < guard {
			t.Fatalf("after %s was written anew: %d MiB free, below the guard of %d MiB", id, free/mib, guard/mib)
		}
	}

	// A snapshot shares a written volume's blocks again: it is promised
	// what the volume's writes would copy, or refused.
	_, err = p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "thin-snap-2", SourceVolumeId: ids[1]})
	t.Logf("a snapshot of %s written anew: %v", ids[1], err)
	if err != nil {
		wantCode(t, "a snapshot whose sharing does not fit above the guard", err, codes.ResourceExhausted)
	} else {
		rewriteAll(t, ids[1], filepath.Join(p.Root, "pod-"+ids[1], "mount"))
		if _, free := spaceOf(t, p.DataDir); free < guard {
			t.Errorf("after a snapshot of %s and its writes: %d MiB free, below the guard of %d MiB", ids[1], free/mib, guard/mib)
		}
	}
	for _, id := range ids {
		downAndDelete(t, p, id)
	}
}

// rewriteAll writes volume id, published at target, anew: every file in
// place, each MiB fsynced, then a new file up to its filesystem's ENOSPC.
// A pool that runs out under it fails the test.
func rewriteAll(t *testing.T, id, target string) {
	t.Helper()
	entries, err := os.ReadDir(target)
	must(t, "listing "+target, err)
	buf := make([]byte, mib)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.OpenFile(filepath.Join(target, e.Name()), os.O_WRONLY, 0)
		must(t, "open "+e.Name(), err)
		info, err := f.Stat()
		must(t, "stat "+e.Name(), err)
		for off := int64(0); off < info.Size(); off += mib {
			rand.Read(buf)
			if _, err = f.WriteAt(buf[:min(mib, info.Size()-off)], off); err == nil {
				err = f.Sync()
			}
			if err != nil {
				f.Close()
				t.Fatalf("%s: writing %s anew at %d MiB: %v", id, e.Name(), off/mib, err)
			}
		}
		must(t, "close "+e.Name(), f.Close())
	}
	_, n, err := fillUntilError(target, fmt.Sprintf("more-%d", len(entries)), volSize)
	if err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("%s: writing its free space at %d MiB: %v", id, n/mib, err)
	}
}

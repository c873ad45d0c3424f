package controller

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/rpcerr"
)

// restoreFrom asks for volume name made from snapshot id.
func restoreFrom(ctx context.Context, c *Controller, name, id string) error {
	_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: capMount,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}})
	return err
}

// snapshotted serves snapshots from c and returns the ID of snapshot "s"
// of a new volume "v".
func snapshotted(t *testing.T, c *Controller, images *devices.Images) string {
	t.Helper()
	serveSnapshots(t, c, images)
	snap, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: create(t, c, "v")})
	if err != nil {
		t.Fatal(err)
	}
	return snap.GetSnapshot().GetSnapshotId()
}

// TestRestorePanicIsContained checks that a copy that panics fails its
// restore, as INTERNAL naming the panic, leaves no image or record of a
// volume made, and that the plugin goes on: the next restore works.
func TestRestorePanicIsContained(t *testing.T) {
	c, store, images := newController(t)
	id := snapshotted(t, c, images)
	copyImage := defaultPool(c).restoreImage
	defaultPool(c).restoreImage = func(context.Context, string, *Pool, devices.SnapshotInfo, int64, bool) error {
		panic("copy went wrong")
	}
	err := restoreFrom(t.Context(), c, "r", id)
	if rpcerr.Code(err) != codes.Internal || !strings.Contains(err.Error(), "copy went wrong") {
		t.Fatalf("a restore whose copy panics: got %v, want INTERNAL naming the panic", err)
	}
	vol := c.localID("r")
	if _, err := images.Size(vol); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed restore left an image: %v", err)
	}
	if v, err := store.Get(vol); err == nil && v.Provisioning != "" {
		t.Errorf("the failed restore left the record of a volume made %s", v.Provisioning)
	}
	if got := defaultPool(c).Restoring(); len(got) != 0 {
		t.Errorf("restores under way after the panic: %+v", got)
	}
	defaultPool(c).restoreImage = copyImage
	if err := restoreFrom(t.Context(), c, "r", id); err != nil {
		t.Errorf("the restore after the panic: %v", err)
	}
}

// TestCloseEndsRestores checks that Close ends a copy under way (through
// its context) and returns only once the copy has ended, leaving no image.
func TestCloseEndsRestores(t *testing.T) {
	c, _, images := newController(t)
	id := snapshotted(t, c, images)
	started, ended := make(chan struct{}), make(chan struct{})
	defaultPool(c).restoreImage = func(ctx context.Context, _ string, _ *Pool, _ devices.SnapshotInfo, _ int64, _ bool) error {
		close(started)
		<-ctx.Done()
		// Slow to end, so that a Close that does not wait returns first.
		time.Sleep(20 * time.Millisecond)
		close(ended)
		return ctx.Err()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if err := restoreFrom(ctx, c, "r", id); rpcerr.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the request: got %v, want DEADLINE_EXCEEDED while the copy goes on", err)
	}
	<-started
	defaultPool(c).Close()
	select {
	case <-ended:
	default:
		t.Fatal("Close returned before the copy ended")
	}
	if _, err := images.Size(c.localID("r")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ended copy left an image: %v", err)
	}
}

// TestRetryAfterSnapshotDeleted checks that a CreateVolume retried after
// its restore has ended finds the volume, though the snapshot it was made
// from is deleted meanwhile: what exists is found before the content
// source is read.
func TestRetryAfterSnapshotDeleted(t *testing.T) {
	c, _, images := newController(t)
	id := snapshotted(t, c, images)
	if err := restoreFrom(t.Context(), c, "r", id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
		t.Fatal(err)
	}
	if err := restoreFrom(t.Context(), c, "r", id); err != nil {
		t.Errorf("the retry, its snapshot deleted: got %v, want the volume made", err)
	}
}

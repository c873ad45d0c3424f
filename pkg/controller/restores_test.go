package controller

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
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
func snapshotted(t *testing.T, c *Controller) string {
	t.Helper()
	serveSnapshots(t, c)
	snap, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: create(t, c, "v")})
	if err != nil {
		t.Fatal(err)
	}
	return snap.GetSnapshot().GetSnapshotId()
}

// TestRetryAfterSnapshotDeleted checks that a CreateVolume retried after
// its restore has ended finds the volume, though the snapshot it was made
// from is deleted meanwhile: what exists is found before the content
// source is read.
func TestRetryAfterSnapshotDeleted(t *testing.T) {
	c, _, _ := newController(t)
	id := snapshotted(t, c)
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

package controller

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// TestGroupSnapshotLifecycle takes a group snapshot of two volumes and
// checks that it is idempotent by name (the same group, asked once), that
// the name with other volumes is ALREADY_EXISTS, that each member is
// listed as a snapshot of its volume naming the group, restores like any
// snapshot and is not deleted alone, that Get describes the group and
// refuses a list that names a snapshot outside it, and that Delete removes
// every member and is a no-op after.
func TestGroupSnapshotLifecycle(t *testing.T) {
	c, _, _ := newController(t)
	taker := serveSnapshots(t, c)
	g := c.Groups()
	v1, v2, v3 := create(t, c, "v1"), create(t, c, "v2"), create(t, c, "v3")
	req := &csi.CreateVolumeGroupSnapshotRequest{Name: "gs", SourceVolumeIds: []string{v2, v1}, Parameters: map[string]string{"deletionPolicy": "Delete"}}
	resp, err := g.CreateVolumeGroupSnapshot(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	gs := resp.GetGroupSnapshot()
	if gs.GetGroupSnapshotId() != "gs_node" || !gs.GetReadyToUse() || len(gs.GetSnapshots()) != 2 || gs.GetCreationTime() == nil {
		t.Fatalf("group: got %v, want gs_node, ready, of two snapshots", gs)
	}
	var ids []string
	for i, s := range gs.GetSnapshots() {
		if want := []string{v1, v2}[i]; s.GetSourceVolumeId() != want || s.GetGroupSnapshotId() != "gs_node" || !s.GetReadyToUse() {
			t.Errorf("member %d: got %v, want a ready snapshot of %s in gs_node", i, s, want)
		}
		ids = append(ids, s.GetSnapshotId())
	}
	again, err := g.CreateVolumeGroupSnapshot(t.Context(), req)
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != "gs_node" || len(taker.asked) != 1 {
		t.Errorf("the same group again: got %v, %v (asked %v), want the group, asked once", again, err, taker.asked)
	}
	for _, other := range [][]string{{v1, v3}, {v1}, {v1, v2, v3}} {
		if _, err := g.CreateVolumeGroupSnapshot(t.Context(), &csi.CreateVolumeGroupSnapshotRequest{Name: "gs", SourceVolumeIds: other}); rpcerr.Code(err) != codes.AlreadyExists {
			t.Errorf("the name with volumes %v: got %v, want ALREADY_EXISTS", other, err)
		}
	}
	for _, s := range gs.GetSnapshots() {
		if info, _, err := c.pools.Snapshot(s.GetSnapshotId()); err != nil || !info.Created.Equal(s.GetCreationTime().AsTime()) {
			t.Errorf("member %s after the name was asked again with other volumes: %+v, %v; want it as it was", s.GetSnapshotId(), info, err)
		}
	}
	if _, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: strings.TrimSuffix(ids[0], "_node"), SourceVolumeId: v1}); rpcerr.Code(err) != codes.AlreadyExists {
		t.Errorf("a snapshot named as a member: got %v, want ALREADY_EXISTS", err)
	}
	list, err := c.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SnapshotId: ids[0]})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetSnapshot().GetGroupSnapshotId() != "gs_node" {
		t.Errorf("listing a member: got %v, %v, want it, naming its group", list, err)
	}
	if _, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: capMount,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: ids[1]}}}}); err != nil {
		t.Errorf("restoring a member: %v", err)
	}
	if _, err := c.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: ids[0]}); rpcerr.Code(err) != codes.InvalidArgument {
		t.Errorf("deleting a member alone: got %v, want INVALID_ARGUMENT (CSI: part of a group)", err)
	}
	got, err := g.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node", SnapshotIds: ids})
	if err != nil || len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Errorf("get: got %v, %v, want the group of two", got, err)
	}
	single, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "alone", SourceVolumeId: v3})
	if err != nil {
		t.Fatal(err)
	}
	mismatch := append(slices.Clone(ids), single.GetSnapshot().GetSnapshotId())
	if _, err := g.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node", SnapshotIds: mismatch}); rpcerr.Code(err) != codes.InvalidArgument {
		t.Errorf("get with a snapshot outside the group: got %v, want INVALID_ARGUMENT", err)
	}
	if _, err := g.DeleteVolumeGroupSnapshot(t.Context(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node", SnapshotIds: mismatch}); rpcerr.Code(err) != codes.InvalidArgument {
		t.Errorf("delete with a snapshot outside the group: got %v, want INVALID_ARGUMENT", err)
	}
	for _, short := range [][]string{ids[:1], {ids[0], "gone_node"}} {
		if _, err := g.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node", SnapshotIds: short}); rpcerr.Code(err) != codes.InvalidArgument {
			t.Errorf("get with %v: got %v, want INVALID_ARGUMENT", short, err)
		}
		if _, err := g.DeleteVolumeGroupSnapshot(t.Context(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node", SnapshotIds: short}); rpcerr.Code(err) != codes.InvalidArgument {
			t.Errorf("delete with %v: got %v, want INVALID_ARGUMENT, nothing deleted", short, err)
		}
	}
	for range 2 {
		if _, err := g.DeleteVolumeGroupSnapshot(t.Context(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node", SnapshotIds: ids}); err != nil {
			t.Errorf("delete: %v", err)
		}
	}
	for _, id := range ids {
		if _, _, err := c.pools.Snapshot(id); err == nil {
			t.Errorf("member %s left after the group was deleted", id)
		}
	}
	if _, err := g.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node"}); rpcerr.Code(err) != codes.NotFound {
		t.Errorf("get after delete: got %v, want NOT_FOUND", err)
	}
	if _, _, err := c.pools.Snapshot(single.GetSnapshot().GetSnapshotId()); err != nil {
		t.Errorf("the snapshot outside the group was deleted with it: %v", err)
	}
}

// TestGroupSnapshotRefusals checks the requests a group snapshot refuses,
// each with its code and a message that says why.
func TestGroupSnapshotRefusals(t *testing.T) {
	c, _, _ := newController(t)
	serveSnapshots(t, c)
	g := c.Groups()
	v1 := create(t, c, "v1")
	for _, tc := range []struct {
		name string
		req  *csi.CreateVolumeGroupSnapshotRequest
		code codes.Code
		says string
	}{
		{"no name", &csi.CreateVolumeGroupSnapshotRequest{SourceVolumeIds: []string{v1}}, codes.InvalidArgument, "name"},
		{"no volumes", &csi.CreateVolumeGroupSnapshotRequest{Name: "g"}, codes.InvalidArgument, "source volume"},
		{"a volume twice", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{v1, v1}}, codes.InvalidArgument, "twice"},
		{"an unknown parameter", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{v1}, Parameters: map[string]string{"fast": "yes"}}, codes.InvalidArgument, "fast"},
		{"another node's volume", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{v1, "v9_other"}}, codes.FailedPrecondition, "other"},
		{"a volume that is not here", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{v1, "v9_node"}}, codes.NotFound, "v9_node"},
		{"too many volumes", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: many(MaxGroupVolumes + 1)}, codes.InvalidArgument, "at most"},
	} {
		_, err := g.CreateVolumeGroupSnapshot(t.Context(), tc.req)
		if rpcerr.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want %v saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	if list, _ := c.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{}); len(list.GetEntries()) != 0 {
		t.Errorf("refused groups left snapshots: %v", list.GetEntries())
	}
}

// TestDeleteGroupWhileAMemberIsRestored checks that a group one of whose
// members a volume is being restored from is not deleted, nor any of its
// members (ABORTED, retried), and is once the restore ended.
func TestDeleteGroupWhileAMemberIsRestored(t *testing.T) {
	started, gate := make(chan struct{}), make(chan struct{})
	c, _, _ := newControllerCopying(t, gatedCopy(started, gate))
	serveSnapshots(t, c)
	g := c.Groups()
	v1, v2 := create(t, c, "v1"), create(t, c, "v2")
	resp, err := g.CreateVolumeGroupSnapshot(t.Context(), &csi.CreateVolumeGroupSnapshotRequest{Name: "gs", SourceVolumeIds: []string{v1, v2}})
	if err != nil {
		t.Fatal(err)
	}
	members := resp.GetGroupSnapshot().GetSnapshots()
	restored := make(chan error, 1)
	go func() {
		_, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: capMount,
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: members[1].GetSnapshotId()}}}})
		restored <- err
	}()
	<-started
	del := &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "gs_node", SnapshotIds: []string{members[0].GetSnapshotId(), members[1].GetSnapshotId()}}
	if _, err := g.DeleteVolumeGroupSnapshot(t.Context(), del); rpcerr.Code(err) != codes.Aborted {
		t.Errorf("deleting a group while a member is restored: got %v, want ABORTED", err)
	}
	for _, m := range members {
		if _, _, err := c.pools.Snapshot(m.GetSnapshotId()); err != nil {
			t.Errorf("member %s deleted while the group's deletion was refused: %v", m.GetSnapshotId(), err)
		}
	}
	close(gate)
	if err := <-restored; err != nil {
		t.Fatal(err)
	}
	if _, err := g.DeleteVolumeGroupSnapshot(t.Context(), del); err != nil {
		t.Errorf("deleting the group after the restore: %v", err)
	}
}

// TestGCKeepsAGroupWhole checks that csi-node gc keeps every member of a
// group while any member is referenced (a group is never cut in part), and
// deletes them all once none is.
func TestGCKeepsAGroupWhole(t *testing.T) {
	c, _, _ := newController(t)
	serveSnapshots(t, c)
	v1, v2 := create(t, c, "v1"), create(t, c, "v2")
	resp, err := c.Groups().CreateVolumeGroupSnapshot(t.Context(), &csi.CreateVolumeGroupSnapshotRequest{Name: "gs", SourceVolumeIds: []string{v1, v2}})
	if err != nil {
		t.Fatal(err)
	}
	m := resp.GetGroupSnapshot().GetSnapshots()
	gc := func(referenced ...string) []volstatus.Orphan {
		out, err := c.Collect(t.Context(), volstatus.GCRequest{Referenced: append([]string{v1, v2}, referenced...), Volumes: true, Snapshots: true, Delete: true})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	out := gc(m[0].GetSnapshotId())
	if len(out) != 1 || out[0].ID != m[1].GetSnapshotId() || out[0].Deleted || !strings.Contains(out[0].Kept, "gs_node") {
		t.Errorf("gc with one member referenced: got %+v, want the other kept, naming its group", out)
	}
	out = gc()
	if len(out) != 2 || !out[0].Deleted || !out[1].Deleted {
		t.Errorf("gc with no member referenced: got %+v, want both deleted", out)
	}
}

// many returns n distinct volume IDs of this node.
func many(n int) []string {
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("v%d_node", i))
	}
	return ids
}

// TestGroupSpaceIsPromisedTogether checks that a group whose members each
// fit in the pool but not together is RESOURCE_EXHAUSTED before anything
// is asked or copied, on a pool that copies data (a tmpfs).
func TestGroupSpaceIsPromisedTogether(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=80m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	p := pool.New(store, pool.Options{Dir: dir, Ratio: 1, Guard: &capacity.Guard{Percent: 5}, CopyMode: devices.CopySparse})
	t.Cleanup(p.Close)
	c := New(pool.NewPools(store, p), store, map[string]string{contract.TopologyKey: "node"}, Options{})
	taker := serveSnapshots(t, c)
	var vols []string
	for _, name := range []string{"v1", "v2"} {
		resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: capMount,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 24 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		vols = append(vols, resp.GetVolume().GetVolumeId())
	}
	// 80 MiB, 48 of them the volumes': room for one copy of 24, not two.
	_, err = c.Groups().CreateVolumeGroupSnapshot(t.Context(), &csi.CreateVolumeGroupSnapshotRequest{Name: "gs", SourceVolumeIds: vols})
	if rpcerr.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "together") {
		t.Errorf("a group too large together: got %v, want RESOURCE_EXHAUSTED saying the members need it together", err)
	}
	if len(taker.asked) != 0 {
		t.Errorf("asked %v, want nothing", taker.asked)
	}
}

// TestGroupSnapshotCap checks the class's per-volume cap on a group's
// members: a group one of whose volumes has as many snapshots as the cap
// is RESOURCE_EXHAUSTED naming that volume, and asks for nothing; under
// the cap it is taken; a retry of a group that exists answers with it
// whatever the cap; an invalid cap is INVALID_ARGUMENT naming the key.
func TestGroupSnapshotCap(t *testing.T) {
	c, _, _ := newController(t)
	taker := serveSnapshots(t, c)
	g := c.Groups()
	v1, v2 := create(t, c, "v1"), create(t, c, "v2")
	if _, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "alone", SourceVolumeId: v2}); err != nil {
		t.Fatal(err)
	}
	group := func(limit string) (*csi.VolumeGroupSnapshot, error) {
		params := map[string]string{contract.GroupDeletionPolicyKey: "Delete", contract.MaxSnapshotsPerVolumeKey: limit}
		resp, err := g.CreateVolumeGroupSnapshot(t.Context(), &csi.CreateVolumeGroupSnapshotRequest{Name: "gs", SourceVolumeIds: []string{v1, v2}, Parameters: params})
		return resp.GetGroupSnapshot(), err
	}
	asked := len(taker.asked)
	_, err := group("1")
	if rpcerr.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), v2+" has 1 snapshot(s)") || !strings.Contains(err.Error(), contract.MaxSnapshotsPerVolumeKey+" is 1") {
		t.Errorf("a group of a volume at the cap: got %v, want RESOURCE_EXHAUSTED naming %s, its 1 snapshot and the cap", err, v2)
	}
	if len(taker.asked) != asked {
		t.Errorf("a refused group: asked %v, want nothing more", taker.asked[asked:])
	}
	first, err := group("2")
	if err != nil || len(first.GetSnapshots()) != 2 {
		t.Fatalf("a group under the cap: got %v, %v; want a group of two", first, err)
	}
	if again, err := group("1"); err != nil || again.GetGroupSnapshotId() != first.GetGroupSnapshotId() || len(again.GetSnapshots()) != 2 {
		t.Errorf("a retry of the group past the cap: got %v, %v; want the group as it was", again, err)
	}
	for _, bad := range []string{"0", "-1", "x", "1.5"} {
		if _, err := group(bad); rpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), contract.MaxSnapshotsPerVolumeKey) {
			t.Errorf("a cap of %q: got %v, want INVALID_ARGUMENT naming %s", bad, err, contract.MaxSnapshotsPerVolumeKey)
		}
	}
}

package controller

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
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

// instantTaker takes a snapshot at once when asked, recording what the
// reconciler would of the volume's record, and records what it was asked.
type instantTaker struct {
	t     *testing.T
	home  *pool.Pool
	store Store
	asked []string
}

func (f *instantTaker) AskSnapshot(source, id string, group *state.GroupIntent) (int64, error) {
	f.asked = append(f.asked, source+"/"+id)
	if group == nil {
		return 1, f.take(source, id, "")
	}
	for _, vol := range group.VolumeIDs() {
		if err := f.take(vol, group.Members[vol], group.ID); err != nil {
			return 0, err
		}
	}
	return 1, nil
}

func (f *instantTaker) take(source, id, group string) error {
	v, err := f.store.Get(source)
	if err != nil {
		v = &state.Volume{ID: source}
	}
	of := devices.SnapshotOf{Source: source, FsType: v.Formatted, Access: string(v.WrittenAs()), Group: group}
	_, err = f.home.Take(context.Background(), id, f.home.Image(source), of, time.Unix(0, 0))
	return err
}

func (f *instantTaker) AwaitSnapshot(context.Context, string, string, int64) error { return nil }

func serveSnapshots(t *testing.T, c *Controller) *instantTaker {
	t.Helper()
	taker := &instantTaker{t: t, home: defaultPool(c), store: c.store}
	c.ServeSnapshots(taker)
	return taker
}

// TestSnapshotIDs checks that a snapshot's ID names its node, fits the
// CSI limit whatever the name's length (two long names that differ only
// at their end stay apart), and that a snapshot of another node is
// refused for a restore naming that node.
func TestSnapshotIDs(t *testing.T) {
	c, _, _ := newController(t)
	serveSnapshots(t, c)
	if got := c.localID("s1"); got != "s1_node" || nodeOf(got) != "node" {
		t.Errorf("localID(s1): got %q (node %q), want s1_node", got, nodeOf(got))
	}
	long1, long2 := strings.Repeat("a", 128), strings.Repeat("a", 127)+"b"
	id1, id2 := c.localID(long1), c.localID(long2)
	if contract.ValidID(id1) != nil || contract.ValidID(id2) != nil || id1 == id2 || nodeOf(id1) != "node" {
		t.Errorf("long names: got IDs %q and %q, want two valid, distinct IDs of node", id1, id2)
	}
	_, _, err := c.restoreSource("s1_elsewhere")
	if rpcerr.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "elsewhere") {
		t.Errorf("restoring another node's snapshot: got %v, want RESOURCE_EXHAUSTED naming the node", err)
	}
}

// TestDeleteSnapshotWhileRestoring checks that a snapshot a volume is
// being restored from is not deleted (ABORTED, retried), and is once the
// restore ended.
func TestDeleteSnapshotWhileRestoring(t *testing.T) {
	started, gate := make(chan struct{}), make(chan struct{})
	c, _, _ := newControllerCopying(t, gatedCopy(started, gate))
	id := snapshotted(t, c)
	restored := make(chan error, 1)
	go func() {
		_, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: capMount,
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}})
		restored <- err
	}()
	<-started
	_, err := c.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: id})
	if rpcerr.Code(err) != codes.Aborted {
		t.Errorf("deleting a snapshot being restored: got %v, want ABORTED", err)
	}
	close(gate)
	if err := <-restored; err != nil {
		t.Fatalf("the restore: %v", err)
	}
	if _, err := c.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
		t.Errorf("deleting it once the restore ended: %v", err)
	}
	if taken, _ := defaultPool(c).Taken(id); taken {
		t.Error("the snapshot is still there")
	}
}

// TestSnapshotTopology checks that a snapshot says it is usable on this
// node alone, in CreateSnapshot's answer and in ListSnapshots', when the
// alpha SnapshotTopology is on and says nothing when it is off (CSI allows
// the field only beside its alpha capability), and that a requisite
// topology without this node is RESOURCE_EXHAUSTED before any snapshot is
// taken either way.
func TestSnapshotTopology(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("SnapshotTopology=%t", on), func(t *testing.T) { testSnapshotTopology(t, on) })
	}
}

func testSnapshotTopology(t *testing.T, on bool) {
	c, _, _ := newController(t)
	c.opts.SnapshotTopology = on
	taker := serveSnapshots(t, c)
	v1 := create(t, c, "v1")
	here := &csi.Topology{Segments: map[string]string{contract.TopologyKey: "node"}}
	elsewhere := &csi.Topology{Segments: map[string]string{contract.TopologyKey: "other"}}

	_, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s0", SourceVolumeId: v1,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{elsewhere}}})
	if rpcerr.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "node") {
		t.Errorf("requisite of another node: got %v, want RESOURCE_EXHAUSTED naming this node", err)
	}
	if len(taker.asked) != 0 {
		t.Errorf("requisite of another node: the reconciler was asked for %v, want nothing", taker.asked)
	}

	resp, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: v1,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{elsewhere, here}, Preferred: []*csi.Topology{here}}})
	if err != nil {
		t.Fatal(err)
	}
	list, err := c.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SnapshotId: resp.GetSnapshot().GetSnapshotId()})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots: got %v, %v, want one entry", list, err)
	}
	for name, snap := range map[string]*csi.Snapshot{"CreateSnapshot": resp.GetSnapshot(), "ListSnapshots": list.GetEntries()[0].GetSnapshot()} {
		topo := snap.GetAccessibleTopology()
		if on && (len(topo) != 1 || !proto.Equal(topo[0], here)) {
			t.Errorf("%s: got accessible topology %v, want [%v]", name, topo, here)
		}
		if !on && topo != nil {
			t.Errorf("%s: got accessible topology %v, want none", name, topo)
		}
	}
}

// TestSnapshotAskedIsPromised checks that a snapshot asked for and not yet
// taken is promised what its copy takes: the space that can be promised
// drops by the image's allocated blocks from the moment the intent is in
// the volume's record, and comes back once it is gone.
func TestSnapshotAskedIsPromised(t *testing.T) {
	c, store, images := newController(t)
	serveSnapshots(t, c)     // copies sparsely: the image's blocks
	v1 := create(t, c, "v1") // thick: every block allocated
	u, err := images.Usage(v1)
	if err != nil {
		t.Fatal(err)
	}
	before, _, err := defaultPool(c).Account()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Update(v1, func(v *state.Volume) error {
		v.Snapshots = map[string]*state.SnapshotIntent{"s1_node": {Generation: 1}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	during, _, err := defaultPool(c).Account()
	if err != nil {
		t.Fatal(err)
	}
	if during.Copying != u.Allocated || u.Allocated == 0 {
		t.Errorf("a snapshot asked of a volume with %d bytes allocated: %d bytes copying, want them all", u.Allocated, during.Copying)
	}
	// The free space may move a little between the two reads (other
	// writers of the filesystem); the copy's promise is far larger.
	if drop := before.ThickAvailable() - during.ThickAvailable(); drop < u.Allocated/2 {
		t.Errorf("a snapshot asked for: thick available dropped by %d bytes, want about %d", drop, u.Allocated)
	}
	if _, err := store.Update(v1, func(v *state.Volume) error { v.Snapshots = nil; return nil }); err != nil {
		t.Fatal(err)
	}
	after, _, err := defaultPool(c).Account()
	if err != nil {
		t.Fatal(err)
	}
	if after.Copying != 0 {
		t.Errorf("no snapshot asked for: %d bytes copying, want 0", after.Copying)
	}
}

// TestRestoreOutlivesItsRequest holds a restore's copy up: the request
// that began it answers DEADLINE_EXCEEDED when its context ends while the
// copy goes on; meanwhile other volumes are made without waiting for it,
// the copy's size is promised, and the volume cannot be deleted. A retry
// waits for the copy and answers with the volume, whole. A copy that
// fails answers its retry with the failure, and the volume is not made.
func TestRestoreOutlivesItsRequest(t *testing.T) {
	started, gate := make(chan string, 1), make(chan error)
	// The held copy has written 1 MiB so far, in the file a copy is made
	// in; it goes when the copy is let go.
	var copiedSoFar, source int64
	made, release := make(chan string, 1), make(chan struct{})
	held := func(ctx context.Context, into *pool.Pool, id string, from *pool.Pool, snap devices.SnapshotInfo, size int64, thick bool) error {
		tmp, err := devices.CopyTemp(into.Image(id))
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		_, err = tmp.Write(bytes.Repeat([]byte("x"), 1<<20))
		if err == nil {
			err = tmp.Sync()
		}
		var st unix.Stat_t
		if err == nil {
			err = unix.Fstat(int(tmp.Fd()), &st)
		}
		tmp.Close()
		if err != nil {
			return err
		}
		copiedSoFar, source = st.Blocks*512, snap.Allocated
		started <- id
		if err := <-gate; err != nil {
			return err
		}
		os.Remove(tmp.Name())
		if err := pool.CopySnapshot(ctx, into, id, from, snap, size, thick); err != nil {
			return err
		}
		// The image is made and the restore not yet over.
		made <- id
		<-release
		return nil
	}
	c, store, images := newControllerCopying(t, held)
	serveSnapshots(t, c)
	v1 := create(t, c, "v1")
	// 2 MiB of data in the volume, which its snapshot holds and a restore
	// copies.
	f, err := os.OpenFile(images.Path(v1), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(bytes.Repeat([]byte("d"), 2<<20))
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: v1})
	if err != nil {
		t.Fatal(err)
	}
	restore := func(ctx context.Context, name string) (*csi.CreateVolumeResponse, error) {
		resp, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: capMount,
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}})
		return resp, rpcerr.ToGRPC(err)
	}
	// What is promised to thick volumes: a sum of sizes, unlike what is
	// available, which follows the free space that other tests change.
	promised := func() (promised, owed int64) {
		t.Helper()
		acc, _, err := defaultPool(c).Account()
		if err != nil {
			t.Fatal(err)
		}
		return acc.ThickPromised, acc.ThickOwed
	}
	before, owedBefore := promised()

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = restore(ctx, "r1")
	if rpcerr.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "still being restored") {
		t.Fatalf("the request whose deadline ended during the copy: got %v, want DEADLINE_EXCEEDED saying the restore goes on", err)
	}
	r1 := <-started
	// What the copy wrote so far is out of the free space already: it is
	// owed no more.
	if during, owed := promised(); during != before+pool.MinVolumeSize || owed != owedBefore+pool.MinVolumeSize-copiedSoFar || copiedSoFar < 1<<20 {
		t.Errorf("during the copy, %d bytes are promised to thick volumes and %d owed, %d and %d before: want the copy's %d more promised and %d more owed (%d copied so far)",
			during, owed, before, owedBefore, pool.MinVolumeSize, pool.MinVolumeSize-copiedSoFar, copiedSoFar)
	}
	if got := defaultPool(c).Restoring(); len(got) != 1 || got[0].VolumeID != r1 || got[0].SnapshotID != snap.GetSnapshot().GetSnapshotId() || got[0].Bytes != pool.MinVolumeSize ||
		got[0].SourceBytes != source || got[0].Copied != copiedSoFar || source < 2<<20 {
		t.Errorf("restores under way: got %+v, want %s from %s, %d bytes, %d of its %d (at least 2 MiB) copied",
			got, r1, snap.GetSnapshot().GetSnapshotId(), pool.MinVolumeSize, copiedSoFar, source)
	}
	v2 := create(t, c, "v2")
	v2Size, err := images.Size(v2)
	if err != nil {
		t.Fatalf("no volume made during the copy: %v", err)
	}
	if _, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: r1}); rpcerr.Code(err) != codes.Aborted {
		t.Errorf("deleting the volume during its copy: got %v, want ABORTED", err)
	}
	retried := make(chan error, 1)
	var resp *csi.CreateVolumeResponse
	go func() {
		var err error
		resp, err = restore(t.Context(), "r1")
		retried <- err
	}()
	select {
	case err := <-retried:
		t.Fatalf("the retry answered before the copy ended: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	gate <- nil
	<-made
	// Between the copy becoming the image and the restore's end, the
	// image counts, the restore no more: once, not twice.
	if during, owed := promised(); during != before+pool.MinVolumeSize+v2Size || owed != owedBefore {
		t.Errorf("with the image made, %d bytes are promised to thick volumes and %d owed: want %d and %d",
			during, owed, before+pool.MinVolumeSize+v2Size, owedBefore)
	}
	close(release)
	if err := <-retried; err != nil || resp.GetVolume().GetVolumeId() != r1 {
		t.Fatalf("the retry after the copy: got %v, %v; want volume %s", resp, err, r1)
	}
	if size, err := images.Size(r1); err != nil || size != pool.MinVolumeSize {
		t.Errorf("the restored image: %d bytes, %v; want %d", size, err, pool.MinVolumeSize)
	}
	if got := defaultPool(c).Restoring(); len(got) != 0 {
		t.Errorf("restores under way after the copy: %+v", got)
	}

	// A copy that fails.
	go func() { <-started; gate <- errors.New("copy failed") }()
	if _, err := restore(t.Context(), "r2"); err == nil || !strings.Contains(err.Error(), "copy failed") {
		t.Errorf("a failed copy: got %v, want its failure", err)
	}
	r2 := c.localID("r2")
	if _, err := images.Size(r2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed copy left an image: %v", err)
	}
	if v, err := store.Get(r2); err == nil && v.Provisioning != "" {
		t.Errorf("a failed copy left the record of a volume made %s", v.Provisioning)
	}
}

// TestDeleteSnapshotWaitsForALeftOutPool: while a configured pool is left
// out (its disk not mounted), a snapshot found in no served pool may be in
// it: its deletion is UNAVAILABLE (retried) rather than done, which would
// drop its content and keep its file; with every pool served, it is done.
func TestDeleteSnapshotWaitsForALeftOutPool(t *testing.T) {
	c, store, _ := newController(t)
	id := snapshotted(t, c)
	if _, err := c.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
		t.Fatalf("deleting the snapshot: %v", err)
	}
	// The same node with a pool fast configured, whose directory is on
	// the default pool's filesystem: fast is left out.
	fast := filepath.Join(t.TempDir(), "fast")
	if err := os.MkdirAll(fast, 0o700); err != nil {
		t.Fatal(err)
	}
	pools, err := pool.Open(store, []pool.Options{{Name: state.DefaultPool, Dir: defaultPool(c).Dir(), Ratio: 1}, {Name: "fast", Dir: fast, Ratio: 1}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pools.Close)
	if got := pools.UnservedNames(); len(got) != 1 || got[0] != "fast" {
		t.Fatalf("pools left out: got %v, want fast", got)
	}
	left := New(pools, store, c.topology, c.opts)
	serveSnapshots(t, left)
	_, err = left.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: id})
	if rpcerr.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "fast") {
		t.Errorf("deleting a snapshot found nowhere while pool fast is left out: got %v, want UNAVAILABLE naming fast", err)
	}
	if _, err := c.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
		t.Errorf("deleting a snapshot found nowhere with every pool served: got %v, want it done", err)
	}
}

// capped is a snapshot class's parameters with a per-volume cap of n.
func capped(n string) map[string]string {
	return map[string]string{contract.MaxSnapshotsPerVolumeKey: n, "csi.storage.k8s.io/volumesnapshot/name": "vs"}
}

// TestSnapshotCapPerVolume checks the class's cap on a volume's snapshots:
// one more than the cap is RESOURCE_EXHAUSTED naming the volume, the
// count and the cap, and asks the reconciler for nothing; a retry of a
// snapshot that exists answers with it at the cap; the cap is per volume;
// a snapshot asked for and not yet taken counts, but not for its own
// retry; a deletion frees a place; without the parameter there is no cap.
func TestSnapshotCapPerVolume(t *testing.T) {
	c, store, _ := newController(t)
	taker := serveSnapshots(t, c)
	v1, v2 := create(t, c, "v1"), create(t, c, "v2")
	snap := func(name, source string, params map[string]string) (*csi.Snapshot, error) {
		resp, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source, Parameters: params})
		return resp.GetSnapshot(), err
	}
	first, err := snap("s1", v1, capped("2"))
	if err != nil {
		t.Fatalf("the first snapshot under a cap of 2: %v", err)
	}
	if _, err := snap("s2", v1, capped("2")); err != nil {
		t.Fatalf("the second snapshot under a cap of 2: %v", err)
	}
	asked := len(taker.asked)
	_, err = snap("s3", v1, capped("2"))
	if rpcerr.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), v1) || !strings.Contains(err.Error(), "has 2 snapshot(s)") ||
		!strings.Contains(err.Error(), contract.MaxSnapshotsPerVolumeKey+" is 2") {
		t.Errorf("a third snapshot under a cap of 2: got %v, want RESOURCE_EXHAUSTED naming %s, its 2 snapshots and the cap", err, v1)
	}
	if len(taker.asked) != asked {
		t.Errorf("a refused snapshot: the reconciler was asked for %v, want nothing more", taker.asked[asked:])
	}
	if again, err := snap("s1", v1, capped("2")); err != nil || again.GetSnapshotId() != first.GetSnapshotId() || !again.GetCreationTime().AsTime().Equal(first.GetCreationTime().AsTime()) {
		t.Errorf("a retry of s1 at the cap: got %v, %v; want the snapshot as it was, %v", again, err, first)
	}
	if _, err := snap("t1", v2, capped("2")); err != nil {
		t.Errorf("a snapshot of another volume under the cap: %v", err)
	}
	// A snapshot of v2 asked for and not yet taken takes the last place.
	if _, err := store.Update(v2, func(v *state.Volume) error {
		v.Snapshots = map[string]*state.SnapshotIntent{c.localID("s4"): {Generation: 1}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := snap("s5", v2, capped("2")); rpcerr.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "has 2 snapshot(s)") {
		t.Errorf("a snapshot beside one being taken, at the cap: got %v, want RESOURCE_EXHAUSTED counting 2", err)
	}
	if _, err := snap("s4", v2, capped("2")); err != nil {
		t.Errorf("a retry of the snapshot being taken, at the cap: %v", err)
	}
	if _, err := c.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: first.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := snap("s6", v1, capped("2")); err != nil {
		t.Errorf("a snapshot once one was deleted: %v", err)
	}
	for i := range 3 {
		if _, err := snap(fmt.Sprintf("free%d", i), v1, nil); err != nil {
			t.Errorf("snapshot %d beyond the cap of another class, without the parameter: %v", i+3, err)
		}
	}
	// A retry answers with what exists even past the cap (a class of
	// another cap took the others): the name is looked up first.
	if _, err := snap("free0", v1, capped("1")); err != nil {
		t.Errorf("a retry of a snapshot of a volume past the cap: %v", err)
	}
}

// TestSnapshotCapParameter checks that a cap that is not a positive whole
// number is INVALID_ARGUMENT naming the parameter and its value, before
// anything is asked of the reconciler, and that a valid one is accepted
// beside Kubernetes' own keys.
func TestSnapshotCapParameter(t *testing.T) {
	c, _, _ := newController(t)
	taker := serveSnapshots(t, c)
	v1 := create(t, c, "v1")
	for _, bad := range []string{"0", "-1", "x", "1.5", "", "+2", "1e3"} {
		t.Run(fmt.Sprintf("%q", bad), func(t *testing.T) {
			_, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: v1, Parameters: capped(bad)})
			if rpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), contract.MaxSnapshotsPerVolumeKey) || !strings.Contains(err.Error(), fmt.Sprintf("%q is not", bad)) {
				t.Errorf("got %v, want INVALID_ARGUMENT naming %s and %q", err, contract.MaxSnapshotsPerVolumeKey, bad)
			}
		})
	}
	if len(taker.asked) != 0 {
		t.Errorf("invalid caps: the reconciler was asked for %v, want nothing", taker.asked)
	}
	if _, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: v1, Parameters: capped("3")}); err != nil {
		t.Errorf("a cap of 3: %v", err)
	}
	_, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "t", SourceVolumeId: v1, Parameters: map[string]string{"converge.csi.dev/max-snapshots": "3"}})
	if rpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "converge.csi.dev/max-snapshots") {
		t.Errorf("a misspelt key: got %v, want INVALID_ARGUMENT naming it", err)
	}
}

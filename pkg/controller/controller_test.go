package controller

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

func newController(t *testing.T) (*Controller, *state.Store, *devices.Images) {
	t.Helper()
	return newControllerCopying(t, nil)
}

// newControllerCopying is newController whose restores copy by copy (nil:
// pool.CopySnapshot), which a test holds up or fails.
func newControllerCopying(t *testing.T, copy pool.CopyFunc) (*Controller, *state.Store, *devices.Images) {
	t.Helper()
	dir := t.TempDir()
	store, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	images := &devices.Images{Dir: filepath.Join(dir, "volumes")}
	if err := os.MkdirAll(images.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := pool.New(store, pool.Options{Dir: images.Dir, Ratio: 1, Guard: &capacity.Guard{Percent: 5}, CopyMode: devices.CopySparse, Copy: copy})
	t.Cleanup(p.Close)
	return New(pool.NewPools(store, p), store, map[string]string{contract.TopologyKey: "node"}, Options{ModifyVolume: true}), store, images
}

var capMount = capMountOf("")

// capMountOf asks for a single-writer filesystem volume of fs type fs
// ("": the class's, else the default).
func capMountOf(fs string) []*csi.VolumeCapability {
	return []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}}
}

// create makes a thick volume named name and returns its ID.
func create(t *testing.T, c csi.ControllerServer, name string) string {
	t.Helper()
	resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: capMount,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pool.MinVolumeSize}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

// TestDeleteVolumeMarksBeforeItRemoves checks the deletion of a volume's
// image: refused while an intent uses it, the record marked before the
// image goes, and a deletion interrupted after the mark (a crash) finished
// by the next DeleteVolume or CreateVolume of the name, so that a volume
// made again under the name never inherits the old one's provenance.
func TestDeleteVolumeMarksBeforeItRemoves(t *testing.T) {
	c, store, images := newController(t)
	id := create(t, c, "v")
	if _, err := store.Update(id, func(v *state.Volume) error {
		v.Stage, v.Formatted = &state.Stage{Path: "/k/s"}, "ext4"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id})
	if code := rpcerr.Code(err); code != codes.FailedPrecondition {
		t.Errorf("deleting a staged volume: %v, want FailedPrecondition", err)
	}
	if _, err := images.Size(id); err != nil {
		t.Errorf("the image of a staged volume went: %v", err)
	}

	// A crash after the mark, before the image went: the record holds
	// the mark and the old provenance, the image is still there.
	if _, err := store.Update(id, func(v *state.Volume) error {
		v.Stage = nil
		return v.StartRemoval()
	}); err != nil {
		t.Fatal(err)
	}
	if again := create(t, c, "v"); again != id {
		t.Errorf("the name made again: ID %s, want %s", again, id)
	}
	v, err := store.Get(id)
	if err != nil || v.Removing || v.Formatted != "" || v.Provisioning != state.ProvisionThick {
		t.Errorf("after CreateVolume finished an interrupted deletion, the record is %+v (%v), want a new thick volume's", v, err)
	}

	if _, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Size(id); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image after DeleteVolume: %v", err)
	}
	if _, err := store.Get(id); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("record after DeleteVolume: %v", err)
	}
	if _, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("deleting again: %v", err)
	}
}

// TestGrowImage checks the growth the node's reconciler asks for: within
// the promise (the new space of a thick image allocated, of a thin one
// not), never shrinking, and what the data directory cannot hold refused
// with the image as it was.
func TestGrowImage(t *testing.T) {
	c, _, images := newController(t)
	v := create(t, c, "v")
	total, free, err := images.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		id       string
		size     int64
		want     int64
		wantKind classified.Kind // of the error; KindInternal for none
	}{
		{name: "grows, rounded to whole blocks", id: v, size: 2*pool.MinVolumeSize + 1, want: 2*pool.MinVolumeSize + pool.SizeAlign},
		{name: "never shrinks", id: v, size: pool.MinVolumeSize, want: 2*pool.MinVolumeSize + pool.SizeAlign},
		{name: "more than is free", id: v, size: free + (64 << 20), wantKind: classified.KindResourceExhausted},
		{name: "more than the filesystem", id: v, size: total + (1 << 30), wantKind: classified.KindOutOfRange},
		{name: "unknown volume", id: "nope", size: 2 * pool.MinVolumeSize, wantKind: classified.KindNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := images.Size(tc.id)
			got, err := defaultPool(c).GrowImage(tc.id, tc.size)
			if tc.wantKind != classified.KindInternal {
				if e := classified.AsError(err); err == nil || e.Kind != tc.wantKind {
					t.Fatalf("got %d, %v; want a %s error", got, err, tc.wantKind)
				}
				if after, _ := images.Size(tc.id); after != before {
					t.Errorf("image size after a refusal: got %d, want %d", after, before)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
			if size, _ := images.Size(tc.id); size != tc.want {
				t.Errorf("image size: got %d, want %d", size, tc.want)
			}
		})
	}
	usages, err := images.Usages()
	if err != nil || len(usages) != 1 {
		t.Fatalf("usages: %v, %v", usages, err)
	}
	if u := usages[0]; u.Allocated < u.Size {
		t.Errorf("thick image after growth: %d of %d bytes allocated, want all", u.Allocated, u.Size)
	}

	// A thin volume grows without allocating.
	resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "thin", VolumeCapabilities: capMount,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pool.MinVolumeSize}, Parameters: map[string]string{contract.ProvisioningKey: "thin"}})
	if err != nil {
		t.Fatal(err)
	}
	thin := resp.GetVolume().GetVolumeId()
	if _, err := defaultPool(c).GrowImage(thin, 4*pool.MinVolumeSize); err != nil {
		t.Fatal(err)
	}
	usages, _ = images.Usages()
	for _, u := range usages {
		if u.ID == thin && (u.Size != 4*pool.MinVolumeSize || u.Allocated >= u.Size) {
			t.Errorf("thin image after growth: %d of %d bytes allocated, want a sparse %d", u.Allocated, u.Size, 4*pool.MinVolumeSize)
		}
	}
}

// TestControllerExpandVolume checks the controller's part of an
// expansion: a volume on this node grows here (the node then grows the
// device and the filesystem), one that is not answers with the size asked
// for and leaves the whole growth to its node, and bad input is refused.
func TestControllerExpandVolume(t *testing.T) {
	c, _, images := newController(t)
	v := create(t, c, "v")
	expand := func(id string, required, limit int64) (*csi.ControllerExpandVolumeResponse, error) {
		return c.ControllerExpandVolume(t.Context(), &csi.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}})
	}
	resp, err := expand(v, 2*pool.MinVolumeSize, 0)
	if err != nil || resp.GetCapacityBytes() != 2*pool.MinVolumeSize || !resp.GetNodeExpansionRequired() {
		t.Errorf("a volume of this node: got %v, %v; want %d bytes and node expansion", resp, err, 2*pool.MinVolumeSize)
	}
	if size, _ := images.Size(v); size != 2*pool.MinVolumeSize {
		t.Errorf("its image: %d bytes, want %d", size, 2*pool.MinVolumeSize)
	}
	resp, err = expand("elsewhere", 3*pool.MinVolumeSize, 0)
	if err != nil || resp.GetCapacityBytes() != 3*pool.MinVolumeSize || !resp.GetNodeExpansionRequired() {
		t.Errorf("a volume of another node: got %v, %v; want %d bytes and node expansion", resp, err, 3*pool.MinVolumeSize)
	}
	if _, err := images.Size("elsewhere"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an image was made for a volume of another node: %v", err)
	}
	for _, tc := range []struct {
		name            string
		id              string
		required, limit int64
		want            classified.Kind
	}{
		{"no ID", "", 1 << 30, 0, classified.KindInvalidArgument},
		{"an ID no volume can have", "../v", 1 << 30, 0, classified.KindNotFound},
		{"8 EiB", v, 1<<63 - 1, 0, classified.KindOutOfRange},
		{"a limit below the volume's size", v, pool.MinVolumeSize, pool.MinVolumeSize, classified.KindOutOfRange},
	} {
		if _, err := expand(tc.id, tc.required, tc.limit); classified.AsError(err) == nil || classified.AsError(err).Kind != tc.want {
			t.Errorf("%s: got %v, want %s", tc.name, err, tc.want)
		}
	}
}

// TestVolumeIDsNameTheirNode checks that a volume's ID is its name and its
// node's, that a volume made before (its ID its name) is found by its name
// and keeps its ID, that a name whose ID such a volume holds is refused,
// and that a clone of a volume of another node is RESOURCE_EXHAUSTED
// naming that node, of a volume no node has NOT_FOUND.
func TestVolumeIDsNameTheirNode(t *testing.T) {
	c, _, images := newController(t)
	if id := create(t, c, "v"); id != "v_node" || nodeOf(id) != "node" {
		t.Errorf("ID of v: got %s (node %q), want v_node", id, nodeOf(id))
	}
	// Made by a converge whose volume IDs were their names.
	for _, old := range []string{"old", "a_node"} {
		if err := images.Create(old, pool.MinVolumeSize, false); err != nil {
			t.Fatal(err)
		}
	}
	if id := create(t, c, "old"); id != "old" {
		t.Errorf("CreateVolume of a volume made before: ID %s, want old", id)
	}
	_, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: capMount,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pool.MinVolumeSize}})
	if rpcerr.Code(err) != codes.AlreadyExists {
		t.Errorf("a name whose ID an older volume holds: got %v, want ALREADY_EXISTS", err)
	}
	// A node whose name leaves no room for any name: IDs are names.
	long := New(c.pools, c.store, map[string]string{contract.TopologyKey: strings.Repeat("n", 127)}, c.opts)
	if id := create(t, long, "w"); id != "w" {
		t.Errorf("ID on a node of a 127-byte name: got %s, want w", id)
	}
	serveSnapshots(t, c)
	for _, tc := range []struct {
		source string
		want   codes.Code
	}{
		{"w_other", codes.ResourceExhausted},
		{"nowhere", codes.NotFound},
	} {
		_, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: capMount,
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: tc.source}}}})
		if rpcerr.Code(err) != tc.want || tc.want == codes.ResourceExhausted && !strings.Contains(err.Error(), "node other") {
			t.Errorf("a clone of %s: got %v, want %s", tc.source, err, tc.want)
		}
	}
}

// defaultPool is the default pool of c.
func defaultPool(c *Controller) *pool.Pool { return c.pools.Get(state.DefaultPool) }

// gatedCopy returns a copy that closes started, then waits for gate to
// close before it copies.
func gatedCopy(started, gate chan struct{}) pool.CopyFunc {
	return func(ctx context.Context, into *pool.Pool, id string, from *pool.Pool, snap devices.SnapshotInfo, size int64, thick bool) error {
		close(started)
		<-gate
		return pool.CopySnapshot(ctx, into, id, from, snap, size, thick)
	}
}

// failingStages answers every withdrawal with err.
type failingStages struct{ err error }

func (f failingStages) WithdrawIdleStage(context.Context, string) (bool, error) { return false, f.err }

// TestDeleteVolumeAnswersTheUnstagesWait checks that a deletion whose wait
// for an unstage fails answers that failure and deletes nothing.
func TestDeleteVolumeAnswersTheUnstagesWait(t *testing.T) {
	c, store, images := newController(t)
	id := create(t, c, "v")
	c.WithdrawStagesBy(failingStages{classified.Errorf(classified.KindDeadlineExceeded, "volume %s not converged yet", id)})
	_, err := c.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id})
	if code := rpcerr.Code(err); code != codes.DeadlineExceeded {
		t.Errorf("deleting while the unstage is not done: %v, want DeadlineExceeded", err)
	}
	if _, err := images.Size(id); err != nil {
		t.Errorf("the image went: %v", err)
	}
	if v, err := store.Get(id); err != nil || v.Removing {
		t.Errorf("the record after the refused deletion: %+v, %v; want it kept, unmarked", v, err)
	}
}

package controller

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

var capBlock = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

// capBoth asks for a volume that may be staged either way.
var capBoth = append(append([]*csi.VolumeCapability{}, capMount...), capBlock...)

// allowing is the parameters of a class that allows a volume mode change.
var allowing = map[string]string{contract.AllowModeChangeKey: "true"}

// createWith makes volume name for caps from source and returns its ID.
func createWith(t *testing.T, c *Controller, name string, caps []*csi.VolumeCapability, params map[string]string, source *csi.VolumeContentSource) (string, error) {
	t.Helper()
	resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: caps, Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pool.MinVolumeSize}, VolumeContentSource: source})
	return resp.GetVolume().GetVolumeId(), err
}

func fromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func fromVolume(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// capsName names a set of capabilities in a test's name.
func capsName(caps []*csi.VolumeCapability) string {
	switch len(caps) {
	case 2:
		return "both"
	case 1:
		return modeName(capAccess(caps[0]))
	}
	return "none"
}

// wantModeRefusal fails unless err is the refusal of a volume mode change
// from one mode to the other, naming both and the parameter.
func wantModeRefusal(t *testing.T, what string, err error, from, to string) {
	t.Helper()
	if rpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "volume mode "+from) ||
		!strings.Contains(err.Error(), "volume mode "+to) || !strings.Contains(err.Error(), contract.AllowModeChangeKey) {
		t.Errorf("%s: got %v, want INVALID_ARGUMENT naming volume modes %s and %s and %s", what, err, from, to, contract.AllowModeChangeKey)
	}
}

// TestVolumeKeepsItsMode restores and clones volumes made for each access
// type into each: a volume of the other mode, or one that may be staged
// either way, is refused INVALID_ARGUMENT naming both modes and the
// parameter, and no image is made, unless the class allows the change; a
// volume of the same mode is made. A volume that may be staged either way
// counts as Block: it may have been written raw.
func TestVolumeKeepsItsMode(t *testing.T) {
	all := [][]*csi.VolumeCapability{capMount, capBlock, capBoth}
	for _, srcCaps := range all {
		for _, dstCaps := range all {
			for _, allow := range []bool{false, true} {
				name := fmt.Sprintf("%s to %s, allowed %v", capsName(srcCaps), capsName(dstCaps), allow)
				t.Run(name, func(t *testing.T) {
					c, _, images := newController(t)
					serveSnapshots(t, c)
					src, err := createWith(t, c, "src", srcCaps, nil, nil)
					if err != nil {
						t.Fatal(err)
					}
					snap, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: src})
					if err != nil {
						t.Fatal(err)
					}
					var params map[string]string
					if allow {
						params = allowing
					}
					from, to := modeName(accessOf(srcCaps)), modeName(state.AccessMount)
					if accessOf(srcCaps) == state.AccessMount {
						to = modeName(state.AccessBlock)
					}
					same := len(dstCaps) == 1 && accessOf(srcCaps) == accessOf(dstCaps)
					for how, source := range map[string]*csi.VolumeContentSource{"restore": fromSnapshot(snap.GetSnapshot().GetSnapshotId()), "clone": fromVolume(src)} {
						id, err := createWith(t, c, how, dstCaps, params, source)
						switch {
						case same || allow:
							if err != nil {
								t.Errorf("%s: %v", how, err)
							}
						default:
							wantModeRefusal(t, how, err, from, to)
							if _, err := images.Size(c.localID(how)); !errors.Is(err, os.ErrNotExist) {
								t.Errorf("%s refused: its image is there (%v)", how, err)
							}
							continue
						}
						if _, err := images.Size(id); err != nil {
							t.Errorf("%s: no image: %v", how, err)
						}
					}
				})
			}
		}
	}
}

// TestModeOfOldSnapshots restores snapshots taken before snapshots
// recorded how their volume was written: one that recorded a filesystem
// (the plugin formatted or mounted it) restores as a Filesystem volume
// and not as a Block one; one that recorded none restores as a Block
// volume and as a Filesystem volume only where the class allows it.
func TestModeOfOldSnapshots(t *testing.T) {
	c, _, images := newController(t)
	serveSnapshots(t, c)
	src := create(t, c, "src")
	snaps := defaultPool(c)
	for _, tc := range []struct {
		name   string
		fsType string
		ok     []*csi.VolumeCapability
		no     []*csi.VolumeCapability
		from   string
	}{
		{name: "formatted", fsType: "ext4", ok: capMount, no: capBlock, from: "Filesystem"},
		{name: "never-formatted", fsType: "", ok: capBlock, no: capMount, from: "Block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := c.localID("old-" + tc.name)
			if _, err := snaps.Take(t.Context(), id, images.Path(src), devices.SnapshotOf{Source: src, FsType: tc.fsType}, time.Unix(0, 0)); err != nil {
				t.Fatal(err)
			}
			_, err := createWith(t, c, tc.name+"-no", tc.no, nil, fromSnapshot(id))
			wantModeRefusal(t, "the other mode", err, tc.from, modeName(accessOf(tc.no)))
			if _, err := createWith(t, c, tc.name+"-allowed", tc.no, allowing, fromSnapshot(id)); err != nil {
				t.Errorf("the other mode, allowed: %v", err)
			}
			if _, err := createWith(t, c, tc.name+"-ok", tc.ok, nil, fromSnapshot(id)); err != nil {
				t.Errorf("the same mode: %v", err)
			}
		})
	}
}

// TestStagedRawIsBlock checks that a volume made for a filesystem whose
// record says it was staged as a raw block device (a second PV of the
// same volume, in volume mode Block) is cloned and snapshotted as a Block
// volume: its clone as a Filesystem volume is refused before any copy is
// taken, and its snapshot restores only as Block. A clone whose source is
// staged raw between the check of its record and its copy is refused by
// what the copy recorded, and the copy deleted.
func TestStagedRawIsBlock(t *testing.T) {
	c, store, _ := newController(t)
	taker := serveSnapshots(t, c)
	src := create(t, c, "src")
	if _, err := store.Update(src, func(v *state.Volume) error { v.Access = state.AccessBlock; return nil }); err != nil {
		t.Fatal(err)
	}
	_, err := createWith(t, c, "clone", capMount, nil, fromVolume(src))
	wantModeRefusal(t, "a clone as Filesystem", err, "Block", "Filesystem")
	if len(taker.asked) != 0 {
		t.Errorf("a clone refused by its source's record took %v, want no copy", taker.asked)
	}
	snap, err := c.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: src})
	if err != nil {
		t.Fatal(err)
	}
	_, err = createWith(t, c, "restore", capMount, nil, fromSnapshot(snap.GetSnapshot().GetSnapshotId()))
	wantModeRefusal(t, "a restore as Filesystem", err, "Block", "Filesystem")

	// The record says mount when the clone is asked for; the source is
	// staged raw before its copy is taken.
	other := create(t, c, "other")
	c.snapshots.taker = stagedRawFirst{instantTaker: taker, store: store}
	_, err = createWith(t, c, "late", capMount, nil, fromVolume(other))
	wantModeRefusal(t, "a clone of a volume staged raw meanwhile", err, "Block", "Filesystem")
	if all, err := os.ReadDir(filepath.Join(defaultPool(c).Dir(), "snapshots")); err != nil || len(all) != 1 {
		t.Errorf("snapshot files after the refused clone: %v (%v), want only %s", all, err, snap.GetSnapshot().GetSnapshotId())
	}
}

// stagedRawFirst records a stage as a raw block device in the volume's
// record, as the node does, before it takes the snapshot.
type stagedRawFirst struct {
	*instantTaker
	store *state.Store
}

func (s stagedRawFirst) AskSnapshot(source, id string, group *state.GroupIntent) (int64, error) {
	if _, err := s.store.Update(source, func(v *state.Volume) error { v.Access = state.AccessBlock; return nil }); err != nil {
		return 0, err
	}
	return s.instantTaker.AskSnapshot(source, id, group)
}

// TestModeIsPartOfTheVolume checks that CreateVolume of an existing name in
// the other volume mode is ALREADY_EXISTS (a restore or clone found made
// would otherwise answer for a mode it was never checked for), and in the
// same mode is the volume.
func TestModeIsPartOfTheVolume(t *testing.T) {
	c, _, _ := newController(t)
	for _, tc := range []struct{ made, asked []*csi.VolumeCapability }{{capBlock, capMount}, {capMount, capBlock}, {capMount, capBoth}} {
		name := "v-" + capsName(tc.made) + "-" + capsName(tc.asked)
		id, err := createWith(t, c, name, tc.made, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := createWith(t, c, name, tc.made, nil, nil); err != nil || again != id {
			t.Errorf("%s: the same request again: got %s, %v, want %s", name, again, err, id)
		}
		_, err = createWith(t, c, name, tc.asked, nil, nil)
		if want := "volume mode " + modeName(accessOf(tc.made)); rpcerr.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: the name again as %s: got %v, want ALREADY_EXISTS naming %s", name, capsName(tc.asked), err, want)
		}
	}
}

// TestAllowModeChangeParameter checks that CreateVolume takes "true" and
// "false" for the parameter and refuses any other value INVALID_ARGUMENT
// naming it, making nothing.
func TestAllowModeChangeParameter(t *testing.T) {
	c, _, images := newController(t)
	for _, v := range []string{"true", "false"} {
		if _, err := createWith(t, c, "v-"+v, capMount, map[string]string{contract.AllowModeChangeKey: v}, nil); err != nil {
			t.Errorf("%s=%s: %v", contract.AllowModeChangeKey, v, err)
		}
	}
	for _, v := range []string{"", "yes", "1", "True", "true "} {
		_, err := createWith(t, c, "odd", capMount, map[string]string{contract.AllowModeChangeKey: v}, nil)
		if rpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), contract.AllowModeChangeKey) {
			t.Errorf("%s=%q: got %v, want INVALID_ARGUMENT naming the parameter", contract.AllowModeChangeKey, v, err)
		}
	}
	if _, err := images.Size(c.localID("odd")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused volume's image: %v", err)
	}
}

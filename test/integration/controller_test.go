package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/test/testenv"
)

func TestControllerVolumes(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	c := p.Controller()
	req := func(name string, required, limit int64) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{
			Name:               name,
			CapacityRange:      &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit},
			VolumeCapabilities: []*csi.VolumeCapability{rwo},
		}
	}
	resp, err := c.CreateVolume(ctx(t), req("sized", 100<<20+1, 0))
	must(t, "create", err)
	if got := resp.GetVolume().GetCapacityBytes(); got != 100<<20+4096 {
		t.Errorf("capacity: got %d, want %d (rounded up to 4 KiB)", got, 100<<20+4096)
	}
	if seg := resp.GetVolume().GetAccessibleTopology()[0].GetSegments(); seg["topology.converge.csi.dev/node"] != "test-node" {
		t.Errorf("topology: got %v", seg)
	}
	if id := resp.GetVolume().GetVolumeId(); id != vid("sized") {
		t.Errorf("volume ID: got %s, want %s (the name and the node's)", id, vid("sized"))
	}
	fi, err := os.Stat(filepath.Join(p.DataDir, vid("sized")+".img"))
	must(t, "stat image", err)
	if fi.Size() != 100<<20+4096 {
		t.Errorf("image size: got %d", fi.Size())
	}

	_, err = c.CreateVolume(ctx(t), req("sized", 100<<20, 200<<20))
	must(t, "create again within range", err)
	_, err = c.CreateVolume(ctx(t), req("sized", 300<<20, 0))
	wantCode(t, "create again, larger", err, codes.AlreadyExists)
	_, err = c.CreateVolume(ctx(t), req("huge", 1<<63-1, 0))
	wantCode(t, "8 EiB (the largest int64)", err, codes.OutOfRange)
	_, err = c.CreateVolume(ctx(t), req("tight", 10<<20, 12<<20))
	wantCode(t, "limit below the minimum size", err, codes.OutOfRange)
	_, err = c.CreateVolume(ctx(t), req("bad/name", 0, 0))
	wantCode(t, "slash in name", err, codes.InvalidArgument)
	bad := req("params", 0, 0)
	bad.Parameters = map[string]string{"fancy": "yes"}
	_, err = c.CreateVolume(ctx(t), bad)
	wantCode(t, "unknown parameter", err, codes.InvalidArgument)
	elsewhere := req("elsewhere", 0, 0)
	elsewhere.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"topology.converge.csi.dev/node": "other"}}}}
	_, err = c.CreateVolume(ctx(t), elsewhere)
	wantCode(t, "requisite topology of another node", err, codes.ResourceExhausted)
	for _, name := range []string{"huge", "tight", "params", "elsewhere"} {
		if _, err := os.Stat(filepath.Join(p.DataDir, vid(name)+".img")); err == nil {
			t.Errorf("a failed CreateVolume left %s.img", name)
		}
	}

	// Paging returns every volume once, in order. The volumes are small:
	// thick ones are promised whole, and the host's free space above the
	// pool's guard is what it is.
	for i := range 5 {
		_, err := c.CreateVolume(ctx(t), req(fmt.Sprintf("page-%d", i), 64<<20, 0))
		must(t, "create page volume", err)
	}
	var seen []string
	token := ""
	for {
		lr, err := c.ListVolumes(ctx(t), &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		must(t, "list", err)
		if len(lr.GetEntries()) > 2 {
			t.Fatalf("page of %d entries, want at most 2", len(lr.GetEntries()))
		}
		for _, e := range lr.GetEntries() {
			seen = append(seen, e.GetVolume().GetVolumeId())
		}
		if token = lr.GetNextToken(); token == "" {
			break
		}
	}
	want := []string{vid("page-0"), vid("page-1"), vid("page-2"), vid("page-3"), vid("page-4"), vid("sized")}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("paged listing: got %v, want %v", seen, want)
	}
	_, err = c.ListVolumes(ctx(t), &csi.ListVolumesRequest{StartingToken: "bogus"})
	wantCode(t, "bogus token", err, codes.Aborted)

	capResp, err := c.GetCapacity(ctx(t), &csi.GetCapacityRequest{})
	must(t, "capacity", err)
	if capResp.GetAvailableCapacity() <= 0 {
		t.Errorf("available capacity: got %d", capResp.GetAvailableCapacity())
	}
	_, err = c.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: vid("sized")})
	must(t, "delete", err)
	_, err = c.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: vid("sized")})
	must(t, "delete again", err)
	_, err = c.ValidateVolumeCapabilities(ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vid("sized"), VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	wantCode(t, "validate deleted", err, codes.NotFound)
}

// TestManyVolumesAtOnce stages and publishes several volumes concurrently,
// which races the plugin's loop-device allocation and mounts against each
// other, then tears them all down concurrently.
func TestManyVolumesAtOnce(t *testing.T) {
	const n = 6
	p := testenv.New(t)
	p.Start()
	type vol struct{ id, staging, target string }
	vols := make([]vol, n)
	for i := range vols {
		id := create(t, p, fmt.Sprintf("many-%d", i))
		vols[i] = vol{
			id:      id,
			staging: mkdir(t, filepath.Join(p.Root, "staging", id)),
			target:  filepath.Join(mkdir(t, filepath.Join(p.Root, "pods", id)), "mount"),
		}
	}
	parallel := func(fn func(v vol) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for _, v := range vols {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := fn(v); err != nil {
					errs <- fmt.Errorf("%s: %w", v.id, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	parallel(func(v vol) error {
		if err := stage(t, p, v.id, v.staging, rwo); err != nil {
			return err
		}
		if err := publish(t, p, v.id, v.staging, v.target, false); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(v.target, "id"), []byte(v.id), 0o600)
	})
	devs := map[string]bool{}
	for _, v := range vols {
		dev, ok := mountAt(t, v.staging)
		if !ok || devs[dev] {
			t.Fatalf("%s: staging mount of %q (mounted %v); devices must be distinct", v.id, dev, ok)
		}
		devs[dev] = true
		if b, err := os.ReadFile(filepath.Join(v.target, "id")); err != nil || string(b) != v.id {
			t.Errorf("%s: read back %q, %v", v.id, b, err)
		}
	}
	parallel(func(v vol) error {
		if _, err := p.Node().NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
			return err
		}
		_, err := p.Node().NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
		return err
	})
	if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
		t.Errorf("after concurrent teardown: %v", left)
	}
}

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/test/testenv"
)

// fsBytes returns the size statfs reports for the filesystem at path.
func fsBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

type growCase struct {
	fs        string
	from, to  int64
	minGrowth int64
	// offline grows the volume while it is staged but not published, at
	// its staging path, as the kubelet does between stage and publish (an
	// ext4 then grows unmounted, without CAP_SYS_RESOURCE).
	offline bool
}

// TestExpansion grows volumes of each filesystem through NodeExpandVolume
// alone, as the kubelet asks it on the volume's node when the cluster's
// resizer runs on another node: the node grows the image, the device and
// the filesystem; statfs at the pod's target shows the new size and the data
// written before is intact. Online cases grow while the volume stays staged
// and published.
func TestExpansion(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	for _, tc := range []growCase{
		{fs: "ext4", from: 64 << 20, to: 192 << 20, minGrowth: 100 << 20},
		{fs: "ext4", from: 64 << 20, to: 192 << 20, minGrowth: 100 << 20, offline: true},
		{fs: "xfs", from: 320 << 20, to: 512 << 20, minGrowth: 150 << 20},
		{fs: "btrfs", from: 256 << 20, to: 512 << 20, minGrowth: 200 << 20},
	} {
		name := tc.fs + "/online"
		if tc.offline {
			name = tc.fs + "/staged-only"
		}
		t.Run(name, func(t *testing.T) {
			expandCase(t, p, tc)
		})
	}
}

func expandCase(t *testing.T, p *testenv.Plugin, tc growCase) {
	name := "grow-" + tc.fs
	if tc.offline {
		name += "-offline"
	}
	id := createSized(t, p, name, tc.from)
	staging := mkdir(t, filepath.Join(p.Root, "staging-"+id))
	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+id)), "mount")
	c := mountCap(tc.fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	publish := func() {
		_, err := p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c})
		must(t, "publish", err)
	}
	up := func() {
		must(t, "stage", stage(t, p, id, staging, c))
		publish()
	}
	up()
	must(t, "write", os.WriteFile(filepath.Join(target, "data"), []byte("before growth"), 0o600))
	before := fsBytes(t, target)

	path := target
	if tc.offline {
		unpublish(t, p, id, target)
		path = staging
	}
	expand := func() (*csi.NodeExpandVolumeResponse, error) {
		return p.Node().NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: path, CapacityRange: &csi.CapacityRange{RequiredBytes: tc.to}})
	}
	nresp, err := expand()
	if tc.fs == "ext4" && !tc.offline && !testenv.CanGrowExt4Online() {
		// Growing a mounted ext4 needs CAP_SYS_RESOURCE, which this
		// machine's root lacks (Kubernetes gives it to privileged pods).
		// Retrying cannot help: the request answers why at once, and the
		// filesystem grows at its next stage, before it is mounted. The
		// image and the device have grown already.
		wantCode(t, "online ext4 growth without CAP_SYS_RESOURCE", err, codes.FailedPrecondition)
		if err != nil && !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
			t.Errorf("online ext4 growth without CAP_SYS_RESOURCE: got %v, want the missing capability named", err)
		}
		if size := imageSize(t, p, id); size != tc.to {
			t.Errorf("image after the refused filesystem growth: %d bytes, want %d", size, tc.to)
		}
		unpublish(t, p, id, target)
		unstage(t, p, id, staging)
		up()
		nresp, err = expand()
	}
	must(t, "node expand", err)
	if tc.offline {
		publish()
	}
	if nresp.GetCapacityBytes() != tc.to {
		t.Errorf("node expand capacity: got %d, want %d", nresp.GetCapacityBytes(), tc.to)
	}
	if after := fsBytes(t, target); after-before < tc.minGrowth {
		t.Errorf("filesystem at the target: %d bytes before, %d after; want at least %d more", before, after, tc.minGrowth)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "before growth" {
		t.Errorf("data after growth: %q, %v", b, err)
	}
	// Asking again, or for less, is answered at once, and shrinks nothing.
	resp, err := p.Node().NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: staging, CapacityRange: &csi.CapacityRange{RequiredBytes: tc.from}})
	must(t, "node expand to a smaller size", err)
	if resp.GetCapacityBytes() != tc.to {
		t.Errorf("capacity after asking for less: got %d, want %d", resp.GetCapacityBytes(), tc.to)
	}
	unpublish(t, p, id, target)
	unstage(t, p, id, staging)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	must(t, "delete", err)
}

// TestControllerExpansionGrowsAtStage grows an unstaged ext4 volume as the
// cluster's resizer does when it runs beside the volume's node: the
// controller grows the image, and the next stage grows the filesystem before
// it mounts it (no CAP_SYS_RESOURCE needed), so that the kubelet's
// NodeExpandVolume after the publish has nothing left to do. The same call
// for a volume this node does not hold leaves the growth to its node.
func TestControllerExpansionGrowsAtStage(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	const from, to = 64 << 20, 192 << 20
	id := createSized(t, p, "grow-offline", from)
	staging := mkdir(t, filepath.Join(p.Root, "staging-"+id))
	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+id)), "mount")
	c := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	up := func() {
		must(t, "stage", stage(t, p, id, staging, c))
		_, err := p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c})
		must(t, "publish", err)
	}
	up()
	must(t, "write", os.WriteFile(filepath.Join(target, "data"), []byte("before growth"), 0o600))
	before := fsBytes(t, target)
	unpublish(t, p, id, target)
	unstage(t, p, id, staging)

	resp, err := p.Controller().ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: to}})
	must(t, "controller expand", err)
	if resp.GetCapacityBytes() != to || !resp.GetNodeExpansionRequired() || imageSize(t, p, id) != to {
		t.Fatalf("controller expand: got %v, image %d; want %d bytes, node expansion", resp, imageSize(t, p, id), to)
	}
	up()
	if after := fsBytes(t, target); after-before < 100<<20 {
		t.Errorf("filesystem after the stage: %d bytes, %d before; want at least 100 MiB more", after, before)
	}
	nresp, err := p.Node().NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: to}})
	must(t, "node expand after the publish", err)
	if nresp.GetCapacityBytes() != to {
		t.Errorf("node expand: capacity %d, want %d", nresp.GetCapacityBytes(), to)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "before growth" {
		t.Errorf("data after growth: %q, %v", b, err)
	}

	resp, err = p.Controller().ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: "on-another-node", CapacityRange: &csi.CapacityRange{RequiredBytes: to}})
	must(t, "controller expand of another node's volume", err)
	if resp.GetCapacityBytes() != to || !resp.GetNodeExpansionRequired() {
		t.Errorf("controller expand of another node's volume: got %v, want %d bytes and node expansion", resp, to)
	}
	if _, err := os.Stat(filepath.Join(p.DataDir, "on-another-node.img")); !os.IsNotExist(err) {
		t.Errorf("an image was made for another node's volume: %v", err)
	}
	unpublish(t, p, id, target)
	unstage(t, p, id, staging)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	must(t, "delete", err)
}

// imageSize returns the size of a volume's image file.
func imageSize(t *testing.T, p *testenv.Plugin, id string) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(p.DataDir, id+".img"))
	must(t, "stat image", err)
	return fi.Size()
}

// TestExpansionBeyondTheNode asks a published thick xfs volume (xfs grows
// online here) on a 1 GiB data directory to grow past what the node can hold: more than is free is
// RESOURCE_EXHAUSTED, more than the data directory's filesystem OUT_OF_RANGE,
// a limit below the volume's size OUT_OF_RANGE; each leaves the image, the
// mounts and the data as they were and the promise unchanged. The volume
// reports GrowFailed until a size that fits is asked for, which then grows
// it. Asking for the refused size again tries again (once space is freed,
// it succeeds).
func TestExpansionBeyondTheNode(t *testing.T) {
	p := testenv.New(t, testenv.VolumeHealth)
	smallDataDir(t, p, 1024*mib)
	p.Start()
	const from = 320 * mib // xfs needs 300 MiB
	must(t, "create", createProvisioned(p, t, "big", "thick", from))
	must(t, "create", createProvisioned(p, t, "other", "thick", 256*mib))
	staging := mkdir(t, filepath.Join(p.Root, "staging-"+vid("big")))
	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+vid("big"))), "mount")
	xfs := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	must(t, "stage", stage(t, p, vid("big"), staging, xfs))
	_, err := p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: vid("big"), StagingTargetPath: staging, TargetPath: target, VolumeCapability: xfs})
	must(t, "publish", err)
	must(t, "write", os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o600))
	free := capacityFor(t, p, "thick")
	expand := func(required, limit int64) (*csi.NodeExpandVolumeResponse, error) {
		return p.Node().NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: vid("big"), VolumePath: target,
			CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}})
	}
	for _, tc := range []struct {
		name            string
		required, limit int64
		want            codes.Code
	}{
		{"more than is free", from + free + 16*mib, 0, codes.ResourceExhausted},
		{"more than the data directory", 2 << 30, 0, codes.OutOfRange},
		{"a limit below the volume's size", 64 * mib, 96 * mib, codes.OutOfRange},
	} {
		_, err := expand(tc.required, tc.limit)
		wantCode(t, tc.name, err, tc.want)
		if size := imageSize(t, p, vid("big")); size != from {
			t.Errorf("%s: image is %d bytes, want %d as it was", tc.name, size, from)
		}
		if got := capacityFor(t, p, "thick"); got != free {
			t.Errorf("%s: GetCapacity %d, want %d as before", tc.name, got, free)
		}
	}
	if msg := waitCondition(t, p, vid("big"), "GrowFailed"); !strings.Contains(msg, "asked for again") {
		t.Errorf("GrowFailed message: %q, want it to say when it is tried again", msg)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "kept" {
		t.Errorf("data after the refusals: %q, %v", b, err)
	}
	_, staged := mountAt(t, staging)
	_, published := mountAt(t, target)
	if !staged || !published {
		t.Errorf("mounts after the refusals: staging %v, target %v; want both", staged, published)
	}

	// Space freed, the same size asked again: tried again, and it fits.
	want := from + free + 16*mib
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: vid("other")})
	must(t, "delete other", err)
	resp, err := expand(want, 0)
	must(t, "expand after space was freed", err)
	if resp.GetCapacityBytes() != want || imageSize(t, p, vid("big")) != want {
		t.Errorf("after space was freed: capacity %d, image %d; want %d", resp.GetCapacityBytes(), imageSize(t, p, vid("big")), want)
	}
	if got := allocated(t, p, vid("big")); got < want {
		t.Errorf("thick image after growth: %d bytes allocated, want %d", got, want)
	}
	waitCondition(t, p, vid("big"), "")
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "kept" {
		t.Errorf("data after the growth: %q, %v", b, err)
	}
	downAndDelete(t, p, vid("big"))
}

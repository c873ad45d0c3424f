package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/test/testenv"
)

var rawBlock = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// publishedRawBlock starts a plugin, creates a 32 MiB volume named name,
// and stages and publishes it as a raw device; it returns the plugin, the
// volume, its staging path and its target.
func publishedRawBlock(t *testing.T, name string) (p *testenv.Plugin, raw, staging, target string) {
	t.Helper()
	p = testenv.New(t)
	p.Start()
	raw = createSized(t, p, name, 32<<20)
	staging = mkdir(t, filepath.Join(p.Root, "staging-"+name))
	target = filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+name)), "dev")
	must(t, "stage", stage(t, p, raw, staging, rawBlock))
	_, err := p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: raw, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rawBlock})
	must(t, "publish", err)
	return p, raw, staging, target
}

// TestRawBlockVolume stages and publishes a volume as a raw device: the
// target is a file through which the device is written and read back; the
// stats report its size; it grows online; and teardown leaves nothing.
func TestRawBlockVolume(t *testing.T) {
	p, raw, staging, target := publishedRawBlock(t, "raw")

	payload := bytes.Repeat([]byte("converge"), 512)
	f, err := os.OpenFile(target, os.O_RDWR, 0)
	must(t, "open the target", err)
	_, err = f.WriteAt(payload, 1<<20)
	must(t, "write through the target", err)
	must(t, "sync", f.Sync())
	f.Close()
	got := make([]byte, len(payload))
	img, err := os.Open(filepath.Join(p.DataDir, raw+".img"))
	must(t, "open image", err)
	_, err = img.ReadAt(got, 1<<20)
	img.Close()
	must(t, "read the image", err)
	if !bytes.Equal(got, payload) {
		t.Fatal("what was written through the target is not in the volume's image")
	}

	st, err := p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: raw, VolumePath: target})
	must(t, "stats", err)
	if u := st.GetUsage(); len(u) != 1 || u[0].GetUnit() != csi.VolumeUsage_BYTES || u[0].GetTotal() != 32<<20 {
		t.Errorf("stats: got %v, want the device's 32 MiB", u)
	}

	// The kubelet publishes a pod's block volume under its csi plugin
	// directory and asks the stats at the device map path it made there.
	volumeDevices := filepath.Join(p.Dir, "kubelet", "plugins", "kubernetes.io", "csi", "volumeDevices")
	kubeletTarget := filepath.Join(mkdir(t, filepath.Join(volumeDevices, "publish", "pv-raw")), "uid-1")
	mkdir(t, filepath.Join(p.Dir, "kubelet", "pods", "uid-1")) // the kubelet makes the pod's directory first
	_, err = p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: raw, StagingTargetPath: staging, TargetPath: kubeletTarget, VolumeCapability: rawBlock})
	must(t, "publish at the kubelet's path", err)
	st, err = p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: raw, VolumePath: filepath.Join(volumeDevices, "pv-raw", "dev", "uid-1")})
	must(t, "stats at the kubelet's device map path", err)
	if u := st.GetUsage(); len(u) != 1 || u[0].GetTotal() != 32<<20 {
		t.Errorf("stats at the kubelet's device map path: got %v, want the device's 32 MiB", u)
	}
	_, err = p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: raw, VolumePath: filepath.Join(volumeDevices, "pv-raw", "dev", "uid-2")})
	wantCode(t, "stats at the map path of a pod it is not published to", err, codes.NotFound)
	unpublish(t, p, raw, kubeletTarget)

	_, err = p.Node().NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: raw, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}})
	must(t, "node expand", err)
	f, err = os.Open(target)
	must(t, "open the target", err)
	end, err := f.Seek(0, 2)
	f.Close()
	if err != nil || end != 64<<20 {
		t.Errorf("device size through the target after growth: %d, %v; want %d", end, err, 64<<20)
	}

	unpublish(t, p, raw, target)
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target file after unpublish: %v", err)
	}
	unstage(t, p, raw, staging)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: raw})
	must(t, "delete", err)
}

// TestDeletionWithdrawsAnIdleStage: a volume staged with no publish left
// (a raw block volume whose pod the kubelet forgot, once csi-node has
// withdrawn its publish) is deleted all the same, in one call: the
// deletion withdraws the stage and waits for the unstage. A volume still
// published is refused.
func TestDeletionWithdrawsAnIdleStage(t *testing.T) {
	p, raw, staging, target := publishedRawBlock(t, "idle")
	_, err := p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: raw})
	wantCode(t, "delete while published", err, codes.FailedPrecondition)
	unpublish(t, p, raw, target)

	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: raw})
	must(t, "delete once no publish is left", err)
	if _, err := os.Stat(filepath.Join(p.DataDir, raw+".img")); !os.IsNotExist(err) {
		t.Errorf("the deleted volume's image: %v, want it removed", err)
	}
	// The kubelet's late unstage is answered.
	unstage(t, p, raw, staging)
}

// TestDeletionWithdrawsAnIdleFilesystemStage: a filesystem volume staged
// with no publish left (its pod torn down by a kubelet that restarted
// before it unstaged, as after a reboot, and rebuilds volumes from its
// pods' directories alone) is deleted all the same, its staging mount
// gone (a soak saw its PV stay Released, DeleteVolume refused).
func TestDeletionWithdrawsAnIdleFilesystemStage(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	id := createSized(t, p, "idlefs", 32<<20)
	staging := mkdir(t, filepath.Join(p.Root, "staging-idlefs"))
	must(t, "stage", stage(t, p, id, staging, rwo))
	_, err := p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	must(t, "delete a volume staged with no publish", err)
	if _, err := os.Stat(filepath.Join(p.DataDir, id+".img")); !os.IsNotExist(err) {
		t.Errorf("the deleted volume's image: %v, want it removed", err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), " "+staging+" ") {
		t.Errorf("%s still mounted after the deletion", staging)
	}
	unstage(t, p, id, staging)
}
